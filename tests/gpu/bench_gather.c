/* Gather/scatter bandwidth against cudaMemcpy D2D of the same bytes, on a
 * synthetic pool (docs/gpu.md, "Pending GPU measurements").
 *   bench_gather [layers] [block_tokens] [kv_heads] [head_dim] [blocks]
 * Prints one line per operation: GB/s of KV bytes moved. Exits 77 without
 * a GPU. */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "kernels/kv_kernels.h"

static double gbps(uint64_t bytes, float ms)
{
	return (double)bytes / (ms * 1e6);
}

int main(int argc, char **argv)
{
	uint32_t layers = argc > 1 ? atoi(argv[1]) : 32;
	uint32_t T = argc > 2 ? atoi(argv[2]) : 16;
	uint32_t H = argc > 3 ? atoi(argv[3]) : 8;
	uint32_t D = argc > 4 ? atoi(argv[4]) : 128;
	uint32_t blocks = argc > 5 ? atoi(argv[5]) : 2048, n = blocks / 2;
	struct pdx_kv_layer *ly = calloc(layers, sizeof(*ly));
	struct pdx_kv_layout l = { layers, 2, blocks, T, H, D, 2, PDX_KV_NHD,
				   ly };
	uint64_t bb = pdx_kv_layout_block_bytes(&l), len, pool;
	uint32_t *ids = malloc(n * sizeof(*ids));
	uint8_t *d[1], *st, *copy;
	struct pdx_kv_region kv = { &l, d, 1 };
	cudaEvent_t e0, e1;
	int count = 0, reps = 20;
	float ms;

	if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
		printf("no CUDA device: skipped\n");
		return 77;
	}
	pool = (uint64_t)layers * 2 * blocks * bb;
	len = (uint64_t)layers * 2 * n * bb;
	for (uint32_t i = 0; i < layers; i++) {
		ly[i].block_stride = bb;
		ly[i].base[0].offset = (uint64_t)(2 * i) * blocks * bb;
		ly[i].base[1].offset = (uint64_t)(2 * i + 1) * blocks * bb;
	}
	for (uint32_t i = 0; i < n; i++)
		ids[i] = (i * 7919u) % blocks; /* scattered, distinct */
	if (cudaMalloc((void **)&d[0], pool) || cudaMalloc((void **)&st, len) ||
	    cudaMalloc((void **)&copy, len)) {
		fprintf(stderr, "cudaMalloc failed\n");
		return 1;
	}
	cudaEventCreate(&e0);
	cudaEventCreate(&e1);
	printf("layers %u tokens %u heads %u dim %u blocks %u/%u: %.1f MiB\n",
	       layers, T, H, D, n, blocks, len / 1048576.0);
	pdx_kv_gather_cuda(&kv, ids, n, st, NULL);
#define TIME(name, call)                                                       \
	do {                                                                   \
		cudaEventRecord(e0, NULL);                                     \
		for (int r = 0; r < reps; r++)                                 \
			call;                                                  \
		cudaEventRecord(e1, NULL);                                     \
		cudaEventSynchronize(e1);                                      \
		cudaEventElapsedTime(&ms, e0, e1);                             \
		printf("%-10s %8.1f GB/s\n", name, gbps(len * reps, ms));      \
	} while (0)
	TIME("gather", pdx_kv_gather_cuda(&kv, ids, n, st, NULL));
	TIME("scatter", pdx_kv_scatter_cuda(&kv, ids, n, st, NULL));
	TIME("memcpy-d2d", cudaMemcpyAsync(copy, st, len,
					   cudaMemcpyDeviceToDevice, NULL));
	return 0;
}
