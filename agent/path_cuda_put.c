/* The cuda-put data path (GPU memory, both sides' UCX moves it): once our
 * stream passed the layers' "layer computed" events, UCX puts their runs
 * from GPU memory as the put path puts from shared memory. */
#define PDX_LOG_TOPIC "gpu"
#include <stdlib.h>

#include "agent/agent.h"

struct put_layers {
	struct xfer *x;
	uint32_t layer, n;
};

/* The layers are computed (our stream passed their events). */
static void put_ready(void *arg, pdx_status_t st)
{
	struct put_layers *pl = arg;
	struct xfer *x = pl->x;

	for (uint32_t l = pl->layer; !st && !x->finished && l < pl->layer + pl->n;
	     l++)
		st = path_put_layer(x, l);
	free(pl);
	complete_op_ended(x, st);
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
	return gpu_launched(x, st);
}

/* cuda-put moves runs from the registered memory: no plan. */
const struct data_path_ops data_path_cuda_put_ops = {
	.ready = host_plan_runs,
	.push = cuda_put_push,
	.layer_runs = true,
	.flush = complete_flush_ucx,
};
