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

/* UCX operations (ipc: copies) of one transfer of the plan's shape, for
 * the paired memcpy's piece size: each run of consecutive blocks per layer
 * and tensor, on each decode rank; a TP leg that moves a head slice
 * (docs/protocol.md, "TP legs") moves each block apart, in one piece (HND)
 * or one per token (NHD); blocks converted to the other order move a
 * piece per head and token ("Converting the order"). */
static uint64_t xfer_ops(const struct xb_plan *plan, uint32_t x)
{
	const struct xb_shape *sh = plan->shape;
	const struct pdx_model *m = plan->model;
	uint32_t skip = sh->skip_blocks, moved = sh->nblocks - skip;
	const uint32_t *s = plan->src + (size_t)x * sh->nblocks + skip;
	const uint32_t *d = plan->dst + (size_t)x * sh->nblocks + skip;
	uint64_t per_lt;

	if (sh->decode_order != plan->order &&
	    xb_plan_rank_heads(m, sh->decode_tp) > 1)
		per_lt = (uint64_t)moved * m->kv_heads * m->block_tokens;
	else if (sh->prefill_tp == sh->decode_tp || m->tensors == 1)
		per_lt = pb_runs(s, d, moved) * sh->decode_tp;
	else
		per_lt = (uint64_t)moved *
			 (sh->prefill_tp > sh->decode_tp ? sh->prefill_tp :
							  sh->decode_tp) *
			 (plan->order == PDX_KV_NHD ? m->block_tokens : 1);
	return per_lt * m->layers * m->tensors;
}

/* One iteration of arm a: its shape goes to the engines through the shared
 * plan, its figures to a->res. A transfer's time runs from the first
 * prefill rank's send to the last decode rank's "received". */
static void run_iter(struct xb_run *run, int iter, enum iter_kind kind,
		     double layer_ms, struct xb_arm *a)
{
	const struct xb_opts *o = run->o;
	struct xb_plan *plan = run->plan;
	struct xb_results *r = &a->res;
	struct xb_round rd;
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
		uint64_t ops = xfer_ops(plan, 0);

		memcpy_pass(bytes, ops ? bytes / ops : 0, plan->shape->conc,
			    kind == ITER_MEASURE ? r : NULL);
	}
	xb_tp_round(plan, &run->pre, a->dec, iter, layer_ms, &rd);

	if (!rd.verified) {
		fprintf(stderr, "pdx-xferbench: MISMATCH: %s\n", rd.reason);
		r->verified = false;
	}
	for (uint32_t j = 0; j < a->dec->size; j++)
		r->rank_verified[j] &= rd.rank_verified[j];
	for (uint32_t c = 0; c < plan->shape->conc; c++) {
		uint64_t s = xb_tp_first_send(plan, &run->pre, c);
		uint64_t e = xb_tp_last_recv(plan, a->dec, c, false);
		uint64_t ea = xb_tp_last_recv(plan, a->dec, c, true);

		first_send = s < first_send ? s : first_send;
		last_recv = e > last_recv ? e : last_recv;
		last_recv_agent = ea > last_recv_agent ? ea : last_recv_agent;
		if (kind != ITER_WARMUP && layer_ms == 0) {
			r->layer_sum_ms += (double)(e - rd.first_ld) / 1e6 / layers;
			r->layer_n++;
		}
	}
	fprintf(stderr, "pdx-xferbench: %s%s %d: %u transfers, %.3f ms, exposed %.3f ms (engine %.3f)%s\n",
		run->n_arms == 1 ? "" : a == run->arm ? "baseline " : "variant ",
		kind == ITER_WARMUP ? "warm-up" :
		kind == ITER_CALIBRATE ? "layer calibration" : "iteration",
		iter, plan->shape->conc, (double)(last_recv - first_send) / 1e6,
		((double)last_recv_agent - (double)rd.last_ld) / 1e6,
		((double)last_recv - (double)rd.last_ld) / 1e6,
		rd.verified ? "" : " (MISMATCH)");
	if (kind != ITER_MEASURE)
		return;
	for (uint32_t c = 0; c < plan->shape->conc; c++) {
		r->lat_ms[r->n_lat++] =
			(double)(xb_tp_last_recv(plan, a->dec, c, false) -
				 xb_tp_first_send(plan, &run->pre, c)) / 1e6;
		r->bytes += xb_plan_xfer_bytes(plan);
		for (uint32_t j = 0; j < a->dec->size; j++) {
			uint64_t b = xb_plan_row(plan, plan->ev_bytes,
						 a->dec->rank[j]->row)[c];

			r->ev_bytes += b;
			r->rank_ev_bytes[j] += b;
		}
		r->ops += xfer_ops(plan, c);
		r->xfers++;
	}
	r->wall_s += (double)(last_recv - first_send) / 1e9;
	if (r->exposed_n < MAX_ITERS) {
		r->exposed_ms[r->exposed_n] =
			((double)last_recv_agent - (double)rd.last_ld) / 1e6;
		r->engine_exposed_ms[r->exposed_n] =
			((double)last_recv - (double)rd.last_ld) / 1e6;
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
