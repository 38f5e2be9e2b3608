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
		st = push_layer_runs(x, l);
	free(pl);
	push_op_done(x, st);
}

/* Layers are consecutive segments in staging order, so n layers are one
 * range: one copy kernel, or chunks that may span layers. */
pdx_status_t gpu_push_layers(struct xfer *x, uint32_t layer, uint32_t n)
{
	struct agent *a = x->agent;
	uint64_t segs = gpu_layer_segments(x), first = layer * segs;
	struct put_layers *pl;
	pdx_status_t st;

	/* cuda-put moves runs from the registered memory: no plan */
	if (x->peer->path != DATA_CUDA_PUT && !x->plan &&
	    (st = gpu_plan_xfer(x)))
		return st;
	switch (x->peer->path) {
	case DATA_STAGED:
		return staged_send(x, first, n * segs);
	case DATA_CUDA_IPC:
		st = gpu_plan_copy(a->gpu, x->plan, x->peer_plan, first,
				   n * segs);
		if (st)
			return st;
		x->bytes += n * segs * pdx_kv_layout_block_bytes(&a->reg.layout);
		/* each launch holds x (its blocks, and the engine's event)
		 * until it ran: a completion costs an event, not a stall */
		st = gpu_then(a->gpu, push_op_done_cb, x);
		break;
	default: /* DATA_CUDA_PUT */
		pl = malloc(sizeof(*pl));
		if (!pl)
			return PDX_ENOMEM;
		*pl = (struct put_layers){ x, layer, n };
		st = gpu_then(a->gpu, put_ready, pl);
		if (st)
			free(pl);
		break;
	}
	if (!st) {
		xfer_hold(x);
		pdx_xfer_sm_op_started(&x->sm);
	}
	return st;
}
