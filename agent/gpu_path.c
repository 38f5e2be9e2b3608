/* Transfers of GPU memory (docs/gpu.md): the "layer computed" events the
 * three GPU data paths share, and the two that need no buffers of their
 * own, cuda-ipc and cuda-put; staged.c holds the third, gpu_plan.c the
 * transfer's plans.
 *
 * Order is the stream's: a layer_done with a slot queues a wait for that
 * event on our stream, and every copy of that layer is queued after it, so
 * nothing here ever waits on the host for the engine. */
#define PDX_LOG_TOPIC "gpu"
#include <stdlib.h>

#include "agent/agent.h"
#include "common/log.h"
#include "kernels/kv_kernels.h"

void gpu_layer_computed(struct agent *a, uint32_t layer, uint32_t slot)
{
	void *ev = a->reg.events[(uint64_t)slot * a->reg.layout.layers + layer];

	if (gpu_wait(a->gpu, ev))
		log_warn("cannot wait for layer %u's event (slot %u)", layer,
			 slot);
}

struct put_layers {
	struct xfer *x;
	uint32_t layer, n;
};

/* cuda-put: the layers are computed (our stream passed their events); UCX
 * puts them from GPU memory as the host path puts from shared memory. */
static void put_ready(void *arg, pdx_status_t st)
{
	struct put_layers *pl = arg;
	struct xfer *x = pl->x;

	for (uint32_t l = pl->layer; !st && !x->finished && l < pl->layer + pl->n;
	     l++)
		st = host_put_layer(x, l);
	free(pl);
	complete_op_ended(x, st);
}

/* Each launch holds x (its blocks, and the engine's event) until it ran:
 * a completion costs an event, not a stall. */
static pdx_status_t launched(struct xfer *x, pdx_status_t st)
{
	if (!st) {
		xfer_hold(x);
		pdx_xfer_sm_op_started(&x->sm);
	}
	return st;
}

static pdx_status_t cuda_put_push(struct xfer *x, uint32_t layer, uint32_t n)
{
	struct put_layers *pl = malloc(sizeof(*pl));
	pdx_status_t st;

	if (!pl)
		return PDX_ENOMEM;
	*pl = (struct put_layers){ x, layer, n };
	st = gpu_then(x->agent->gpu, put_ready, pl);
	if (st)
		free(pl);
	return launched(x, st);
}

/* Layers are consecutive segments in staging order, so n layers are one
 * range: one copy kernel into the receiver's blocks, opened here. */
static pdx_status_t cuda_ipc_push(struct xfer *x, uint32_t layer, uint32_t n)
{
	struct agent *a = x->agent;
	uint64_t segs = gpu_layer_segments(x);
	pdx_status_t st;

	if (!x->plan && (st = gpu_plan_xfer(x)))
		return st;
	st = gpu_plan_copy(a->gpu, x->plan, x->peer_plan, layer * segs,
			   n * segs);
	if (st)
		return st;
	x->bytes += n * segs * pdx_kv_layout_block_bytes(&a->reg.layout);
	return launched(x, gpu_then(a->gpu, complete_op_ended_cb, x));
}

/* cuda-put moves runs from the registered memory: no plan. */
const struct data_path_ops data_path_cuda_put_ops = {
	.ready = host_plan_runs,
	.push = cuda_put_push,
	.layer_runs = true,
	.flush = complete_flush_ucx,
};

const struct data_path_ops data_path_cuda_ipc_ops = {
	.push = cuda_ipc_push,
	.layer_runs = true,
};
