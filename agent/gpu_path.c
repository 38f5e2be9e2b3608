/* Transfers of GPU memory (docs/gpu.md): what the three GPU data paths
 * share, the "layer computed" events and a launch's hold on its transfer;
 * the paths are path_cuda_ipc.c, path_cuda_put.c and staged.c, and
 * gpu_plan.c holds the transfer's plans.
 *
 * Order is the stream's: a layer_done with a slot queues a wait for that
 * event on our stream, and every copy of that layer is queued after it, so
 * nothing here ever waits on the host for the engine. */
#define PDX_LOG_TOPIC "gpu"
#include "agent/agent.h"
#include "common/log.h"

pdx_status_t gpu_layer_computed(struct agent *a, uint32_t layer,
				uint32_t slot)
{
	void *ev = a->reg.events[(uint64_t)slot * a->reg.layout.layers + layer];
	pdx_status_t st = gpu_wait(a->gpu, ev);

	if (st)
		log_warn("cannot wait for layer %u's event (slot %u): its "
			 "transfers fail", layer, slot);
	return st;
}

/* Each launch holds x (its blocks, and the engine's event) until it ran:
 * a completion costs an event, not a stall. */
pdx_status_t gpu_launched(struct xfer *x, pdx_status_t st)
{
	if (!st) {
		xfer_hold(x);
		pdx_xfer_sm_op_started(&x->sm);
	}
	return st;
}
