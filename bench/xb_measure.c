/* pdx-xferbench's iterations (xb_measure.h). */
#include "bench/xb_measure.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/xb_fail.h"
#include "common/clock.h"

enum iter_kind { ITER_WARMUP, ITER_CALIBRATE, ITER_MEASURE };

/* The copy limit, paired with the transfers: before each measured
 * iteration, a plain single-threaded memcpy of the same bytes in pieces of
 * that iteration's op size between two pre-faulted buffers of one
 * transfer's size, so both figures see the same machine load. */
static void memcpy_pass(uint64_t bytes, uint64_t piece, uint32_t times,
			struct xb_results *r)
{
	static uint8_t *a, *b;
	static uint64_t cap;
	uint64_t t0;

	/* the largest arm's size: each arm's warm-up comes before its first
	 * counted pass */
	if (bytes > cap) {
		free(a);
		free(b);
		a = malloc(bytes);
		b = malloc(bytes);
		if (!a || !b)
			xb_fail("cannot allocate the memcpy buffers");
		memset(a, 0x5a, bytes);
		memset(b, 0xa5, bytes); /* not 0: that could become calloc */
		cap = bytes;
	}
	if (piece == 0 || piece > bytes)
		piece = bytes;
	t0 = pdx_now_ns();
	for (uint32_t i = 0; i < times; i++) {
		for (uint64_t off = 0; off < bytes; off += piece)
			memcpy(b + off, a + off,
			       piece < bytes - off ? piece : bytes - off);
		__asm__ volatile("" ::: "memory");
	}
	if (r) {
		r->memcpy_s += (double)(pdx_now_ns() - t0) / 1e9;
		r->memcpy_bytes += bytes * times;
	}
}

/* One iteration of arm a: its shape goes to the engines through the shared
 * plan, its figures to a->res. */
static void run_iter(struct xb_run *run, int iter, enum iter_kind kind,
		     double layer_ms, struct xb_arm *a)
{
	const struct xb_opts *o = run->o;
	struct xb_plan *plan = run->plan;
	struct xb_results *r = &a->res;
	struct xb_node *P = run->prefill, *D = run->decode;
	struct xb_node *both[2] = { P, D };
	struct xb_ack acks[2];
	size_t total = (size_t)a->shape.conc * a->shape.nblocks;
	uint64_t first_send = UINT64_MAX, last_recv = 0, last_recv_agent = 0;
	const uint32_t layers = o->model->layers;

	*plan->shape = a->shape;
	for (uint32_t c = 0; c < plan->shape->conc; c++) {
		if (pdx_xfer_id_random(&plan->ids[c]) != PDX_OK)
			xb_fail("cannot draw a transfer id");
		plan->seeds[c] = pdx_splitmix64(&run->rng);
	}
	pb_pick_blocks(plan->src, total, plan->pool_blocks, o->random_blocks,
		       &run->rng);
	pb_pick_blocks(plan->dst, total, plan->pool_blocks, o->random_blocks,
		       &run->rng);

	/* before the recv is posted, so the copy limit never holds up a
	 * transfer; the warm-up warms the buffers */
	if (kind != ITER_CALIBRATE) {
		uint64_t bytes = xb_plan_xfer_bytes(plan);
		uint64_t ops = pb_runs(plan->src + plan->shape->skip_blocks,
				       plan->dst + plan->shape->skip_blocks,
				       plan->shape->nblocks - plan->shape->skip_blocks) *
			       layers * o->model->tensors;

		memcpy_pass(bytes, ops ? bytes / ops : 0, plan->shape->conc,
			    kind == ITER_MEASURE ? r : NULL);
	}
	xb_node_cmd(P, CMD_FILL, iter, layer_ms, NULL);
	xb_nodes_wait(&P, 1, acks, ACK_TIMEOUT_MS, "fill");
	xb_node_cmd(D, CMD_RECV, iter, 0, P->peer);
	xb_nodes_wait(&D, 1, acks, ACK_TIMEOUT_MS, "recv");
	xb_node_cmd(D, CMD_WAIT, iter, 0, NULL);
	xb_node_cmd(P, CMD_SEND, iter, layer_ms, D->peer);
	xb_nodes_wait(both, 2, acks, ACK_TIMEOUT_MS, "transfer");

	if (!acks[1].verified) {
		fprintf(stderr, "pdx-xferbench: MISMATCH: %s\n", acks[1].reason);
		r->verified = false;
	}
	for (uint32_t c = 0; c < plan->shape->conc; c++) {
		if (plan->t_send[c] < first_send)
			first_send = plan->t_send[c];
		if (plan->t_recv[c] > last_recv)
			last_recv = plan->t_recv[c];
		if (plan->t_recv_agent[c] > last_recv_agent)
			last_recv_agent = plan->t_recv_agent[c];
	}
	if (kind != ITER_WARMUP && layer_ms == 0) {
		for (uint32_t c = 0; c < plan->shape->conc; c++) {
			r->layer_sum_ms += (double)(plan->t_recv[c] - *plan->t_first_ld) /
					    1e6 / layers;
			r->layer_n++;
		}
	}
	fprintf(stderr, "pdx-xferbench: %s%s %d: %u transfers, %.3f ms, exposed %.3f ms (engine %.3f)%s\n",
		run->n_arms == 1 ? "" : a == run->arm ? "baseline " : "variant ",
		kind == ITER_WARMUP ? "warm-up" :
		kind == ITER_CALIBRATE ? "layer calibration" : "iteration",
		iter, plan->shape->conc, (double)(last_recv - first_send) / 1e6,
		((double)last_recv_agent - (double)*plan->t_last_ld) / 1e6,
		((double)last_recv - (double)*plan->t_last_ld) / 1e6,
		acks[1].verified ? "" : " (MISMATCH)");
	if (kind != ITER_MEASURE)
		return;
	for (uint32_t c = 0; c < plan->shape->conc; c++) {
		const uint32_t *s = plan->src + (size_t)c * plan->shape->nblocks;
		const uint32_t *d = plan->dst + (size_t)c * plan->shape->nblocks;

		r->lat_ms[r->n_lat++] = (double)(plan->t_recv[c] - plan->t_send[c]) / 1e6;
		r->bytes += xb_plan_xfer_bytes(plan);
		r->ev_bytes += plan->ev_bytes[c];
		r->ops += pb_runs(s + plan->shape->skip_blocks,
				  d + plan->shape->skip_blocks,
				  plan->shape->nblocks - plan->shape->skip_blocks) *
			   layers * o->model->tensors;
		r->xfers++;
	}
	r->wall_s += (double)(last_recv - first_send) / 1e9;
	if (r->exposed_n < MAX_ITERS) {
		r->exposed_ms[r->exposed_n] =
			((double)last_recv_agent - (double)*plan->t_last_ld) / 1e6;
		r->engine_exposed_ms[r->exposed_n] =
			((double)last_recv - (double)*plan->t_last_ld) / 1e6;
		r->exposed_n++;
	}
}

/* --mem cuda: P measures its device's copy rates once, with the GPU warm
 * from the warm-up transfer and nothing else queued on it. */
static void gpu_yardsticks(struct xb_run *run)
{
	struct xb_plan *plan = run->plan;
	struct xb_node *P = run->prefill;
	struct xb_ack a;

	*plan->shape = run->arm[0].shape; /* the run's own transfer's bytes */
	xb_node_cmd(P, CMD_YARD, 0, 0, NULL);
	xb_nodes_wait(&P, 1, &a, ACK_TIMEOUT_MS, "yardsticks");
	run->dev.d2d_gbps = a.d2d_gbps;
	run->dev.d2h_gbps = a.d2h_gbps;
	fprintf(stderr, "pdx-xferbench: %s: cudaMemcpy d2d %.3f GB/s, d2h (pinned) %.3f GB/s\n",
		run->o->mem, a.d2d_gbps, a.d2h_gbps);
}


void xb_measure_run(struct xb_run *r)
{
	const struct xb_opts *o = r->o;

	for (uint32_t a = 0; a < r->n_arms; a++)
		run_iter(r, 0, ITER_WARMUP, 0, &r->arm[a]);
	if (o->cuda)
		gpu_yardsticks(r);
	for (uint32_t a = 0; o->layer_ms > 0 && a < r->n_arms; a++)
		run_iter(r, 0, ITER_CALIBRATE, 0, &r->arm[a]);
	/* --versus: the arms take turns, each iteration in the other order
	 * (ABBA), so that neither always runs right after the other */
	for (uint32_t i = 1; i <= o->iters; i++)
		for (uint32_t a = 0; a < r->n_arms; a++)
			run_iter(r, (int)i, ITER_MEASURE, o->layer_ms,
				 &r->arm[i % 2 ? a : r->n_arms - 1 - a]);
}

bool xb_run_verified(const struct xb_run *r)
{
	return r->arm[0].res.verified && r->arm[1].res.verified;
}
