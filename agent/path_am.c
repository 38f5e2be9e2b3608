/* The am data path (host memory, chosen over TCP, where UCX emulates
 * put): each run is one active message (AM_RUN, agent/am.h) whose header
 * names the transfer, layer, tensor and position; the receiver computes
 * the destination from its own layout, checks it lies on blocks it
 * awaits (am_place.c), and receives rendezvous data straight into the
 * block. A TP leg's heads go packed instead (am_slice.c). */
#define PDX_LOG_TOPIC "push"
#include <string.h>

#include "agent/agent.h"

/* The run as one active message; the receiver places it. */
static pdx_status_t am_run(struct xfer *x, uint32_t layer, uint32_t t,
			   const struct pdx_run *r, const struct host_run *at)
{
	uint8_t hdr[AM_RUN_BYTES];
	pdx_status_t st;

	am_place_header(hdr, x, layer, t, r->index);
	st = pdx_ucx_am_send(x->peer->ep, AM_RUN, hdr, sizeof(hdr), at->src,
			     at->len, at->mem, complete_op_ended_cb, x);
	if (!st) {
		x->am_bytes += at->len;
		host_op_started(x, at->len);
	}
	return st;
}

static pdx_status_t am_push(struct xfer *x, uint32_t layer, uint32_t n)
{
	if (x->slice.n)
		return am_slice_push(x, layer);
	return host_each_run(x, layer, false, am_run);
}

/* AM_RUN: placed into x's blocks, where our own layout says they are. */
static void on_run(void *agent, const void *hdr, size_t hdr_len, void *data,
		   size_t len, bool rndv)
{
	struct agent *a = agent;
	struct am_place at;
	struct xfer *x = am_place_xfer(a, hdr, hdr_len, &at);
	uint64_t bb = pdx_kv_layout_block_bytes(&a->reg.layout);
	uint8_t *dst = NULL;

	if (x && !x->slice.n && len % bb == 0)
		dst = am_place_blocks(x, &at, len / bb);
	if (!dst) {
		am_place_drop(a, hdr, hdr_len, data, len, rndv);
		return;
	}
	x->am_bytes += len;
	if (!rndv) {
		memcpy(dst, data, len);
		complete_try_received(x);
		return;
	}
	xfer_hold(x);
	if (pdx_ucx_am_recv(a->ucx, data, dst, len, am_place_received, x)) {
		xfer_unhold(x);
		xfer_fail(x, PDX_EIO, true, "cannot receive data from %s",
			  x->peer_addr);
	}
}

static const struct data_path_am am_messages[] = {
	{ AM_RUN, on_run },
	{ AM_SLICE, am_slice_on_message },
};

const struct data_path_ops data_path_am_ops = {
	.ready = host_plan_runs,
	.push = am_push,
	.flush = complete_flush_ucx,
	.am = am_messages,
	.n_am = 2,
};
