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

int host_plan_runs(struct xfer *x)
{
	struct agent *a = x->agent;
	uint32_t max = packed(&a->reg.layout) && packed(&x->peer->layout) ? 0 : 1;

	x->runs = calloc(x->n_blocks, sizeof(*x->runs));
	if (!x->runs)
		return -1;
	x->n_runs = pdx_coalesce(x->blocks, x->remote_blocks, x->skip,
				 x->n_blocks, max, x->runs);
	return 0;
}

static pdx_status_t push_run(struct xfer *x, uint32_t layer, uint32_t t,
			     const struct pdx_run *r)
{
	const struct registration *g = &x->agent->reg;
	struct peer *p = x->peer;
	uint64_t len = pdx_kv_layout_block_bytes(&g->layout) * r->count;
	uint8_t *src = block_addr(g, layer, t, r->src);
	struct pdx_ucx_mem *mem =
		g->regions[g->layout.layer[layer].base[t].region].mem;
	pdx_status_t st;

	if (p->path == DATA_IPC || p->path == DATA_PUT ||
	    p->path == DATA_CUDA_PUT) {
		const struct pdx_kv_layer *rl = &p->layout.layer[layer];
		uint32_t ri = rl->base[t].region;
		/* the peer's numbers: 128 bits, so none can wrap past its
		 * region */
		unsigned __int128 end =
		    (unsigned __int128)rl->base[t].offset +
		    (unsigned __int128)r->dst * rl->block_stride + len;
		uint64_t off;

		if (ri >= p->n_regions || end > p->regions[ri].size)
			return PDX_ERANGE;
		off = (uint64_t)(end - len);
		if (p->path == DATA_IPC) {
			memcpy(p->regions[ri].map + off, src, len);
			x->bytes += len;
			return PDX_OK;
		}
		st = pdx_ucx_put(p->ep, src, len, mem, p->regions[ri].addr + off,
				 p->regions[ri].rkey, push_op_done_cb, x);
	} else {
		uint8_t hdr[AM_RUN_BYTES] = { 0 };
		uint16_t l16 = (uint16_t)layer;

		memcpy(hdr, x->id.b, 16);
		memcpy(hdr + 16, &l16, 2);
		hdr[18] = (uint8_t)t;
		memcpy(hdr + 20, &r->index, 4);
		st = pdx_ucx_am_send(p->ep, AM_RUN, hdr, sizeof(hdr), src, len, mem,
				     push_op_done_cb, x);
		if (!st)
			x->am_bytes += len;
	}
	if (!st) {
		xfer_hold(x);
		pdx_xfer_sm_op_started(&x->sm);
		x->bytes += len;
	}
	return st;
}

pdx_status_t push_layer_runs(struct xfer *x, uint32_t layer)
{
	for (size_t i = 0; i < x->n_runs; i++)
		for (uint32_t t = 0; t < x->agent->reg.layout.tensors; t++) {
			pdx_status_t st = push_run(x, layer, t, &x->runs[i]);

			if (st)
				return st;
		}
	return PDX_OK;
}

static void am_recv_done(void *arg, pdx_status_t status)
{
	struct xfer *x = arg;

	xfer_unhold(x);
	if (status)
		xfer_fail(x, status, true, "receiving from %s: %s", x->peer_addr,
			  pdx_status_str(status));
	recv_try_complete(x);
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

void host_on_run(void *agent, const void *hdr, size_t hdr_len, void *data,
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
		recv_try_complete(x);
		return;
	}
	xfer_hold(x);
	if (pdx_ucx_am_recv(a->ucx, data, dst, len, am_recv_done, x)) {
		xfer_unhold(x);
		xfer_fail(x, PDX_EIO, true, "cannot receive data from %s",
			  x->peer_addr);
	}
}
