/* What the host data paths share (path_ipc.c, path_put.c, path_am.c;
 * cuda-put's puts too): a layer moves as runs of blocks consecutive on
 * both sides, each run of each tensor one operation. */
#define PDX_LOG_TOPIC "push"
#include <stdlib.h>

#include "agent/agent.h"

uint8_t *host_block_addr(const struct registration *g, uint32_t layer,
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

/* The peer's numbers are checked in 128 bits, so none can wrap past its
 * region. Its blocks hold other heads than ours with TP p != d: their
 * own size. */
pdx_status_t host_peer_at(const struct xfer *x, uint32_t layer, uint32_t t,
			  uint32_t block, uint32_t count, struct host_run *at)
{
	const struct peer *p = x->peer;
	const struct pdx_kv_layer *rl = &p->layout.layer[layer];
	uint64_t len = pdx_kv_layout_block_bytes(&p->layout) * count;
	unsigned __int128 end = (unsigned __int128)rl->base[t].offset +
				(unsigned __int128)block * rl->block_stride +
				len;

	at->ri = rl->base[t].region;
	if (at->ri >= p->n_regions || end > p->regions[at->ri].size)
		return PDX_ERANGE;
	at->off = (uint64_t)(end - len);
	return PDX_OK;
}

pdx_status_t host_each_run(struct xfer *x, uint32_t layer, bool to_peer,
			   host_run_fn fn)
{
	const struct registration *g = &x->agent->reg;
	uint64_t bb = pdx_kv_layout_block_bytes(&g->layout);

	for (size_t i = 0; i < x->n_runs; i++)
		for (uint32_t t = 0; t < g->layout.tensors; t++) {
			const struct pdx_run *r = &x->runs[i];
			struct host_run at = {
				.src = host_block_addr(g, layer, t, r->src),
				.mem = g->regions[g->layout.layer[layer]
							  .base[t].region].mem,
				.len = bb * r->count,
			};
			pdx_status_t st;

			if (to_peer &&
			    host_peer_at(x, layer, t, r->dst, r->count, &at))
				return PDX_ERANGE;
			st = fn(x, layer, t, r, &at);
			if (st)
				return st;
		}
	return PDX_OK;
}

void host_op_started(struct xfer *x, uint64_t len)
{
	xfer_hold(x);
	pdx_xfer_sm_op_started(&x->sm);
	x->bytes += len;
}
