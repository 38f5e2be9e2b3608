/* A TP leg's heads on the am lane (docs/protocol.md, "TP legs"). Its
 * heads are not contiguous in either side's blocks (NHD: a row per
 * token), so the sender packs its slice of a few blocks into one message
 * (AM_SLICE, at most SLICE_BUF_MAX bytes) and the receiver unpacks it
 * into its own blocks: a copy on each side, as UCX itself copies on TCP.
 *
 * A message covers consecutive positions of the transfer's blocks,
 * whatever their ids on either side: each block is packed from, and
 * unpacked into, where its own id puts it.
 *
 * Its buffers, and their bound, are slice_bufs.c's. */
#define PDX_LOG_TOPIC "push"
#include "agent/agent.h"
#include "common/log.h"

/* One block's slice between the block at `block` and *at (advanced). */
struct slice_cursor {
	uint8_t *block;
	uint8_t **at;
	bool pack; /* block -> *at; else *at -> block */
};

static pdx_status_t slice_piece(struct xfer *x, const void *ctx,
				const struct pdx_kv_piece *p)
{
	const struct slice_cursor *c = ctx;
	/* the message's side is packed: from the block into it, or back */
	struct pdx_kv_piece q = pdx_kv_piece_packed(*p, c->pack ? PDX_KV_DST
								: PDX_KV_SRC);

	if (c->pack)
		pdx_kv_piece_copy(*c->at, c->block, &q);
	else
		pdx_kv_piece_copy(c->block, *c->at, &q);
	*c->at += pdx_kv_piece_bytes(p);
	return PDX_OK;
}

/* The slices of pk's blocks between our blocks and pk->bytes (or data,
 * a receiver's eager payload). */
static void slice_copy(struct xfer *x, const struct slice_buf *pk,
		       uint8_t *bytes, bool pack)
{
	const struct registration *g = &x->agent->reg;
	const struct pdx_kv_layout *theirs = &x->peer->layout;
	struct slice_cursor c = { .at = &bytes, .pack = pack };

	for (uint32_t k = 0; k < pk->count; k++) {
		c.block = host_block_addr(g, pk->at.layer, pk->at.tensor,
					  x->blocks[pk->at.index + k]);
		tp_slice_each_piece(x, &x->slice, pack ? &g->layout : theirs,
				    pack ? theirs : &g->layout, 1, slice_piece,
				    &c);
	}
}

static void slice_sent(void *arg, pdx_status_t status)
{
	struct slice_buf *pk = arg;
	struct agent *a = pk->agent;
	struct xfer *x = pk->x;

	slice_buf_put(a, pk);
	if (a->slices.stopping) /* cancelled: its transfer is gone */
		return;
	/* what waits goes before x's next layer; x failing goes before
	 * them (a wait of its own ends then, not resumed as live) */
	if (!status)
		slice_bufs_resume(a);
	complete_op_ended(x, status);
	if (status)
		slice_bufs_resume(a);
}

/* x's heads of layer: blocks [skip, n) of each tensor, packed a message
 * per SLICE_BUF_MAX bytes. */
static pdx_status_t slice_layer(struct xfer *x, uint32_t layer)
{
	struct agent *a = x->agent;
	uint64_t per = tp_slice_block_bytes(&x->slice, &a->reg.layout);
	uint32_t step = slice_buf_blocks(per);

	for (uint32_t t = 0; t < a->reg.layout.tensors; t++)
		for (uint32_t i = x->skip; i < x->n_blocks; i += step) {
			uint32_t n = x->n_blocks - i < step ? x->n_blocks - i
							    : step;
			struct slice_buf *pk = slice_buf_get(a, x, n * per);
			uint8_t hdr[AM_SLICE_BYTES];
			pdx_status_t st;

			if (!pk)
				return PDX_ENOMEM;
			pk->at = (struct am_place){ layer, t, i };
			pk->count = n;
			slice_copy(x, pk, pk->bytes, true);
			am_place_header(hdr, x, layer, t, i);
			st = pdx_ucx_am_send(x->peer->ep, AM_SLICE, hdr,
					     sizeof(hdr), pk->bytes, pk->len,
					     NULL, slice_sent, pk);
			if (st) {
				slice_buf_put(a, pk);
				return st;
			}
			slice_buf_count(a, pk);
			x->am_bytes += pk->len;
			host_op_started(x, pk->len);
		}
	return PDX_OK;
}

/* A layer that waited for room: packed now. */
static void slice_resumed(struct xfer *x, uint32_t layer)
{
	pdx_status_t st = PDX_OK;

	if (!x->finished)
		st = x->peer->state == PEER_READY && x->peer->ep
			     ? slice_layer(x, layer)
			     : PDX_EPEER;
	if (st)
		xfer_fail(x, st, true, "push of layer %u to %s: %s", layer,
			  x->peer_addr, pdx_status_str(st));
	pdx_xfer_sm_op_finished(&x->sm); /* the wait's own */
	complete_try_flush(x);
	xfer_maybe_release(x);
}

pdx_status_t am_slice_push(struct xfer *x, uint32_t layer)
{
	pdx_status_t st;

	if (slice_bufs_room(x))
		return slice_layer(x, layer);
	st = slice_bufs_wait(x, layer, slice_resumed);
	if (st)
		return st;
	pdx_xfer_sm_op_started(&x->sm); /* its flush waits for it */
	return PDX_OK;
}

static void slice_received(void *arg, pdx_status_t status)
{
	struct slice_buf *pk = arg;
	struct agent *a = pk->agent;
	struct xfer *x = pk->x;

	if (a->slices.stopping) { /* cancelled: its transfer is gone */
		slice_buf_put(a, pk);
		return;
	}
	if (!status && !x->finished) /* a failed one's blocks are not ours */
		slice_copy(x, pk, pk->bytes, false);
	slice_buf_put(a, pk);
	am_place_received(x, status);
}

void am_slice_on_message(void *agent, const void *hdr, size_t hdr_len,
			 void *data, size_t len, bool rndv)
{
	struct agent *a = agent;
	struct slice_buf eager, *pk = &eager;
	struct am_place at;
	struct xfer *x = am_place_xfer(a, hdr, hdr_len, &at);
	uint64_t per = x && x->slice.n
			       ? tp_slice_block_bytes(&x->slice, &a->reg.layout)
			       : 0;

	/* no more blocks than a sender packs in one message */
	if (!per || len % per || len / per > slice_buf_blocks(per) ||
	    !am_place_awaited(x, &at, len / per)) {
		am_place_drop(a, hdr, hdr_len, data, len, rndv);
		return;
	}
	x->am_bytes += len;
	if (rndv) /* into a buffer first */
		pk = slice_buf_get(a, x, len);
	if (!pk) {
		pdx_ucx_am_drop(a->ucx, data);
		xfer_fail(x, PDX_ENOMEM, true, "out of memory for %zu bytes "
			  "from %s", len, x->peer_addr);
		return;
	}
	pk->at = at;
	pk->count = (uint32_t)(len / per);
	if (!rndv) {
		slice_copy(x, pk, data, false);
		complete_try_received(x);
		return;
	}
	xfer_hold(x);
	if (pdx_ucx_am_recv(a->ucx, data, pk->bytes, len, slice_received, pk)) {
		slice_buf_put(a, pk);
		xfer_unhold(x);
		xfer_fail(x, PDX_EIO, true, "cannot receive data from %s",
			  x->peer_addr);
	}
}
