/* The cuda-ipc data path (GPU memory, one host): our stream copies each
 * run of computed layers straight into the receiver's blocks, its memory
 * opened here with CUDA IPC; a copy is complete when its stream callback
 * runs, so "done" needs no flush. A leg of TP p != d copies only its
 * heads of each block (tp_slice.c): the same piece of every segment. */
#define PDX_LOG_TOPIC "gpu"
#include "agent/agent.h"

static pdx_status_t keep_piece(struct xfer *x, const void *ctx,
			       const struct pdx_kv_piece *p)
{
	(void)x;
	*(struct pdx_kv_piece *)ctx = *p;
	return PDX_OK;
}

/* Layers are consecutive segments in staging order, so n layers are one
 * range: one copy kernel into the receiver's blocks, opened here. */
static pdx_status_t cuda_ipc_push(struct xfer *x, uint32_t layer, uint32_t n)
{
	struct agent *a = x->agent;
	uint64_t segs = gpu_layer_segments(x), bytes;
	struct pdx_kv_piece piece;
	pdx_status_t st;

	if (!x->plan && (st = gpu_plan_xfer(x)))
		return st;
	if (x->slice.n) {
		/* one block's piece: offsets from the block's start */
		st = tp_slice_each_piece(x, &x->slice, &a->reg.layout,
					 &x->peer->layout, 1, keep_piece,
					 &piece);
		if (!st)
			st = gpu_plan_copy_piece(a->gpu, x->plan, x->peer_plan,
						 &piece, layer * segs,
						 n * segs);
		bytes = pdx_kv_piece_bytes(&piece);
	} else {
		st = gpu_plan_copy(a->gpu, x->plan, x->peer_plan, layer * segs,
				   n * segs);
		bytes = pdx_kv_layout_block_bytes(&a->reg.layout);
	}
	if (st)
		return st;
	x->bytes += n * segs * bytes;
	return gpu_launched(x, gpu_then(a->gpu, complete_op_ended_cb, x));
}

const struct data_path_ops data_path_cuda_ipc_ops = {
	.push = cuda_ipc_push,
	.layer_runs = true,
};
