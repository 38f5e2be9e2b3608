/* Internal to kernels/<name>.cu: what a plan (kernels/kv_kernels.h) holds,
 * and how a kernel finds a segment's pool address in it. */
#ifndef PDX_KERNELS_PLAN_CUH
#define PDX_KERNELS_PLAN_CUH

#include "kernels/cuda_util.cuh"

/* The device side, passed to kernels by value: three arrays in one
 * allocation. Segment s = lt * n + i is block ids[i] of (layer, tensor)
 * lt = l * tensors + t. */
struct pdx__plan_dev {
	const uint64_t *base;	/* layers * tensors: address of block 0 */
	const uint64_t *stride; /* layers * tensors: bytes between blocks */
	const uint32_t *ids;	/* n block ids */
	uint32_t n, tensors;
};

struct pdx_kv_plan {
	struct pdx__plan_dev dev;
	void *mem;	/* the allocation dev points into */
	uint64_t segs;	/* layers * tensors * n */
	uint64_t bb;	/* block bytes */
	uint64_t align; /* OR of every base and stride: bounds the copy unit */
};

__device__ __forceinline__ uint8_t *pdx__plan_seg(const struct pdx__plan_dev *d,
						  uint64_t s)
{
	uint64_t lt = s / d->n;

	return (uint8_t *)d->base[lt] +
	       (uint64_t)d->ids[s % d->n] * d->stride[lt];
}

/* Frees p in stream order on `stream` (after the work queued there), for
 * one-shot callers that queued all their uses of p on that stream. */
pdx_status_t pdx__plan_free_on(struct pdx_kv_plan *p, cudaStream_t stream);

#endif
