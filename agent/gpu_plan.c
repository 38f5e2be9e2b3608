/* A GPU transfer's plans (docs/gpu.md): where each segment (one block of
 * one tensor of one layer, in staging order over the blocks [skip, n))
 * lies in our memory and, for cuda-ipc, in the receiver's. The GPU paths
 * (gpu_path.c, staged.c) copy by them. */
#include "agent/agent.h"
#include "kernels/kv_kernels.h"

uint64_t gpu_layer_segments(const struct xfer *x)
{
	return (uint64_t)x->agent->reg.layout.tensors * (x->n_blocks - x->skip);
}

static pdx_status_t plan(struct agent *a, const struct pdx_kv_layout *l,
			 void *const *bases, uint32_t n_bases,
			 const uint32_t *blocks, uint32_t n,
			 struct pdx_kv_plan **out)
{
	uint8_t *base[PDX_MAX_REGIONS];
	struct pdx_kv_region kv = { l, base, n_bases };

	for (uint32_t i = 0; i < n_bases; i++)
		base[i] = bases[i];
	return gpu_plan_new(a->gpu, &kv, blocks, n, out);
}

pdx_status_t gpu_plan_xfer(struct xfer *x)
{
	struct agent *a = x->agent;
	struct peer *p = x->peer;
	void *bases[PDX_MAX_REGIONS];
	uint32_t n = x->n_blocks - x->skip;
	pdx_status_t st;

	for (uint32_t i = 0; i < a->reg.n_regions; i++)
		bases[i] = a->reg.regions[i].addr;
	st = plan(a, &a->reg.layout, bases, a->reg.n_regions,
		  x->blocks + x->skip, n, &x->plan);
	if (st || x->role != XFER_SEND || p->path != DATA_CUDA_IPC)
		return st;
	for (uint32_t i = 0; i < p->n_regions; i++)
		bases[i] = p->regions[i].dptr;
	return plan(a, &p->layout, bases, p->n_regions,
		    x->remote_blocks + x->skip, n, &x->peer_plan);
}
