/* The ipc data path (host memory, one host): the sender copies each run
 * into the receiver's pool, mapped here from the shm names in its hello;
 * a copy is complete when it returns, so "done" needs no flush. */
#define PDX_LOG_TOPIC "push"
#include "agent/agent.h"
#include "common/log.h"

static pdx_status_t ipc_piece(struct xfer *x, const void *ctx,
			      const struct pdx_kv_piece *p)
{
	const struct host_run *at = ctx;
	if (!mapped_copy_piece(x->peer->regions[at->ri].map + at->off,
			       at->src, p)) {
		log_error("transfer to %s: SIGBUS as we copied into its pool "
			  "or from our engine's: one shrank under us",
			  x->peer_addr);
		return PDX_EIO;
	}
	x->bytes += pdx_kv_piece_bytes(p);
	return PDX_OK;
}

/* A leg of TP p != d copies its heads of each block (tp_slice.c). */
static pdx_status_t ipc_run(struct xfer *x, uint32_t layer, uint32_t t,
			    const struct pdx_run *r, const struct host_run *at)
{
	struct pdx_kv_piece whole = pdx_kv_piece_whole(at->len);

	if (x->slice.n)
		return tp_slice_each_piece(x, &x->slice, &x->agent->reg.layout,
					   &x->peer->layout, r->count,
					   ipc_piece, at);
	return ipc_piece(x, at, &whole);
}

pdx_status_t path_ipc_legs_layer(struct xfer *const *legs, uint32_t n,
				 uint32_t layer)
{
	const struct registration *g = &legs[0]->agent->reg;

	for (uint32_t k = 0; k < legs[0]->n_blocks; k++)
		for (uint32_t t = 0; t < g->layout.tensors; t++)
			for (uint32_t i = 0; i < n; i++) {
				struct xfer *x = legs[i];
				struct host_run at = {
					.src = host_block_addr(g, layer, t,
							       x->blocks[k]),
				};
				pdx_status_t st;

				if (k < x->skip)
					continue;
				st = host_peer_at(x, layer, t,
						  x->remote_blocks[k], 1, &at);
				if (!st)
					st = tp_slice_each_piece(
					    x, &x->slice, &g->layout,
					    &x->peer->layout, 1, ipc_piece, &at);
				if (st)
					return st;
			}
	return PDX_OK;
}

static pdx_status_t ipc_push(struct xfer *x, uint32_t layer, uint32_t n)
{
	return host_each_run(x, layer, true, ipc_run);
}

const struct data_path_ops data_path_ipc_ops = {
	.ready = host_plan_runs,
	.push = ipc_push,
};

