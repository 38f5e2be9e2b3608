/* CUDA: one-shot gather, scatter and fill of a transfer's blocks
 * (contracts in kernels/kv_kernels.h). Each builds a plan (kernels/plan.cu),
 * queues its work on the caller's stream and frees the plan behind that
 * work, so nothing waits for the caller's stream. */
#include "kernels/plan.cuh"

/* One CTA per segment; the fill definition is in kernels/kv_kernels.h. */
__global__ void k_fill(struct pdx__plan_dev d, uint64_t segs, uint64_t bb,
		       uint64_t seed)
{
	for (uint64_t s = blockIdx.x; s < segs; s += gridDim.x) {
		uint64_t lt = s / d.n, l = lt / d.tensors, t = lt % d.tensors;
		uint32_t block = d.ids[s % d.n];
		uint8_t *p = pdx__plan_seg(&d, s);
		uint64_t key = pdx__dmix64(
		    seed ^ pdx__dmix64((l << 40) ^ (t << 32) ^ block));

		for (uint64_t w = threadIdx.x; w * 8 < bb; w += blockDim.x) {
			uint64_t word = pdx__dmix64(key + w);

			for (uint64_t j = 0; j < 8 && w * 8 + j < bb; j++)
				p[w * 8 + j] = (uint8_t)(word >> (8 * j));
		}
	}
}

static pdx_status_t plan_fill(const struct pdx_kv_plan *p, uint64_t seed,
			      cudaStream_t st)
{
	if (!p->segs)
		return PDX_OK;
	pdx__cuda_launch_begin();
	k_fill<<<pdx__grid(p->segs), PDX__THREADS, 0, st>>>(p->dev, p->segs,
							    p->bb, seed);
	return pdx__cuda_launched();
}

enum op { GATHER, SCATTER, FILL };

static pdx_status_t once(enum op op, const struct pdx_kv_region *kv,
			 const uint32_t *blocks, uint32_t n, void *staging,
			 uint64_t seed, void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	struct pdx_kv_plan *p;
	pdx_status_t rc, frc;

	rc = pdx_kv_plan_new_cuda(kv, blocks, n, &p);
	if (rc)
		return rc;
	if (op == GATHER)
		rc = pdx_kv_plan_gather_cuda(p, 0, p->segs, staging, stream);
	else if (op == SCATTER)
		rc = pdx_kv_plan_scatter_cuda(p, 0, p->segs, staging, stream);
	else
		rc = plan_fill(p, seed, st);
	frc = pdx__plan_free_on(p, st);
	return rc ? rc : frc;
}

extern "C" pdx_status_t pdx_kv_gather_cuda(const struct pdx_kv_region *kv,
					   const uint32_t *blocks, uint32_t n,
					   void *staging, void *stream)
{
	return once(GATHER, kv, blocks, n, staging, 0, stream);
}

extern "C" pdx_status_t pdx_kv_scatter_cuda(const struct pdx_kv_region *kv,
					    const uint32_t *blocks, uint32_t n,
					    const void *staging, void *stream)
{
	return once(SCATTER, kv, blocks, n, (void *)staging, 0, stream);
}

extern "C" pdx_status_t pdx_kv_fill_cuda(const struct pdx_kv_region *kv,
					 const uint32_t *blocks, uint32_t n,
					 uint64_t seed, void *stream)
{
	return once(FILL, kv, blocks, n, NULL, seed, stream);
}
