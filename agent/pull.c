/* Pull (docs/protocol.md, "Pull"): for an engine that cannot say when a
 * layer is computed until all are, the receiver reads the sender's blocks
 * instead of the sender writing each layer into its own. The sender, once
 * its engine computed every layer, offers its blocks ("readable"); the
 * receiver reads them (a copy from the sender's mapped pool on the ipc
 * lane, UCX get on the put lane), says "pulled", and the sender answers
 * "done" as a push would: the receiver succeeds only on that "done", so
 * it never keeps bytes read after the sender's engine took its blocks
 * back (an abort there reaches it first). */
#define PDX_LOG_TOPIC "pull"
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/log.h"

#define MAX_BLOCKS (1u << 20)
/* Gets in flight before the next layer's are posted: a TP leg's NHD
 * heads are a get per token row, hundreds of thousands a transfer. */
#define READS_MAX 4096

const char *pull_refusal(const struct agent *a, const struct peer *p)
{
	if (a->reg.cuda || p->cuda)
		return "GPU memory is not pulled (push it: docs/protocol.md, \"Pull\")";
	if (p->path != DATA_IPC && p->path != DATA_PUT)
		return "pull reads by ipc or by ucx get (the put lane); the lane "
		       "to this sender is am, where UCX emulates get over "
		       "messages (push instead)";
	return NULL;
}

/* "readable" carries our blocks, "pulled" the bytes read. */
static pdx_status_t pull_send(struct xfer *x, const char *op, bool blocks)
{
	struct peer_msg pm;

	peer_msg_begin(&pm, x->agent, op, &x->id, NULL);
	if (blocks)
		pdx_mp_msg_u32s(&pm.m, "blocks", x->blocks, x->n_blocks);
	else
		pdx_mp_msg_u64(&pm.m, "bytes", x->bytes);
	return peer_msg_send(&pm, x->peer);
}

void pull_offer(struct xfer *x)
{
	if (x->agent->reg.cuda) {
		xfer_fail(x, PDX_EINCOMPAT, true, "pull: %s",
			  pull_refusal(x->agent, x->peer));
		return;
	}
	/* A computed layer moves nothing: the receiver reads them all. */
	while (pdx_xfer_sm_next(&x->sm) >= 0)
		;
	if (!pdx_xfer_sm_take_flush(&x->sm))
		return;
	log_debug("readable to %s", x->peer_addr);
	if (pull_send(x, "readable", true))
		xfer_fail(x, PDX_EPEER, false, "cannot send readable to %s",
			  x->peer_addr);
	else
		x->readable_sent = true;
}

void pull_on_pulled(struct xfer *x, const msgpack_object *m)
{
	uint64_t bytes;

	if (x->role != XFER_SEND || !x->pull || !x->sm.flush_started ||
	    pdx_mp_get_u64(m, "bytes", &bytes)) {
		xfer_fail(x, PDX_EINVAL, true, "pulled: %s",
			  x->role != XFER_SEND ? "not a transfer from you"
			  : !x->pull	       ? "the transfer is pushed"
			  : !x->sm.flush_started ? "before readable"
						 : "bytes: want an int");
		return;
	}
	log_debug("pulled by %s: %llu bytes", x->peer_addr,
		  (unsigned long long)bytes);
	x->bytes = bytes;
	complete_send_done(x);
}

/* Every read ended: the sender hears how much arrived and answers "done"
 * (or its abort came first). */
static void pull_maybe_pulled(struct xfer *x)
{
	if (x->finished || x->inflight || x->pulled_sent ||
	    x->pull_layer < x->agent->reg.layout.layers)
		return;
	x->pulled_sent = true;
	log_debug("pulled from %s: %llu bytes", x->peer_addr,
		  (unsigned long long)x->bytes);
	if (pull_send(x, "pulled", false))
		xfer_fail(x, PDX_EPEER, false, "cannot send pulled to %s",
			  x->peer_addr);
}

static void reads_post(struct xfer *x);

static void read_done(void *arg, pdx_status_t status)
{
	struct xfer *x = arg;

	xfer_unhold(x);
	if (status && !x->finished)
		xfer_fail(x, status, true, "reading from %s failed: %s",
			  x->peer_addr, pdx_status_str(status));
	reads_post(x);
	xfer_maybe_release(x);
}

/* One piece of a run: the peer's bytes at (at->ri, at->off) + src_off
 * into ours at at->src + dst_off, row by row. */
static pdx_status_t read_piece(struct xfer *x, const void *ctx,
			       const struct pdx_kv_piece *pc)
{
	const struct host_run *at = ctx;
	const struct remote_region *rr = &x->peer->regions[at->ri];
	uint64_t n = (uint64_t)pc->groups * pc->rows, from, to;
	pdx_status_t st = PDX_OK;

	if (x->peer->path == DATA_IPC) {
		if (!mapped_copy_piece(at->src, rr->map + at->off, pc)) {
			log_error("transfer from %s: SIGBUS as we read its pool "
				  "or wrote our engine's: one shrank under us",
				  x->peer_addr);
			return PDX_EIO;
		}
		x->bytes += pdx_kv_piece_bytes(pc);
		return PDX_OK;
	}
	for (uint64_t k = 0; k < n && !st; k++) {
		pdx_kv_piece_row(pc, k, &from, &to);
		st = pdx_ucx_get(x->peer->ep, at->src + to, pc->len, at->mem,
				 rr->addr + at->off + from, rr->rkey, read_done,
				 x);
		if (st)
			break;
		xfer_hold(x);
		x->bytes += pc->len;
	}
	return st;
}

/* One run of blocks of one tensor of one layer: the peer's (at->ri,
 * at->off) into ours (at->src); a TP leg's heads of them only. */
static pdx_status_t read_run(struct xfer *x, uint32_t layer, uint32_t t,
			     const struct pdx_run *r, const struct host_run *at)
{
	struct pdx_kv_piece whole = pdx_kv_piece_whole(at->len);

	if (x->slice.n)
		return tp_slice_each_piece(x, &x->slice, &x->peer->layout,
					   &x->agent->reg.layout, r->count,
					   read_piece, at);
	return read_piece(x, at, &whole);
}

void pull_on_readable(struct xfer *x, const msgpack_object *m)
{
	struct peer *p = x->peer;
	uint32_t *blocks = NULL;
	size_t n = 0;
	const char *why;

	if (x->role != XFER_RECV || !x->pull || !x->want_sent ||
	    x->remote_blocks) {
		xfer_fail(x, PDX_EINVAL, true, "readable: %s",
			  x->role != XFER_RECV ? "not a transfer to you"
			  : !x->pull	       ? "we asked for a push"
					       : "not now (sent twice?)");
		return;
	}
	if ((why = pull_refusal(x->agent, p)) != NULL) {
		xfer_fail(x, PDX_EINCOMPAT, true, "pull from %s: %s", p->addr,
			  why);
		return;
	}
	if (pdx_mp_get_u32s(m, "blocks", MAX_BLOCKS, &blocks, &n) ||
	    n != x->n_blocks) {
		free(blocks);
		xfer_fail(x, PDX_EINVAL, true,
			  "readable: blocks: want %u block ids (got %zu)",
			  x->n_blocks, n);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		if (blocks[i] >= p->layout.blocks) {
			xfer_fail(x, PDX_ERANGE, true,
				  "readable: blocks[%zu]: block %u is outside "
				  "your layout (%u blocks)",
				  i, blocks[i], p->layout.blocks);
			free(blocks);
			return;
		}
	}
	x->remote_blocks = blocks;
	x->n_remote = (uint32_t)n;
	if (host_plan_runs(x)) {
		xfer_fail(x, PDX_ENOMEM, true, "out of memory");
		return;
	}
	log_debug("reading %zu runs x %u layers from %s", x->n_runs,
		  p->layout.layers, p->addr);
	reads_post(x);
}

/* The next layers' reads, while fewer than READS_MAX are in flight (the
 * ipc lane's copies end at once) and until the loop is due back
 * (xfer_yield); "pulled" after the last. */
static void reads_post(struct xfer *x)
{
	while (!x->finished && x->inflight < READS_MAX &&
	       x->pull_layer < x->agent->reg.layout.layers) {
		uint32_t l;
		pdx_status_t st;

		if (xfer_yield(x, reads_post))
			return;
		l = x->pull_layer++;
		st = host_each_run(x, l, true, read_run);

		if (st) {
			xfer_fail(x, st, true, "reading layer %u from %s: %s", l,
				  x->peer_addr, pdx_status_str(st));
			return; /* reads started drain first */
		}
	}
	pull_maybe_pulled(x);
}
