/* CUDA: block hashes of a contiguous buffer (definition in
 * kernels/kv_kernels.h). One CTA per block sums its words' terms; the sum
 * is modulo 2^64, so the reduction order does not change the result. */
#include <stdlib.h>

#include "kernels/cuda_util.cuh"

__global__ void k_hashes(const uint8_t *buf, uint64_t bb, uint64_t nblocks,
			 int aligned8, uint64_t *out)
{
	__shared__ uint64_t part[PDX__THREADS];

	for (uint64_t k = blockIdx.x; k < nblocks; k += gridDim.x) {
		const uint8_t *p = buf + k * bb;
		uint64_t sum = 0;

		for (uint64_t w = threadIdx.x; w * 8 < bb; w += blockDim.x) {
			uint64_t word = 0;

			if (aligned8 && w * 8 + 8 <= bb) {
				word = ((const uint64_t *)p)[w];
			} else {
				for (uint64_t j = 0; j < 8 && w * 8 + j < bb; j++)
					word |= (uint64_t)p[w * 8 + j] << (8 * j);
			}
			sum += pdx__dmix64(word + w * 0x9e3779b97f4a7c15ULL);
		}
		sum = pdx__cta_sum(part, sum);
		if (threadIdx.x == 0)
			out[k] = pdx__dmix64(bb) + sum;
		__syncthreads();
	}
}

extern "C" pdx_status_t pdx_kv_buf_hashes_cuda(const void *buf,
					       uint64_t block_bytes,
					       uint64_t nblocks, uint64_t *out,
					       void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	uint64_t *d = NULL;
	pdx_status_t rc;
	int aligned8 = !(((uint64_t)(uintptr_t)buf | block_bytes) & 7);

	if (!nblocks)
		return PDX_OK;
	PDX_CUDA_TRY(cudaMallocAsync((void **)&d, nblocks * 8, st));
	pdx__cuda_launch_begin();
	k_hashes<<<pdx__grid(nblocks), PDX__THREADS, 0, st>>>(
		(const uint8_t *)buf, block_bytes, nblocks, aligned8, d);
	rc = pdx__cuda_launched();
	if (!rc && (cudaMemcpyAsync(out, d, nblocks * 8, cudaMemcpyDeviceToHost,
				    st) != cudaSuccess ||
		    cudaStreamSynchronize(st) != cudaSuccess))
		rc = PDX_EIO;
	cudaFreeAsync(d, st);
	if (!rc && cudaStreamSynchronize(st) != cudaSuccess)
		rc = PDX_EIO;
	return rc;
}
