/* CUDA: plans (contracts in kernels/kv_kernels.h). A plan is the table a
 * gather, scatter or copy kernel resolves segment addresses from: a base
 * and a stride per (layer, tensor) and the n block ids, uploaded once so
 * that the per-layer launches upload nothing and never wait on the host.
 * One CTA per segment, grid-stride, copying in the widest unit that every
 * base, stride, staging address and the block bytes allow. */
#include <mutex>
#include <stdlib.h>
#include <string.h>

#include "kernels/plan.cuh"

#define PLAN_MAX_DEVICES 64
#define PLAN_POOL_KEEP (64ULL << 20)

__global__ void k_move(struct pdx__plan_dev d, uint64_t first, uint64_t count,
		       uint8_t *staging, uint64_t bb, unsigned unit,
		       int scatter)
{
	for (uint64_t k = blockIdx.x; k < count; k += gridDim.x) {
		uint8_t *p = pdx__plan_seg(&d, first + k);

		if (scatter)
			pdx__cta_copy(p, staging + k * bb, bb, unit);
		else
			pdx__cta_copy(staging + k * bb, p, bb, unit);
	}
}

__global__ void k_copy(struct pdx__plan_dev src, struct pdx__plan_dev dst,
		       uint64_t first, uint64_t count, uint64_t bb,
		       unsigned unit)
{
	for (uint64_t k = blockIdx.x; k < count; k += gridDim.x)
		pdx__cta_copy(pdx__plan_seg(&dst, first + k),
			      pdx__plan_seg(&src, first + k), bb, unit);
}

/* One CTA per segment copies the piece's groups of rows, their units as
 * one index space (rows are short: an NHD row is a few heads of one
 * token, a row between NHD and HND one head of one token). */
template <typename U>
__device__ __forceinline__ void copy_rows(uint8_t *d, const uint8_t *s,
					  const struct pdx_kv_piece &pc)
{
	uint64_t per = pc.len / sizeof(U), n = per * pc.rows * pc.groups;

	for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) {
		uint64_t k = i / per, c = i % per;
		uint64_t g = k / pc.rows, r = k % pc.rows;

		((U *)(d + g * pc.dst_group + r * pc.dst_stride))[c] =
		    ((const U *)(s + g * pc.src_group + r * pc.src_stride))[c];
	}
}

__global__ void k_copy_piece(struct pdx__plan_dev src,
			     struct pdx__plan_dev dst, struct pdx_kv_piece pc,
			     uint64_t first, uint64_t count, unsigned unit)
{
	for (uint64_t k = blockIdx.x; k < count; k += gridDim.x) {
		uint8_t *d = pdx__plan_seg(&dst, first + k) + pc.dst_off;
		const uint8_t *s = pdx__plan_seg(&src, first + k) + pc.src_off;

		switch (unit) {
		case 16:
			copy_rows<uint4>(d, s, pc);
			break;
		case 8:
			copy_rows<uint64_t>(d, s, pc);
			break;
		case 4:
			copy_rows<uint32_t>(d, s, pc);
			break;
		default:
			copy_rows<uint8_t>(d, s, pc);
		}
	}
}

/* Plan tables come from a pool of their own, one per device, that never
 * adds a stream dependency to reuse memory. The device's default pool
 * allows that (cudaMemPoolReuseAllowInternalDependencies), so an
 * allocation on our private stream may be made to wait for a free still
 * queued behind a cudaStreamWaitEvent on the engine's event, and plan_new's
 * synchronise would then wait for the engine after all. Kept for the
 * process's life; PLAN_POOL_KEEP spares a remap per plan. */
static pdx_status_t table_pool(cudaMemPool_t *out)
{
	static std::mutex lock;
	static cudaMemPool_t pools[PLAN_MAX_DEVICES];
	cudaMemPoolProps props;
	cudaMemPool_t pool;
	uint64_t keep = PLAN_POOL_KEEP;
	int dev, no = 0;

	PDX_CUDA_TRY(cudaGetDevice(&dev));
	if (dev < 0 || dev >= PLAN_MAX_DEVICES)
		return PDX_EIO;
	std::lock_guard<std::mutex> hold(lock);
	if (pools[dev]) {
		*out = pools[dev];
		return PDX_OK;
	}
	memset(&props, 0, sizeof(props));
	props.allocType = cudaMemAllocationTypePinned;
	props.location.type = cudaMemLocationTypeDevice;
	props.location.id = dev;
	PDX_CUDA_TRY(cudaMemPoolCreate(&pool, &props));
	if (cudaMemPoolSetAttribute(pool,
				    cudaMemPoolReuseAllowInternalDependencies,
				    &no) != cudaSuccess ||
	    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold,
				    &keep) != cudaSuccess) {
		cudaMemPoolDestroy(pool);
		return PDX_EIO;
	}
	pools[dev] = pool;
	*out = pool;
	return PDX_OK;
}

/* Uploads the bytes bytes at h into p->mem, synchronously but on a private
 * non-blocking stream, so that no work queued elsewhere is waited for. */
static pdx_status_t table_upload(struct pdx_kv_plan *p, const void *h,
				 size_t bytes)
{
	cudaMemPool_t pool;
	cudaStream_t st;
	void *d = NULL;
	pdx_status_t rc = table_pool(&pool);

	if (rc)
		return rc;
	PDX_CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	if (cudaMallocFromPoolAsync(&d, bytes, pool, st) != cudaSuccess) {
		rc = PDX_EIO;
		goto destroy;
	}
	/* h is pageable and freed on return: wait for the copy */
	if (cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, st) !=
		cudaSuccess ||
	    cudaStreamSynchronize(st) != cudaSuccess) {
		rc = PDX_EIO;
		cudaFreeAsync(d, st);
		goto destroy;
	}
	p->mem = d;
destroy:
	cudaStreamDestroy(st);
	return rc;
}

extern "C" pdx_status_t pdx_kv_plan_new_cuda(const struct pdx_kv_region *kv,
					     const uint32_t *blocks, uint32_t n,
					     struct pdx_kv_plan **out)
{
	const struct pdx_kv_layout *l;
	struct pdx_kv_plan *p;
	uint64_t lts, *h, bits = 0;
	size_t bytes;
	pdx_status_t rc;

	if (!kv || !out)
		return PDX_EINVAL;
	rc = pdx_kv_region_check(kv, blocks, n);
	if (rc)
		return rc;
	l = kv->layout;
	lts = (uint64_t)l->layers * l->tensors;
	bytes = lts * 16 + (size_t)n * 4;
	p = (struct pdx_kv_plan *)calloc(1, sizeof(*p));
	h = (uint64_t *)malloc(bytes);
	if (!p || !h) {
		rc = PDX_ENOMEM;
		goto fail;
	}
	for (uint32_t i = 0; i < l->layers; i++)
		for (uint32_t t = 0; t < l->tensors; t++) {
			uint64_t lt = (uint64_t)i * l->tensors + t;

			h[lt] =
			    (uint64_t)(uintptr_t)pdx_kv_block_ptr(kv, i, t, 0);
			h[lts + lt] = l->layer[i].block_stride;
			bits |= h[lt] | h[lts + lt];
		}
	if (n)
		memcpy(h + 2 * lts, blocks, (size_t)n * 4);
	rc = table_upload(p, h, bytes);
	if (rc)
		goto fail;
	free(h);
	p->dev.base = (const uint64_t *)p->mem;
	p->dev.stride = (const uint64_t *)p->mem + lts;
	p->dev.ids = (const uint32_t *)((const uint64_t *)p->mem + 2 * lts);
	p->dev.n = n;
	p->dev.tensors = l->tensors;
	p->segs = lts * n;
	p->bb = pdx_kv_layout_block_bytes(l);
	p->align = bits;
	*out = p;
	return PDX_OK;
fail:
	free(h);
	free(p);
	return rc;
}

pdx_status_t pdx__plan_free_on(struct pdx_kv_plan *p, cudaStream_t stream)
{
	pdx_status_t rc = PDX_OK;

	if (!p)
		return PDX_OK;
	if (cudaFreeAsync(p->mem, stream) != cudaSuccess)
		rc = PDX_EIO;
	free(p);
	return rc;
}

/* The caller has seen every use of p complete, so a fresh stream frees it
 * at once, without waiting for anything. */
extern "C" void pdx_kv_plan_free_cuda(struct pdx_kv_plan *p)
{
	cudaStream_t st;

	if (!p)
		return;
	if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) !=
	    cudaSuccess) {
		/* no stream to order the free on: synchronises the device */
		cudaFree(p->mem);
		free(p);
		return;
	}
	pdx__plan_free_on(p, st);
	cudaStreamDestroy(st);
}

extern "C" uint64_t pdx_kv_plan_segments(const struct pdx_kv_plan *p)
{
	return p ? p->segs : 0;
}

extern "C" uint64_t pdx_kv_plan_segment_bytes(const struct pdx_kv_plan *p)
{
	return p ? p->bb : 0;
}

static int in_range(const struct pdx_kv_plan *p, uint64_t first, uint64_t count)
{
	return p && first <= p->segs && count <= p->segs - first;
}

static pdx_status_t plan_move(const struct pdx_kv_plan *p, uint64_t first,
			      uint64_t count, uint8_t *staging, int scatter,
			      void *stream)
{
	if (!in_range(p, first, count) || (count && !staging))
		return PDX_EINVAL;
	if (!count)
		return PDX_OK;
	pdx__cuda_launch_begin();
	k_move<<<pdx__grid(count), PDX__THREADS, 0, (cudaStream_t)stream>>>(
	    p->dev, first, count, staging, p->bb,
	    pdx__unit(p->align | p->bb | (uint64_t)(uintptr_t)staging),
	    scatter);
	return pdx__cuda_launched();
}

extern "C" pdx_status_t pdx_kv_plan_gather_cuda(const struct pdx_kv_plan *p,
						uint64_t first, uint64_t count,
						void *staging, void *stream)
{
	return plan_move(p, first, count, (uint8_t *)staging, 0, stream);
}

extern "C" pdx_status_t pdx_kv_plan_scatter_cuda(const struct pdx_kv_plan *p,
						 uint64_t first, uint64_t count,
						 const void *staging,
						 void *stream)
{
	return plan_move(p, first, count, (uint8_t *)staging, 1, stream);
}

extern "C" pdx_status_t pdx_kv_plan_copy_cuda(const struct pdx_kv_plan *src,
					      const struct pdx_kv_plan *dst,
					      uint64_t first, uint64_t count,
					      void *stream)
{
	if (!src || !dst || src->segs != dst->segs || src->bb != dst->bb ||
	    !in_range(src, first, count))
		return PDX_EINVAL;
	if (!count)
		return PDX_OK;
	pdx__cuda_launch_begin();
	k_copy<<<pdx__grid(count), PDX__THREADS, 0, (cudaStream_t)stream>>>(
	    src->dev, dst->dev, first, count, src->bb,
	    pdx__unit(src->align | dst->align | src->bb));
	return pdx__cuda_launched();
}

extern "C" pdx_status_t
pdx_kv_plan_copy_piece_cuda(const struct pdx_kv_plan *src,
			    const struct pdx_kv_plan *dst,
			    const struct pdx_kv_piece *pc, uint64_t first,
			    uint64_t count, void *stream)
{
	if (!src || !dst || !pc || src->segs != dst->segs ||
	    !in_range(src, first, count) ||
	    !pdx_kv_piece_fits(pc, pc->src_off, pc->src_stride, pc->src_group,
			       src->bb) ||
	    !pdx_kv_piece_fits(pc, pc->dst_off, pc->dst_stride, pc->dst_group,
			       dst->bb))
		return PDX_EINVAL;
	if (!count)
		return PDX_OK;
	pdx__cuda_launch_begin();
	k_copy_piece<<<pdx__grid(count), PDX__THREADS, 0,
		       (cudaStream_t)stream>>>(
	    src->dev, dst->dev, *pc, first, count,
	    pdx__unit(src->align | dst->align | pc->src_off | pc->dst_off |
		      pc->len | pc->src_stride | pc->dst_stride |
		      pc->src_group | pc->dst_group));
	return pdx__cuda_launched();
}
