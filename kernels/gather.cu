/* CUDA: gather, scatter and fill of a transfer's blocks (contracts in
 * kernels/kv_kernels.h). One CTA per staging block; the pool address of
 * staging block s = (l * tensors + t) * n + i is computed on the device
 * from a small table of per-(layer, tensor) bases and strides and the
 * block ids, copied over once per call. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_util.cuh"

struct table {
	const uint64_t *base;   /* layers * tensors pool addresses */
	const uint64_t *stride; /* layers * tensors block strides */
	const uint32_t *ids;    /* n block ids */
	uint32_t n, tensors;
	uint64_t segs;          /* layers * tensors * n */
};

enum op { GATHER, SCATTER, FILL };

__global__ void k_move(struct table tb, uint8_t *staging, uint64_t bb,
		       unsigned unit, int scatter)
{
	for (uint64_t s = blockIdx.x; s < tb.segs; s += gridDim.x) {
		uint64_t lt = s / tb.n;
		uint8_t *p = (uint8_t *)tb.base[lt] +
			     (uint64_t)tb.ids[s % tb.n] * tb.stride[lt];

		if (scatter)
			pdx__cta_copy(p, staging + s * bb, bb, unit);
		else
			pdx__cta_copy(staging + s * bb, p, bb, unit);
	}
}

__global__ void k_fill(struct table tb, uint64_t bb, uint64_t seed)
{
	for (uint64_t s = blockIdx.x; s < tb.segs; s += gridDim.x) {
		uint64_t lt = s / tb.n;
		uint32_t block = tb.ids[s % tb.n];
		uint64_t l = lt / tb.tensors, t = lt % tb.tensors;
		uint8_t *p = (uint8_t *)tb.base[lt] + (uint64_t)block *
							      tb.stride[lt];
		uint64_t key = pdx__dmix64(seed ^ pdx__dmix64((l << 40) ^
							      (t << 32) ^
							      block));

		for (uint64_t w = threadIdx.x; w * 8 < bb; w += blockDim.x) {
			uint64_t word = pdx__dmix64(key + w);

			for (uint64_t j = 0; j < 8 && w * 8 + j < bb; j++)
				p[w * 8 + j] = (uint8_t)(word >> (8 * j));
		}
	}
}

/* Builds the table in one device allocation; *mem is freed by the caller
 * (stream-ordered) after the launch. *align collects the bits that decide
 * the copy unit. */
static pdx_status_t table_new(const struct pdx_kv_region *kv,
			      const uint32_t *blocks, uint32_t n,
			      cudaStream_t st, struct table *tb, void **mem,
			      uint64_t *align)
{
	const struct pdx_kv_layout *l = kv->layout;
	uint64_t lts = (uint64_t)l->layers * l->tensors;
	size_t bytes = lts * 16 + (size_t)n * 4;
	uint64_t *h = (uint64_t *)malloc(bytes), bits = 0;
	uint8_t *d = NULL;

	if (!h)
		return PDX_ENOMEM;
	for (uint32_t i = 0; i < l->layers; i++)
		for (uint32_t t = 0; t < l->tensors; t++) {
			const struct pdx_kv_ref *r = &l->layer[i].base[t];
			uint64_t lt = (uint64_t)i * l->tensors + t;

			h[lt] = (uint64_t)(uintptr_t)kv->base[r->region] +
				r->offset;
			h[lts + lt] = l->layer[i].block_stride;
			bits |= h[lt] | h[lts + lt];
		}
	memcpy(h + 2 * lts, blocks, (size_t)n * 4);
	if (cudaMallocAsync((void **)&d, bytes, st) != cudaSuccess ||
	    cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, st) !=
		    cudaSuccess ||
	    /* h is pageable and must outlive the copy */
	    cudaStreamSynchronize(st) != cudaSuccess) {
		if (d)
			cudaFreeAsync(d, st);
		free(h);
		return PDX_EIO;
	}
	free(h);
	tb->base = (const uint64_t *)d;
	tb->stride = (const uint64_t *)d + lts;
	tb->ids = (const uint32_t *)((const uint64_t *)d + 2 * lts);
	tb->n = n;
	tb->tensors = l->tensors;
	tb->segs = lts * n;
	*mem = d;
	*align = bits;
	return PDX_OK;
}

static pdx_status_t run(enum op op, const struct pdx_kv_region *kv,
			const uint32_t *blocks, uint32_t n, uint8_t *staging,
			uint64_t seed, void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	pdx_status_t rc = pdx_kv_region_check(kv, blocks, n);
	uint64_t bb, align;
	struct table tb;
	void *mem;

	if (rc || n == 0)
		return rc;
	rc = table_new(kv, blocks, n, st, &tb, &mem, &align);
	if (rc)
		return rc;
	bb = pdx_kv_layout_block_bytes(kv->layout);
	if (op == FILL)
		k_fill<<<pdx__grid(tb.segs), PDX__THREADS, 0, st>>>(tb, bb,
								     seed);
	else
		k_move<<<pdx__grid(tb.segs), PDX__THREADS, 0, st>>>(
			tb, staging, bb,
			pdx__unit(align | bb | (uint64_t)(uintptr_t)staging),
			op == SCATTER);
	rc = pdx__cuda_launched();
	if (cudaFreeAsync(mem, st) != cudaSuccess)
		rc = PDX_EIO;
	return rc;
}

extern "C" pdx_status_t pdx_kv_gather_cuda(const struct pdx_kv_region *kv,
					   const uint32_t *blocks, uint32_t n,
					   void *staging, void *stream)
{
	return run(GATHER, kv, blocks, n, (uint8_t *)staging, 0, stream);
}

extern "C" pdx_status_t pdx_kv_scatter_cuda(const struct pdx_kv_region *kv,
					    const uint32_t *blocks, uint32_t n,
					    const void *staging, void *stream)
{
	return run(SCATTER, kv, blocks, n, (uint8_t *)staging, 0, stream);
}

extern "C" pdx_status_t pdx_kv_fill_cuda(const struct pdx_kv_region *kv,
					 const uint32_t *blocks, uint32_t n,
					 uint64_t seed, void *stream)
{
	return run(FILL, kv, blocks, n, NULL, seed, stream);
}
