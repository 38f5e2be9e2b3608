/* pdx-xferbench's synthetic engine (xb_engine.h).
 *
 * On a GPU the pattern is written and checked by kernels (bench/xfer_cuda.h)
 * and a layer is done when its CUDA event is recorded; P also measures the
 * device's own copy rates (YARD), the yardsticks of the transfer. Times are
 * CLOCK_MONOTONIC, comparable with the parent's and the other engine's.
 */
#define _GNU_SOURCE
#include "bench/xb_engine.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <pdx/engine.h>

#include "bench/pdx_bench.h"
#include "bench/xb_opts.h"
#include "bench/xfer_ctl.h"
#include "bench/xfer_cuda.h"
#include "common/clock.h"
#include "common/log.h"

#define EVENT_SLOTS 4            /* the CUDA event ring */
#define PING_TIMEOUT_MS 5000

static const struct xb_engine_cfg *me;
static struct xb_plan *plan;         /* shared with the parent */
static struct pdx_engine *ch_eng;
static struct pdx_shm_pool ch_pool;
static struct xb_cuda_pool *ch_gpu; /* --mem cuda: the pool instead */
/* --mem cuda with TP: ch_pool is the GPU pool's host image, through which
 * the shm pattern is written and checked a head at a time (the GPU
 * pattern is a whole block's) */
static bool ch_mirror;
static uint32_t ch_sends;           /* SENDs so far: picks the event slot */
static struct pdx_model ch_model;   /* the model, our heads of it */
static struct xc_ping *ch_ping;     /* PING: our own socket to our agent */

static void ch_ack_send(int fd, struct xb_ack *a)
{
	if (ch_gpu)
		snprintf(a->gpu, sizeof(a->gpu), "%s", xb_cuda_pool_device(ch_gpu));
	if (xb_write_all(fd, a, sizeof(*a)))
		_exit(1);
}

static void ch_ack(int fd, int ok, uint32_t verified, const char *peer,
		   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void ch_ack(int fd, int ok, uint32_t verified, const char *peer,
		   const char *fmt, ...)
{
	struct xb_ack a;
	va_list ap;

	memset(&a, 0, sizeof(a));
	a.ok = ok;
	a.verified = verified;
	if (peer)
		snprintf(a.peer, sizeof(a.peer), "%s", peer);
	if (fmt) {
		va_start(ap, fmt);
		vsnprintf(a.reason, sizeof(a.reason), fmt, ap);
		va_end(ap);
	}
	ch_ack_send(fd, &a);
}

/* Our row of one of the plan's [rows][conc] arrays. */
static uint64_t *ch_row(uint64_t *a)
{
	return xb_plan_row(plan, a, me->row);
}

/* Collects one event of `want` kind for every transfer, for at most the
 * plan's event_wait_ms (the agents' bound on a transfer and then some:
 * xb_opts.h); returns 0, or -1 with the reason in err. */
static int ch_collect(enum pdx_event_kind want, uint64_t *times, char *err,
		      size_t errlen)
{
	uint64_t deadline = pdx_now_ns() + plan->event_wait_ms * 1000000ULL;
	uint32_t got = 0;
	char *seen = calloc(plan->shape->conc, 1);

	if (!seen) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	while (got < plan->shape->conc) {
		struct pdx_engine_event ev;
		uint64_t now = pdx_now_ns();
		pdx_status_t st;
		char hex[33];
		int i;

		if (now >= deadline) {
			snprintf(err, errlen,
				 "%u of %u %s events in %.1f s, and no failure "
				 "from the agent (the wait is --xfer-timeout-ms "
				 "+ layers x --layer-ms + %.0f s)",
				 got, plan->shape->conc,
				 want == PDX_EVENT_SENT ? "sent" : "received",
				 (double)plan->event_wait_ms / 1000,
				 XB_EVENT_GRACE_MS / 1000.0);
			free(seen);
			return -1;
		}
		st = pdx_engine_wait_event(ch_eng, (int)((deadline - now) / 1000000) + 1,
					   &ev);
		if (st == PDX_ETIMEDOUT)
			continue;
		if (st != PDX_OK) {
			snprintf(err, errlen, "waiting for events: %s",
				 pdx_status_str(st));
			free(seen);
			return -1;
		}
		now = pdx_now_ns();
		pdx_xfer_id_hex(&ev.xfer, hex);
		i = xb_plan_xfer_index(plan, &ev.xfer);
		if (ev.kind == PDX_EVENT_FAILED) {
			snprintf(err, errlen, "transfer %s failed: %s (%s)", hex,
				 ev.reason, pdx_status_str(ev.status));
			free(seen);
			return -1;
		}
		if (i < 0 || ev.kind != want || seen[i]) {
			fprintf(stderr, "xferbench: unexpected %s event for %s, ignored\n",
				ev.kind == PDX_EVENT_SENT ? "sent" : "received", hex);
			continue;
		}
		seen[i] = 1;
		times[i] = now;
		if (want == PDX_EVENT_RECEIVED) {
			ch_row(plan->ev_bytes)[i] = ev.bytes;
			ch_row(plan->t_recv_agent)[i] = ev.t_last_ns;
		}
		got++;
	}
	free(seen);
	return 0;
}

static void ch_sleep_until(uint64_t t_ns)
{
	struct timespec ts = { (time_t)(t_ns / 1000000000ULL),
			       (long)(t_ns % 1000000000ULL) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* Transfer x's pattern of `seed` into the host pool (with TP, a head at a
 * time: the pattern of the whole model's heads this rank holds). */
static void ch_fill_host(uint32_t x, uint64_t seed)
{
	uint32_t nb = plan->shape->nblocks;

	pb_fill_rank(&ch_pool, seed, plan->src + (size_t)x * nb, nb,
		     plan->shape->skip_blocks, me->tp_rank, me->tp_size);
}

/* P: the source blocks. On a GPU with modeled compute the blocks get the
 * pattern of another seed here (the stale KV of an earlier request) and
 * SEND's per-layer "compute" writes the real one: a data path that reads a
 * layer before its event fired then shows as a mismatch. With TP the GPU
 * pool is written through a host image (ch_mirror): the stale one is
 * uploaded, then the real one is made there for the compute to upload a
 * layer at a time. Without compute the real pattern is written here and
 * SEND only records the events. */
static int ch_fill(double layer_ms, char *err, size_t errlen)
{
	uint32_t nb = plan->shape->nblocks;
	bool stale = ch_gpu && layer_ms > 0;

	for (uint32_t x = 0; x < plan->shape->conc; x++) {
		uint64_t seed = stale ? ~plan->seeds[x] : plan->seeds[x];

		if (!ch_gpu || ch_mirror) {
			ch_fill_host(x, seed);
			continue;
		}
		for (uint32_t l = 0; l < plan->model->layers; l++)
			if (xb_cuda_fill_layer(ch_gpu, l, seed,
					       plan->src + (size_t)x * nb, nb,
					       plan->shape->skip_blocks, err,
					       errlen))
				return -1;
	}
	/* done before the ack, so no fill runs into SEND's timings */
	if (ch_mirror) {
		if (xb_cuda_upload(ch_gpu, ch_pool.base, ch_pool.size, err,
				   errlen))
			return -1;
		for (uint32_t x = 0; stale && x < plan->shape->conc; x++)
			ch_fill_host(x, plan->seeds[x]);
		return 0;
	}
	return ch_gpu ? xb_cuda_sync(ch_gpu, err, errlen) : 0;
}

/* P on a GPU with modeled compute: queues layer l's real bytes of every
 * transfer on the compute stream (with TP, from the host image). */
static int ch_compute_layer(uint32_t l, char *err, size_t errlen)
{
	uint32_t nb = plan->shape->nblocks;

	for (uint32_t x = 0; x < plan->shape->conc; x++) {
		const uint32_t *b = plan->src + (size_t)x * nb;
		int rc = ch_mirror
			 ? xb_cuda_upload_layer(ch_gpu, ch_pool.base, l, b, nb,
						plan->shape->skip_blocks, err,
						errlen)
			 : xb_cuda_fill_layer(ch_gpu, l, plan->seeds[x], b, nb,
					      plan->shape->skip_blocks, err,
					      errlen);

		if (rc)
			return -1;
	}
	return 0;
}

/* P: layer l is computed. On a GPU its event is recorded on the compute
 * stream, behind the layer's kernels, and the agent waits for it there:
 * nothing here waits for the GPU. */
static int ch_layer_done(uint32_t l, uint32_t slot, char *err, size_t errlen)
{
	pdx_status_t st;

	if (ch_gpu && xb_cuda_record(ch_gpu, slot, l, err, errlen))
		return -1;
	if (ch_gpu)
		st = pdx_engine_layer_done_slot(ch_eng, l, slot, plan->ids,
						plan->shape->conc);
	else
		st = pdx_engine_layer_done(ch_eng, l, plan->ids, plan->shape->conc);
	if (st != PDX_OK) {
		snprintf(err, errlen, "pdx_engine_layer_done%s(%u): %s",
			 ch_gpu ? "_slot" : "", l, pdx_status_str(st));
		return -1;
	}
	return 0;
}

/* D: transfer x's blocks against P's pattern. 0: all bytes match; 1: the
 * first difference in err; -1: the check itself failed. */
static int ch_verify(uint32_t x, char *err, size_t errlen)
{
	uint32_t nb = plan->shape->nblocks;
	const uint32_t *dst = plan->dst + (size_t)x * nb;

	/* the whole pool, for each transfer: a check, not a measurement */
	if (ch_mirror && xb_cuda_download(ch_gpu, ch_pool.base, ch_pool.size,
					  err, errlen))
		return -1;
	if (ch_gpu && !ch_mirror)
		return xb_cuda_verify(ch_gpu, plan->seeds[x],
				      plan->src + (size_t)x * nb, dst, nb,
				      plan->shape->skip_blocks, err, errlen);
	return pb_verify_rank(&ch_pool, plan->seeds[x], dst, nb,
			      plan->shape->skip_blocks, me->tp_rank,
			      me->tp_size, err, errlen) ? 1 : 0;
}

/* P on a GPU: the device's copy rates for one transfer's bytes. */
static void ch_yardsticks(void)
{
	struct xb_ack a;
	char err[1024];

	memset(&a, 0, sizeof(a));
	if (!ch_gpu) {
		ch_ack(me->ack_fd, 0, 0, NULL, "yardsticks need --mem cuda");
		return;
	}
	if (xb_cuda_yardsticks(ch_gpu, xb_plan_xfer_bytes(plan), YARD_REPS,
			       &a.d2d_gbps, &a.d2h_gbps, err, sizeof(err))) {
		ch_ack(me->ack_fd, 0, 0, NULL, "%s", err);
		return;
	}
	a.ok = 1;
	ch_ack_send(me->ack_fd, &a);
}

/* The yardstick of --one-block: a bare round trip over our agent's engine
 * link, through its loop, on a socket of our own beside the engine's,
 * after idle_ms of quiet: a transfer's hops wake threads (and, in a VM,
 * CPUs) that slept as long, which costs more than waking warm ones. */
static void ch_ping_once(double idle_ms)
{
	struct xb_ack a;
	char err[512];

	memset(&a, 0, sizeof(a));
	ch_sleep_until(pdx_now_ns() + (uint64_t)llround(idle_ms * 1e6));
	if (!ch_ping)
		ch_ping = xc_ping_open(me->engine, err, sizeof(err));
	if (!ch_ping || xc_ping(ch_ping, PING_TIMEOUT_MS, &a.rtt_ns, err,
				sizeof(err))) {
		ch_ack(me->ack_fd, 0, 0, NULL, "ping: %s", err);
		return;
	}
	a.ok = 1;
	ch_ack_send(me->ack_fd, &a);
}

static void ch_do(const struct xb_cmd *c)
{
	uint32_t nb = plan->shape->nblocks;
	char err[1024];
	pdx_status_t st;

	switch (c->op) {
	case CMD_FILL:
		if (ch_fill(c->layer_ms, err, sizeof(err))) {
			ch_ack(me->ack_fd, 0, 0, NULL, "fill: %s", err);
			return;
		}
		ch_ack(me->ack_fd, 1, 0, NULL, NULL);
		return;
	case CMD_RECV: {
		const char *peers[XB_TP_MAX];

		for (uint32_t i = 0; i < plan->shape->prefill_tp; i++)
			peers[i] = plan->peers[i];
		for (uint32_t x = 0; x < plan->shape->conc; x++) {
			struct pdx_recv_opts ro = {
				.skip_tokens = plan->shape->skip_tokens,
				.mode = plan->shape->pull ? PDX_XFER_PULL :
							   PDX_XFER_PUSH,
				.peers = c->peer[0] ? NULL : peers,
				.n_peers = c->peer[0] ? 0 : plan->shape->prefill_tp,
			};

			st = pdx_engine_recv_opts(ch_eng, &plan->ids[x],
						  c->peer[0] ? c->peer : NULL,
						  plan->dst + (size_t)x * nb, nb,
						  &ro);
			if (st != PDX_OK) {
				ch_ack(me->ack_fd, 0, 0, NULL, "pdx_engine_recv: %s",
				       pdx_status_str(st));
				return;
			}
		}
		ch_ack(me->ack_fd, 1, 0, NULL, NULL);
		return;
	}
	case CMD_WAIT: {
		uint64_t want = xb_plan_rank_bytes(plan, plan->shape);

		if (ch_collect(PDX_EVENT_RECEIVED, ch_row(plan->t_recv), err,
			       sizeof(err))) {
			ch_ack(me->ack_fd, 0, 0, NULL, "%s", err);
			return;
		}
		/* the agent's count of what it placed here: a leg that moved
		 * too little or too much fails even where the bytes check */
		for (uint32_t x = 0; x < plan->shape->conc; x++) {
			if (ch_row(plan->ev_bytes)[x] == want)
				continue;
			ch_ack(me->ack_fd, 0, 0, NULL, "received event says %"
			       PRIu64 " bytes, expected %" PRIu64,
			       ch_row(plan->ev_bytes)[x], want);
			return;
		}
		ch_ack(me->ack_fd, 1, 0, NULL, NULL);
		return;
	}
	case CMD_VERIFY:
		for (uint32_t x = 0; x < plan->shape->conc; x++) {
			int rc = ch_verify(x, err, sizeof(err));

			if (rc < 0) {
				ch_ack(me->ack_fd, 0, 0, NULL, "verify: %s", err);
				return;
			}
			if (rc) {
				char hex[33];

				pdx_xfer_id_hex(&plan->ids[x], hex);
				ch_ack(me->ack_fd, 1, 0, NULL,
				       "iteration %d transfer %u (%s): %s", c->iter,
				       x, hex, err);
				return;
			}
		}
		ch_ack(me->ack_fd, 1, 1, NULL, NULL);
		return;
	case CMD_SEND: {
		uint64_t start, layer_ns = (uint64_t)llround(c->layer_ms * 1e6);
		uint32_t slot = ch_sends++ % EVENT_SLOTS;

		for (uint32_t x = 0; x < plan->shape->conc; x++) {
			ch_row(plan->t_send)[x] = pdx_now_ns();
			st = pdx_engine_send(ch_eng, &plan->ids[x],
					     c->peer[0] ? c->peer : NULL,
					     plan->src + (size_t)x * nb, nb);
			if (st != PDX_OK) {
				ch_ack(me->ack_fd, 0, 0, NULL, "pdx_engine_send: %s",
				       pdx_status_str(st));
				return;
			}
		}
		start = pdx_now_ns();
		for (uint32_t l = 0; l < plan->model->layers; l++) {
			/* the kernels run inside the layer's compute time */
			if (ch_gpu && layer_ns &&
			    ch_compute_layer(l, err, sizeof(err))) {
				ch_ack(me->ack_fd, 0, 0, NULL, "compute: %s", err);
				return;
			}
			if (layer_ns)
				ch_sleep_until(start + (l + 1) * layer_ns);
			if (l == 0)
				plan->t_first_ld[me->row] = pdx_now_ns();
			if (l == plan->model->layers - 1)
				plan->t_last_ld[me->row] = pdx_now_ns();
			if (ch_layer_done(l, slot, err, sizeof(err))) {
				ch_ack(me->ack_fd, 0, 0, NULL, "%s", err);
				return;
			}
		}
		if (ch_collect(PDX_EVENT_SENT, ch_row(plan->t_sent), err,
			       sizeof(err))) {
			ch_ack(me->ack_fd, 0, 0, NULL, "%s", err);
			return;
		}
		ch_ack(me->ack_fd, 1, 0, NULL, NULL);
		return;
	}
	case CMD_YARD:
		ch_yardsticks();
		return;
	case CMD_PING:
		ch_ping_once(c->layer_ms);
		return;
	default:
		ch_ack(me->ack_fd, 0, 0, NULL, "unknown command %u", c->op);
	}
}

/* The KV pool, registered with the agent; our peer address in peer. */
static int ch_pool_register(char *peer, size_t peer_len)
{
	char err[512];
	pdx_status_t st;

	ch_model = *plan->model;
	ch_model.kv_heads = xb_plan_rank_heads(plan->model, me->tp_size);
	ch_mirror = me->cuda && (plan->shape->prefill_tp > 1 ||
				 plan->shape->decode_tp > 1);
	if ((!me->cuda || ch_mirror) &&
	    pb_pool_create(&ch_pool, me->shm_name, &ch_model,
			   plan->pool_blocks)) {
		ch_ack(me->ack_fd, 0, 0, NULL, "cannot create the KV pool");
		return -1;
	}
	ch_pool.layout.order = me->order; /* the bytes' meaning only */
	if (me->cuda && xb_cuda_pool_new(me->cuda_dev,
				       &ch_model, plan->pool_blocks, EVENT_SLOTS,
				       &ch_gpu, err, sizeof(err))) {
		ch_ack(me->ack_fd, 0, 0, NULL, "GPU KV pool on device %d: %s",
		       me->cuda_dev, err);
		return -1;
	}
	/* an agent opening CUDA IPC handles answers slower than one mapping
	 * shared memory: give it the whole start-up budget */
	if (ch_gpu)
		st = pb_register_regions_retry(
			ch_eng, xb_cuda_pool_layout(ch_gpu),
			xb_cuda_pool_region(ch_gpu), 1,
			xb_cuda_pool_events(ch_gpu), peer, peer_len,
			READY_TIMEOUT_MS / 2, NULL);
	else
		st = pb_register_retry(ch_eng, &ch_pool, peer, peer_len, 10000,
				       NULL);
	if (st != PDX_OK) {
		ch_ack(me->ack_fd, 0, 0, NULL, "register with the agent at %s: %s",
		       me->engine, pdx_status_str(st));
		return -1;
	}
	return 0;
}

void xb_engine_main(const struct xb_engine_cfg *cfg, struct xb_plan *shared,
		    pid_t parent)
{
	struct pdx_engine_params ep = { .agent = cfg->engine,
					.timeout_ms = cfg->cuda ? 10000 : 2000 };
	char peer[PDX_ADDR_MAX];
	char logp[32];
	pdx_status_t st;
	struct xb_cmd c;

	me = cfg;
	plan = shared;
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	signal(SIGHUP, SIG_DFL);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(1);
	if (me->tp_size > 1)
		snprintf(logp, sizeof(logp), "xb-%s%u", me->role, me->tp_rank);
	else
		snprintf(logp, sizeof(logp), "xb-%s", me->role);
	pdx_log_prefix(logp);
	st = pdx_engine_connect(&ep, &ch_eng);
	if (st != PDX_OK) {
		ch_ack(me->ack_fd, 0, 0, NULL, "pdx_engine_connect(%s): %s",
		       me->engine, pdx_status_str(st));
		_exit(1);
	}
	if (me->tp_size > 1)
		st = pdx_engine_set_tp(ch_eng, me->tp_rank, me->tp_size);
	if (st != PDX_OK) {
		ch_ack(me->ack_fd, 0, 0, NULL, "pdx_engine_set_tp(%u, %u): %s",
		       me->tp_rank, me->tp_size, pdx_status_str(st));
		_exit(1);
	}
	if (ch_pool_register(peer, sizeof(peer))) {
		pb_pool_destroy(&ch_pool);
		_exit(1);
	}
	ch_ack(me->ack_fd, 1, 0, peer, NULL);
	while (xb_read_all(me->cmd_fd, &c, sizeof(c)) == 0 && c.op != CMD_QUIT)
		ch_do(&c);
	xc_ping_close(ch_ping);
	pdx_engine_free(ch_eng);
	xb_cuda_pool_free(ch_gpu);
	pb_pool_destroy(&ch_pool);
	_exit(0);
}

