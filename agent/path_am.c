/* The am data path (host memory, chosen over TCP, where UCX emulates
 * put): each run is one active message (AM_RUN, agent/am.h) whose header
 * names the transfer, layer, tensor and position; the receiver computes
 * the destination from its own layout, checks it lies on blocks it
 * awaits, and receives rendezvous data straight into the block. */
#define PDX_LOG_TOPIC "push"
#include <string.h>

#include "agent/agent.h"
#include "common/log.h"

/* The run as one active message; the receiver places it. */
static pdx_status_t am_run(struct xfer *x, uint32_t layer, uint32_t t,
			   const struct pdx_run *r, const struct host_run *at)
{
	uint8_t hdr[AM_RUN_BYTES] = { 0 };
	uint16_t l16 = (uint16_t)layer;
	pdx_status_t st;

	memcpy(hdr, x->id.b, 16);
	memcpy(hdr + 16, &l16, 2);
	hdr[18] = (uint8_t)t;
	memcpy(hdr + 20, &r->index, 4);
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
	return host_each_run(x, layer, false, am_run);
}

static void am_recv_done(void *arg, pdx_status_t status)
{
	struct xfer *x = arg;

	xfer_unhold(x);
	if (status)
		xfer_fail(x, status, true, "receiving from %s: %s", x->peer_addr,
			  pdx_status_str(status));
	complete_try_received(x);
	xfer_maybe_release(x);
}

/* Where a message's payload goes, computed from our own layout; NULL if
 * it does not fall exactly on blocks this transfer awaits. */
static uint8_t *am_target(struct xfer *x, uint32_t layer, uint32_t t,
			  uint32_t index, size_t len)
{
	const struct registration *g = &x->agent->reg;
	uint64_t bb = pdx_kv_layout_block_bytes(&g->layout);
	uint64_t n = len / bb;

	if (layer >= g->layout.layers || t >= g->layout.tensors || len == 0 ||
	    len % bb || index < x->skip || index >= x->n_blocks ||
	    n > x->n_blocks - index)
		return NULL;
	if (n > 1 && g->layout.layer[layer].block_stride != bb)
		return NULL;
	for (uint64_t k = 1; k < n; k++)
		if (x->blocks[index + k] != x->blocks[index] + k)
			return NULL;
	return host_block_addr(g, layer, t, x->blocks[index]);
}

/* AM_RUN: placed into x's blocks, where our own layout says they are. */
static void on_run(void *agent, const void *hdr, size_t hdr_len, void *data,
		   size_t len, bool rndv)
{
	struct agent *a = agent;
	struct pdx_xfer_id id;
	uint16_t layer;
	uint32_t index;
	struct xfer *x;
	uint8_t *dst = NULL;

	if (hdr_len == AM_RUN_BYTES) {
		const uint8_t *h = hdr;

		memcpy(id.b, h, 16);
		memcpy(&layer, h + 16, 2);
		memcpy(&index, h + 20, 4);
		x = xfer_find(a, &id);
		if (x && x->role == XFER_RECV && x->announced && !x->finished &&
		    a->reg.ok)
			dst = am_target(x, layer, h[18], index, len);
	}
	if (!dst) {
		log_warn("data message (%zu bytes, header %zu) for no awaited blocks: dropped",
			 len, hdr_len);
		if (rndv)
			pdx_ucx_am_drop(a->ucx, data);
		return;
	}
	x->am_bytes += len;
	if (!rndv) {
		memcpy(dst, data, len);
		complete_try_received(x);
		return;
	}
	xfer_hold(x);
	if (pdx_ucx_am_recv(a->ucx, data, dst, len, am_recv_done, x)) {
		xfer_unhold(x);
		xfer_fail(x, PDX_EIO, true, "cannot receive data from %s",
			  x->peer_addr);
	}
}

static const struct data_path_am am_messages[] = { { AM_RUN, on_run } };

const struct data_path_ops data_path_am_ops = {
	.ready = host_plan_runs,
	.push = am_push,
	.flush = complete_flush_ucx,
	.am = am_messages,
	.n_am = 1,
};
