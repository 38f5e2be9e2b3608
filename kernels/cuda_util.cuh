/* Internal to kernels/<name>.cu: error mapping, the device twin of
 * pdx_kv_mix64(), and copies in the widest unit the alignment allows. */
#ifndef PDX_KERNELS_CUDA_UTIL_CUH
#define PDX_KERNELS_CUDA_UTIL_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/kv_kernels.h"

#define PDX_CUDA_TRY(call)                                                     \
	do {                                                                   \
		if ((call) != cudaSuccess)                                     \
			return PDX_EIO;                                        \
	} while (0)

/* Called just before a launch. The runtime keeps the last error of any
 * call on this thread until something reads it, so without this a call
 * that failed earlier (cudaIpcOpenMemHandle refused, the agent then going
 * by staged; an unregister of memory never registered) would be taken
 * for the launch's own failure by pdx__cuda_launched(), though the kernel
 * was queued and runs. A sticky error (a faulted context) is not cleared
 * by reading it and still fails the launch. */
static inline void pdx__cuda_launch_begin(void)
{
	(void)cudaGetLastError();
}

/* Launched kernels report through the stream; this catches bad launches
 * (after pdx__cuda_launch_begin()). */
static inline pdx_status_t pdx__cuda_launched(void)
{
	return cudaGetLastError() == cudaSuccess ? PDX_OK : PDX_EIO;
}

__device__ __forceinline__ uint64_t pdx__dmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* Every thread of the CTA adds its v; thread 0 gets the sum (others get
 * part of it). part holds blockDim.x words, a power of two. The caller
 * synchronises again before reusing part. */
__device__ __forceinline__ uint64_t pdx__cta_sum(uint64_t *part, uint64_t v)
{
	part[threadIdx.x] = v;
	__syncthreads();
	for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
		if (threadIdx.x < s)
			part[threadIdx.x] += part[threadIdx.x + s];
		__syncthreads();
	}
	return part[0];
}

/* The largest of 16, 8, 4, 2, 1 that divides every bit of `bits`. */
static inline unsigned pdx__unit(uint64_t bits)
{
	unsigned u = 16;

	while (u > 1 && (bits & (u - 1)))
		u >>= 1;
	return u;
}

/* Copies len bytes with the threads of one CTA; unit divides len and both
 * addresses. */
__device__ __forceinline__ void pdx__cta_copy(uint8_t *dst, const uint8_t *src,
					      uint64_t len, unsigned unit)
{
	switch (unit) {
	case 16:
		for (uint64_t i = threadIdx.x; i < len / 16; i += blockDim.x)
			((uint4 *)dst)[i] = ((const uint4 *)src)[i];
		break;
	case 8:
		for (uint64_t i = threadIdx.x; i < len / 8; i += blockDim.x)
			((uint64_t *)dst)[i] = ((const uint64_t *)src)[i];
		break;
	case 4:
		for (uint64_t i = threadIdx.x; i < len / 4; i += blockDim.x)
			((uint32_t *)dst)[i] = ((const uint32_t *)src)[i];
		break;
	default:
		for (uint64_t i = threadIdx.x; i < len; i += blockDim.x)
			dst[i] = src[i];
	}
}

#define PDX__THREADS 256
#define PDX__MAX_GRID (1u << 20)

static inline unsigned pdx__grid(uint64_t ctas)
{
	return ctas < PDX__MAX_GRID ? (unsigned)(ctas ? ctas : 1) :
				      PDX__MAX_GRID;
}

#endif
