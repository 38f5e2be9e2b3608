/* The put data path (host memory): UCX puts each run into the
 * receiver's blocks with its rkeys, flushed before "done"; cuda-put puts
 * GPU memory the same way. Slices of more than one row a block (NHD TP
 * legs, blocks converted to the other order) go as the am lane's slice
 * messages. */
#define PDX_LOG_TOPIC "push"
#include "agent/agent.h"

static pdx_status_t put_piece(struct xfer *x, const void *ctx,
			      const struct pdx_kv_piece *p)
{
	const struct host_run *at = ctx;
	const struct remote_region *rr = &x->peer->regions[at->ri];
	uint64_t n = (uint64_t)p->groups * p->rows, src, dst;
	pdx_status_t st = PDX_OK;

	for (uint64_t k = 0; k < n && !st; k++) {
		pdx_kv_piece_row(p, k, &src, &dst);
		st = pdx_ucx_put(x->peer->ep, at->src + src, p->len, at->mem,
				 rr->addr + at->off + dst, rr->rkey,
				 complete_op_ended_cb, x);
		if (!st)
			host_op_started(x, p->len);
	}
	return st;
}

/* A leg of TP p != d puts its heads of each block (tp_slice.c). */
static pdx_status_t put_run(struct xfer *x, uint32_t layer, uint32_t t,
			    const struct pdx_run *r, const struct host_run *at)
{
	struct pdx_kv_piece whole = pdx_kv_piece_whole(at->len);

	if (x->slice.n)
		return tp_slice_each_piece(x, &x->slice, &x->agent->reg.layout,
					   &x->peer->layout, r->count,
					   put_piece, at);
	return put_piece(x, at, &whole);
}

pdx_status_t path_put_layer(struct xfer *x, uint32_t layer)
{
	return host_each_run(x, layer, true, put_run);
}

/* A slice of more than one row a block would be a put per row: per
 * token of a TP leg's NHD heads, per head and token of blocks converted
 * to the other order (5 to 22 times the time of packing them here:
 * docs/benchmarking.md, "TP legs over TCP (the am lane), and pulled").
 * Packed into slice messages instead, as the am lane's (am_slice.c),
 * for a receiver that takes them there (its hello's "slices"; an older
 * agent's version 3 hello does not say it, and gets the puts). */
static pdx_status_t put_push(struct xfer *x, uint32_t layer, uint32_t n)
{
	if (tp_slice_in_rows(x) && x->peer->slices)
		return am_slice_push(x, layer);
	return path_put_layer(x, layer);
}

const struct data_path_ops data_path_put_ops = {
	.ready = host_plan_runs,
	.push = put_push,
	.flush = complete_flush_ucx,
};

