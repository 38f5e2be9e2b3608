/* CUDA: NHD <-> HND and head resharding (contracts in
 * kernels/kv_kernels.h). Threads walk (block, row, unit) with a grid-stride
 * loop; a row (one head of one token) moves whole, in units of the widest
 * size its length and addresses allow. */
#include "kernels/cuda_util.cuh"

#define MAX_TP 64

struct shards {
	const uint8_t *src[MAX_TP];
	uint8_t *dst[MAX_TP];
};

__device__ __forceinline__ uint64_t row_index(int order, uint32_t T,
					      uint32_t H, uint32_t n,
					      uint32_t h)
{
	return order == PDX_KV_NHD ? (uint64_t)n * H + h : (uint64_t)h * T + n;
}

template <typename U>
__global__ void k_permute(const uint8_t *src, uint8_t *dst, uint32_t T,
			  uint32_t H, uint64_t row, int from, uint64_t nblocks)
{
	uint64_t per_row = row / sizeof(U), rows = (uint64_t)T * H;
	uint64_t total = nblocks * rows * per_row, bb = rows * row;
	int to = from == PDX_KV_NHD ? PDX_KV_HND : PDX_KV_NHD;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     i < total; i += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t c = i % per_row, r = (i / per_row) % rows,
			 k = i / per_row / rows;
		/* r counts rows in the source order */
		uint32_t n = from == PDX_KV_NHD ? r / H : r % T;
		uint32_t h = from == PDX_KV_NHD ? r % H : r / T;

		((U *)(dst + k * bb +
		       row_index(to, T, H, n, h) * row))[c] =
			((const U *)(src + k * bb + r * row))[c];
	}
}

template <typename U>
__global__ void k_reshard(struct shards sh, uint32_t T, uint32_t H,
			  uint32_t ha, uint32_t hb, uint64_t row, int order,
			  uint64_t nblocks)
{
	uint64_t per_row = row / sizeof(U), rows = (uint64_t)T * H;
	uint64_t total = nblocks * rows * per_row;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     i < total; i += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t c = i % per_row, r = (i / per_row) % rows,
			 k = i / per_row / rows;
		uint32_t n = r / H, g = r % H;
		const uint8_t *in = sh.src[g / ha] + k * T * ha * row +
				    row_index(order, T, ha, n, g % ha) * row;
		uint8_t *out = sh.dst[g / hb] + k * T * hb * row +
			       row_index(order, T, hb, n, g % hb) * row;

		((U *)out)[c] = ((const U *)in)[c];
	}
}

static unsigned grid_for(uint64_t threads)
{
	return pdx__grid((threads + PDX__THREADS - 1) / PDX__THREADS);
}

/* launch(U()) with U the unsigned type of u bytes (16: uint4): both
 * kernels copy in the widest unit the alignment allows. */
template <typename Launch> static void by_unit(unsigned u, Launch launch)
{
	switch (u) {
	case 16: launch(uint4()); break;
	case 8: launch(uint64_t()); break;
	case 4: launch(uint32_t()); break;
	case 2: launch(uint16_t()); break;
	default: launch(uint8_t()); break;
	}
}

extern "C" pdx_status_t pdx_kv_permute_cuda(const struct pdx_kv_shape *s,
					    const void *src, void *dst,
					    uint64_t nblocks, void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	uint64_t row = (uint64_t)s->head_dim * s->dtype_bytes;
	uint64_t total = nblocks * s->block_tokens * s->kv_heads * row;
	unsigned u = pdx__unit(row | (uint64_t)(uintptr_t)src |
			       (uint64_t)(uintptr_t)dst);
	const uint8_t *in = (const uint8_t *)src;
	uint8_t *out = (uint8_t *)dst;

	if (!total)
		return PDX_OK;
	pdx__cuda_launch_begin();
	by_unit(u, [&](auto unit) {
		using U = decltype(unit);

		k_permute<U><<<grid_for(total / sizeof(U)), PDX__THREADS, 0,
			       st>>>(in, out, s->block_tokens, s->kv_heads, row,
				     s->order, nblocks);
	});
	return pdx__cuda_launched();
}

extern "C" pdx_status_t
pdx_kv_heads_reshard_cuda(const struct pdx_kv_shape *s, uint32_t a,
			  const void *const *src, uint32_t b, void *const *dst,
			  uint64_t nblocks, void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	uint32_t H = s->kv_heads;
	uint64_t row = (uint64_t)s->head_dim * s->dtype_bytes, bits = row;
	uint64_t total = nblocks * s->block_tokens * H * row;
	struct shards sh;
	unsigned u;

	if (!a || !b || a > MAX_TP || b > MAX_TP || H % a || H % b || !src ||
	    !dst)
		return PDX_EINVAL;
	for (uint32_t i = 0; i < a; i++) {
		sh.src[i] = (const uint8_t *)src[i];
		bits |= (uint64_t)(uintptr_t)src[i];
	}
	for (uint32_t i = 0; i < b; i++) {
		sh.dst[i] = (uint8_t *)dst[i];
		bits |= (uint64_t)(uintptr_t)dst[i];
	}
	if (!total)
		return PDX_OK;
	u = pdx__unit(bits);
	pdx__cuda_launch_begin();
	by_unit(u, [&](auto unit) {
		using U = decltype(unit);

		k_reshard<U><<<grid_for(total / sizeof(U)), PDX__THREADS, 0,
			       st>>>(sh, s->block_tokens, H, H / a, H / b, row,
				     s->order, nblocks);
	});
	return pdx__cuda_launched();
}
