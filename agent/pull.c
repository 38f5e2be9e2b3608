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
/* Gets in flight before the next layer's are posted: a get per run of
 * blocks, or per block of a TP leg's HND heads. */
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

/* Our heads of a buffer of the peer's whole blocks, copied out. */
static pdx_status_t copy_out(struct xfer *x, const void *ctx,
			     const struct pdx_kv_piece *pc)
{
	const struct slice_buf *b = ctx;

	pdx_kv_piece_copy(b->ours, b->bytes, pc);
	return PDX_OK;
}

static void blocks_read(void *arg, pdx_status_t status)
{
	struct slice_buf *b = arg;
	struct agent *a = b->agent;
	struct xfer *x = b->x;

	/* a failed transfer's blocks are not ours (and at stop its peer is
	 * gone) */
	if (!status && !x->finished)
		tp_slice_each_piece(x, &x->slice, &x->peer->layout,
				    &a->reg.layout, b->count, copy_out, b);
	slice_buf_put(a, b);
	read_done(x, status);
	slice_bufs_resume(a);
}

/* A slice of more than one row a block (a TP leg's NHD heads, blocks of
 * the other order) on the put lane: a get per row would be hundreds of
 * thousands a transfer (13 times the time of equal TP sizes); the
 * peer's whole blocks are read instead, a buffer of SLICE_MSG_MAX at a
 * time, and our heads copied out of them. Where the peer holds more
 * heads than we take (TP p < d) that reads d / p times our bytes. */
static pdx_status_t read_blocks(struct xfer *x, uint32_t count,
				const struct host_run *at)
{
	struct agent *a = x->agent;
	const struct remote_region *rr = &x->peer->regions[at->ri];
	uint64_t theirs = pdx_kv_layout_block_bytes(&x->peer->layout);
	uint64_t ours = pdx_kv_layout_block_bytes(&a->reg.layout);
	uint64_t heads = tp_slice_block_bytes(&x->slice, &a->reg.layout);
	uint32_t step = slice_buf_blocks(theirs);

	for (uint32_t i = 0; i < count; i += step) {
		uint32_t n = count - i < step ? count - i : step;
		struct slice_buf *b = slice_buf_get(a, x, n * theirs);
		pdx_status_t st;

		if (!b)
			return PDX_ENOMEM;
		b->ours = at->src + i * ours;
		b->count = n;
		st = pdx_ucx_get(x->peer->ep, b->bytes, b->len, NULL,
				 rr->addr + at->off + i * theirs, rr->rkey,
				 blocks_read, b);
		if (st) {
			slice_buf_put(a, b);
			return st;
		}
		slice_buf_count(a, b);
		xfer_hold(x);
		x->bytes += n * heads;
	}
	return PDX_OK;
}

/* One run of blocks of one tensor of one layer: the peer's (at->ri,
 * at->off) into ours (at->src); a TP leg's heads of them only. */
static pdx_status_t read_run(struct xfer *x, uint32_t layer, uint32_t t,
			     const struct pdx_run *r, const struct host_run *at)
{
	struct pdx_kv_piece whole = pdx_kv_piece_whole(at->len);

	if (x->slice.n && x->peer->path == DATA_PUT && tp_slice_in_rows(x))
		return read_blocks(x, r->count, at);
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

/* x's next layer's reads posted; false: x failed. */
static bool read_layer(struct xfer *x)
{
	uint32_t l = x->pull_layer++;
	pdx_status_t st = peer_known(x->peer)
				  ? host_each_run(x, l, true, read_run)
				  : PDX_EPEER;

	if (st)
		xfer_fail(x, st, true, "reading layer %u from %s: %s", l,
			  x->peer_addr, pdx_status_str(st));
	return !st;
}

/* A layer that waited for room for its buffers: its turn came, so it is
 * read whatever waits behind it (those would wait for it again). */
static void reads_resumed(struct xfer *x, uint32_t layer)
{
	x->pull_waits = false;
	xfer_unhold(x); /* the wait's */
	if (!x->finished && read_layer(x))
		reads_post(x);
	xfer_maybe_release(x);
}

/* Whether x may read its next layer now; else it waits for the buffers
 * of whole blocks it reads (read_blocks) to have room, holding x. */
static bool reads_room(struct xfer *x)
{
	pdx_status_t st;

	if (x->peer->path != DATA_PUT || !tp_slice_in_rows(x) ||
	    slice_bufs_room(x->agent))
		return true;
	st = slice_bufs_wait(x, x->pull_layer, reads_resumed);
	if (st) {
		xfer_fail(x, st, true, "out of memory");
		return false;
	}
	x->pull_waits = true;
	xfer_hold(x);
	return false;
}

/* The next layers' reads, while fewer than READS_MAX are in flight (the
 * ipc lane's copies end at once) and until the loop is due back
 * (xfer_yield); "pulled" after the last. */
static void reads_post(struct xfer *x)
{
	/* a layer waiting for room goes first (reads_resumed) */
	while (!x->finished && !x->pull_waits && x->inflight < READS_MAX &&
	       x->pull_layer < x->agent->reg.layout.layers) {
		if (xfer_yield(x, reads_post))
			return;
		if (!reads_room(x) || !read_layer(x))
			return; /* a failure's reads started drain first */
	}
	pull_maybe_pulled(x);
}
