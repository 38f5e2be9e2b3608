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
/* Gets or buffers in flight before the next are posted: a get per run
 * of blocks, per block of a TP leg's HND heads, or a buffer of whole
 * blocks. */
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
 * into ours at at->src + dst_off: one row (a piece of more rows is read
 * as whole blocks on the put lane, read_whole()). */
static pdx_status_t read_piece(struct xfer *x, const void *ctx,
			       const struct pdx_kv_piece *pc)
{
	const struct host_run *at = ctx;
	const struct remote_region *rr = &x->peer->regions[at->ri];
	pdx_status_t st;

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
	st = pdx_ucx_get(x->peer->ep, at->src + pc->dst_off, pc->len, at->mem,
			 rr->addr + at->off + pc->src_off, rr->rkey, read_done,
			 x);
	if (!st) {
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

/* Our heads of one of a buffer's blocks (ctx: where the block lies in
 * it), copied into our block. */
struct whole_block {
	uint8_t *ours;
	const uint8_t *theirs;
};

static pdx_status_t copy_out(struct xfer *x, const void *ctx,
			     const struct pdx_kv_piece *pc)
{
	const struct whole_block *w = ctx;

	pdx_kv_piece_copy(w->ours, w->theirs, pc);
	return PDX_OK;
}

/* Our heads of each of b's blocks, copied into our blocks. */
static void copy_out_blocks(struct xfer *x, const struct slice_buf *b)
{
	const struct registration *g = &x->agent->reg;
	uint64_t bb = pdx_kv_layout_block_bytes(&x->peer->layout);

	for (uint32_t k = 0; k < b->count; k++) {
		struct whole_block w = {
			.ours = host_block_addr(g, b->at.layer, b->at.tensor,
						x->blocks[b->at.index + k]),
			.theirs = b->bytes + k * bb,
		};

		tp_slice_each_piece(x, &x->slice, &x->peer->layout, &g->layout,
				    1, copy_out, &w);
	}
}

/* A get into buffer b ended; with its last, b is copied out (unless b or
 * its transfer failed: those blocks are not ours, and at stop the peer
 * is gone). */
static void whole_read(void *arg, pdx_status_t status)
{
	struct slice_buf *b = arg;
	struct agent *a = b->agent;
	struct xfer *x = b->x;

	if (status && !b->status)
		b->status = status;
	if (--b->gets)
		return;
	if (!b->status && !x->finished)
		copy_out_blocks(x, b);
	status = b->status;
	slice_buf_put(a, b);
	/* what waits goes before x's next buffer; x failing goes before
	 * them (a wait of its own ends then, not resumed as live) */
	if (!status)
		slice_bufs_resume(a);
	read_done(x, status);
	if (status)
		slice_bufs_resume(a);
}

/* Gets of the peer's blocks at positions [i, i + n) of layer and tensor
 * t into b, a get per run of them consecutive in its pool; b->gets
 * counts those started. */
static pdx_status_t whole_gets(struct xfer *x, struct slice_buf *b,
			       uint32_t layer, uint32_t t, uint32_t i,
			       uint32_t n)
{
	const struct pdx_kv_layout *l = &x->peer->layout;
	uint64_t bb = pdx_kv_layout_block_bytes(l);
	bool packed = l->layer[layer].block_stride == bb;

	for (uint32_t k = 0, run; k < n; k += run) {
		const uint32_t *id = &x->remote_blocks[i + k];
		struct host_run at;
		const struct remote_region *rr;
		pdx_status_t st;

		for (run = 1; packed && k + run < n && id[run] == id[0] + run;)
			run++;
		if (host_peer_at(x, layer, t, id[0], run, &at))
			return PDX_ERANGE;
		rr = &x->peer->regions[at.ri];
		st = pdx_ucx_get(x->peer->ep, b->bytes + k * bb, run * bb, NULL,
				 rr->addr + at.off, rr->rkey, whole_read, b);
		if (st)
			return st;
		b->gets++;
	}
	return PDX_OK;
}

/* A slice of more than one row a block (a TP leg's NHD heads, blocks of
 * the other order) on the put lane: a get per row took 8 to 16 times
 * the time of equal TP sizes (docs/benchmarking.md). The peer's whole
 * blocks are read instead, up to SLICE_BUF_MAX of them a buffer, and
 * our heads copied out of them; where the peer holds more heads than we
 * take (TP p < d) that reads d / p times our bytes. One buffer from the
 * cursor (pull_layer, pull_tensor, pull_index), which then moves on. */
static pdx_status_t read_whole(struct xfer *x)
{
	struct agent *a = x->agent;
	uint64_t bb = pdx_kv_layout_block_bytes(&x->peer->layout);
	uint32_t i = x->pull_index, step = slice_buf_blocks(bb);
	uint32_t n = x->n_blocks - i < step ? x->n_blocks - i : step;
	struct slice_buf *b = NULL;
	pdx_status_t st = PDX_OK;

	if (n && (b = slice_buf_get(a, x, n * bb)) == NULL)
		st = PDX_ENOMEM;
	if (b) {
		b->at = (struct am_place){ x->pull_layer, x->pull_tensor, i };
		b->count = n;
		st = whole_gets(x, b, x->pull_layer, x->pull_tensor, i, n);
		if (b->gets) { /* its last get puts it back */
			b->status = st;
			slice_buf_count(a, b);
			xfer_hold(x);
			x->bytes += n * tp_slice_block_bytes(&x->slice,
							     &a->reg.layout);
		} else {
			slice_buf_put(a, b);
		}
	}
	if (st)
		return st;
	x->pull_index += n; /* the cursor: the next tensor, then layer */
	if (x->pull_index == x->n_blocks) {
		x->pull_index = x->skip;
		if (++x->pull_tensor == a->reg.layout.tensors) {
			x->pull_tensor = 0;
			x->pull_layer++;
		}
	}
	return PDX_OK;
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
	x->pull_whole = p->path == DATA_PUT && tp_slice_in_rows(x);
	x->pull_index = x->skip;
	log_debug("reading %zu runs x %u layers from %s%s", x->n_runs,
		  p->layout.layers, p->addr,
		  x->pull_whole ? ", as whole blocks" : "");
	reads_post(x);
}

/* x's next reads posted: a buffer of whole blocks (x->pull_whole), else
 * a layer's; false: x failed. */
static bool read_next(struct xfer *x)
{
	uint32_t l = x->pull_layer;
	pdx_status_t st;

	if (!peer_known(x->peer))
		st = PDX_EPEER;
	else if (x->pull_whole)
		st = read_whole(x);
	else
		st = host_each_run(x, x->pull_layer++, true, read_run);
	if (st)
		xfer_fail(x, st, true, "reading layer %u from %s: %s", l,
			  x->peer_addr, pdx_status_str(st));
	return !st;
}

/* A buffer that waited for room: its turn came, so it is read whatever
 * waits behind it (those would wait for it again). */
static void reads_resumed(struct xfer *x, uint32_t layer)
{
	if (!x->finished && read_next(x))
		reads_post(x);
	xfer_maybe_release(x);
}

/* Whether x may post its next reads now; else (whole blocks, and no
 * room for their buffer) it waits for room. */
static bool reads_room(struct xfer *x)
{
	pdx_status_t st;

	if (!x->pull_whole || slice_bufs_room(x))
		return true;
	st = slice_bufs_wait(x, x->pull_layer, reads_resumed);
	if (st)
		xfer_fail(x, st, true, "out of memory");
	return false;
}

/* The next reads, while fewer than READS_MAX are in flight (the ipc
 * lane's copies end at once), until the loop is due back (xfer_yield)
 * and, for whole blocks, while there is room; "pulled" after the last. */
static void reads_post(struct xfer *x)
{
	/* a buffer waiting for room goes first (reads_resumed) */
	while (!x->finished && !x->room_waits && x->inflight < READS_MAX &&
	       x->pull_layer < x->agent->reg.layout.layers) {
		if (xfer_yield(x, reads_post))
			return;
		if (!reads_room(x) || !read_next(x))
			return; /* a failure's reads started drain first */
	}
	pull_maybe_pulled(x);
}
