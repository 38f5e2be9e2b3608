/* The host data paths (ipc, put, am; cuda-put's puts too): a layer moves
 * as runs of blocks, copied into the peer's mapped pools, put by UCX, or
 * sent as active messages the receiver places into its own blocks. */
#define PDX_LOG_TOPIC "push"
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "common/log.h"

static uint8_t *block_addr(const struct registration *g, uint32_t layer,
			   uint32_t tensor, uint32_t block)
{
	const struct pdx_kv_layer *ly = &g->layout.layer[layer];

	return (uint8_t *)g->regions[ly->base[tensor].region].addr +
	       ly->base[tensor].offset + (uint64_t)block * ly->block_stride;
}

/* Runs may span several blocks only where every layer's blocks are packed
 * (stride == block bytes) on both sides. */
static bool packed(const struct pdx_kv_layout *l)
{
	uint64_t bb = pdx_kv_layout_block_bytes(l);

	for (uint32_t i = 0; i < l->layers; i++)
		if (l->layer[i].block_stride != bb)
			return false;
	return true;
}

pdx_status_t host_plan_runs(struct xfer *x)
{
	struct agent *a = x->agent;
	uint32_t max = packed(&a->reg.layout) && packed(&x->peer->layout) ? 0 : 1;

	x->runs = calloc(x->n_blocks, sizeof(*x->runs));
	if (!x->runs)
		return PDX_ENOMEM;
	x->n_runs = pdx_coalesce(x->blocks, x->remote_blocks, x->skip,
				 x->n_blocks, max, x->runs);
	return PDX_OK;
}

/* One run of one tensor of one layer: from our block... */
struct run {
	uint8_t *src;
	struct pdx_ucx_mem *mem; /* our region's UCX registration */
	uint64_t len;
	/* ...to the peer's region ri at off (ipc, put) */
	uint32_t ri;
	uint64_t off;
};

typedef pdx_status_t (*run_fn)(struct xfer *x, uint32_t layer, uint32_t t,
			       const struct pdx_run *r, const struct run *at);

/* Each run of each tensor of layer, by fn; to_peer: where it lands in the
 * peer's regions, checked against them (the peer's numbers, in 128 bits,
 * so none can wrap past its region). */
static pdx_status_t each_run(struct xfer *x, uint32_t layer, bool to_peer,
			     run_fn fn)
{
	const struct registration *g = &x->agent->reg;
	const struct peer *p = x->peer;
	uint64_t bb = pdx_kv_layout_block_bytes(&g->layout);

	for (size_t i = 0; i < x->n_runs; i++)
		for (uint32_t t = 0; t < g->layout.tensors; t++) {
			const struct pdx_run *r = &x->runs[i];
			struct run at = {
				.src = block_addr(g, layer, t, r->src),
				.mem = g->regions[g->layout.layer[layer]
							  .base[t].region].mem,
				.len = bb * r->count,
			};
			pdx_status_t st;

			if (to_peer) {
				const struct pdx_kv_layer *rl = &p->layout.layer[layer];
				unsigned __int128 end =
				    (unsigned __int128)rl->base[t].offset +
				    (unsigned __int128)r->dst * rl->block_stride +
				    at.len;

				at.ri = rl->base[t].region;
				if (at.ri >= p->n_regions ||
				    end > p->regions[at.ri].size)
					return PDX_ERANGE;
				at.off = (uint64_t)(end - at.len);
			}
			st = fn(x, layer, t, r, &at);
			if (st)
				return st;
		}
	return PDX_OK;
}

/* A UCX operation on x's blocks began. */
static void op_started(struct xfer *x, uint64_t len)
{
	xfer_hold(x);
	pdx_xfer_sm_op_started(&x->sm);
	x->bytes += len;
}

/* ipc: a copy into the peer's pool, mapped here; complete on return. */
static pdx_status_t ipc_run(struct xfer *x, uint32_t layer, uint32_t t,
			    const struct pdx_run *r, const struct run *at)
{
	memcpy(x->peer->regions[at->ri].map + at->off, at->src, at->len);
	x->bytes += at->len;
	return PDX_OK;
}

static pdx_status_t ipc_push(struct xfer *x, uint32_t layer, uint32_t n)
{
	return each_run(x, layer, true, ipc_run);
}

static pdx_status_t put_run(struct xfer *x, uint32_t layer, uint32_t t,
			    const struct pdx_run *r, const struct run *at)
{
	const struct remote_region *rr = &x->peer->regions[at->ri];
	pdx_status_t st;

	st = pdx_ucx_put(x->peer->ep, at->src, at->len, at->mem,
			 rr->addr + at->off, rr->rkey, complete_op_ended_cb, x);
	if (!st)
		op_started(x, at->len);
	return st;
}

pdx_status_t host_put_layer(struct xfer *x, uint32_t layer)
{
	return each_run(x, layer, true, put_run);
}

static pdx_status_t put_push(struct xfer *x, uint32_t layer, uint32_t n)
{
	return host_put_layer(x, layer);
}

/* am: the run as one active message; the receiver places it. */
static pdx_status_t am_run(struct xfer *x, uint32_t layer, uint32_t t,
			   const struct pdx_run *r, const struct run *at)
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
		op_started(x, at->len);
	}
	return st;
}

static pdx_status_t am_push(struct xfer *x, uint32_t layer, uint32_t n)
{
	return each_run(x, layer, false, am_run);
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
	return block_addr(g, layer, t, x->blocks[index]);
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

const struct data_path_ops data_path_ipc_ops = {
	.ready = host_plan_runs,
	.push = ipc_push,
};

const struct data_path_ops data_path_put_ops = {
	.ready = host_plan_runs,
	.push = put_push,
	.flush = complete_flush_ucx,
};

const struct data_path_ops data_path_am_ops = {
	.ready = host_plan_runs,
	.push = am_push,
	.flush = complete_flush_ucx,
	.am = am_messages,
	.n_am = 1,
};
