/* Plan gather, scatter and pool-to-pool copy, and the host staging path,
 * each against the cudaMemcpy of the same bytes that bounds it, on a
 * synthetic pool (docs/gpu.md, "GPU measurements").
 *   bench_gather [--json] [layers] [block_tokens] [kv_heads] [head_dim]
 *                [blocks]
 * Defaults: llama3-8b (32 layers, 16 tokens, 8 KV heads, 128 dim, 2-byte
 * dtype, K and V), 1024 scattered blocks of a 2048-block pool. Each time is
 * the median of REPS runs after WARMUP, timed with CUDA events; GB/s count
 * the KV bytes moved once. Prints a table, or with --json one JSON object.
 * Exits 77 without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels/kv_kernels.h"

#define WARMUP 3
#define REPS 20

struct bench {
	struct pdx_kv_plan *a, *b; /* the same count of blocks in pools A, B */
	uint8_t *st, *copy;        /* device staging, a second buffer */
	uint8_t *host;             /* pinned host staging */
	uint64_t len, per;         /* bytes; segments a layer */
	uint32_t layers;
	cudaStream_t s;
};

static int plan_gather(struct bench *b)
{
	return pdx_kv_plan_gather_cuda(b->a, 0, pdx_kv_plan_segments(b->a),
				       b->st, b->s);
}

/* one launch per layer, as the agent will issue them */
static int plan_gather_layers(struct bench *b)
{
	uint64_t bb = pdx_kv_plan_segment_bytes(b->a);

	for (uint32_t l = 0; l < b->layers; l++)
		if (pdx_kv_plan_gather_cuda(b->a, l * b->per, b->per,
					    b->st + l * b->per * bb, b->s))
			return -1;
	return 0;
}

static int plan_scatter(struct bench *b)
{
	return pdx_kv_plan_scatter_cuda(b->a, 0, pdx_kv_plan_segments(b->a),
					b->st, b->s);
}

static int plan_copy(struct bench *b)
{
	return pdx_kv_plan_copy_cuda(b->a, b->b, 0, pdx_kv_plan_segments(b->a),
				     b->s);
}

static int memcpy_d2d(struct bench *b)
{
	return cudaMemcpyAsync(b->copy, b->st, b->len, cudaMemcpyDeviceToDevice,
			       b->s) != cudaSuccess;
}

static int gather_d2h(struct bench *b)
{
	return plan_gather(b) || cudaMemcpyAsync(b->host, b->st, b->len,
						 cudaMemcpyDeviceToHost,
						 b->s) != cudaSuccess;
}

static int memcpy_d2h(struct bench *b)
{
	return cudaMemcpyAsync(b->host, b->st, b->len, cudaMemcpyDeviceToHost,
			       b->s) != cudaSuccess;
}

static int h2d_scatter(struct bench *b)
{
	return cudaMemcpyAsync(b->st, b->host, b->len, cudaMemcpyHostToDevice,
			       b->s) != cudaSuccess ||
	       plan_scatter(b);
}

static int memcpy_h2d(struct bench *b)
{
	return cudaMemcpyAsync(b->st, b->host, b->len, cudaMemcpyHostToDevice,
			       b->s) != cudaSuccess;
}

/* The first NYARD are the yardsticks the others are held to. */
#define NYARD 3
static const struct op {
	const char *name, *label;
	int (*run)(struct bench *b);
	int yardstick; /* index into ops[] */
} ops[] = {
	{ "memcpy_d2d", "memcpy d2d", memcpy_d2d, 0 },
	{ "memcpy_d2h", "d2h pinned", memcpy_d2h, 1 },
	{ "memcpy_h2d", "h2d pinned", memcpy_h2d, 2 },
	{ "plan_gather", "plan gather", plan_gather, 0 },
	{ "plan_gather_layers", "plan gather, per layer", plan_gather_layers,
	  0 },
	{ "plan_scatter", "plan scatter", plan_scatter, 0 },
	{ "plan_copy", "plan copy pool->pool", plan_copy, 0 },
	{ "gather_d2h", "plan gather + d2h pinned", gather_d2h, 1 },
	{ "h2d_scatter", "h2d pinned + plan scatter", h2d_scatter, 2 },
};
#define NOPS (sizeof(ops) / sizeof(ops[0]))

static int cmp_float(const void *x, const void *y)
{
	float a = *(const float *)x, b = *(const float *)y;

	return (a > b) - (a < b);
}

/* Median milliseconds of one run of op, or -1 on a failure. */
static float time_op(struct bench *b, const struct op *op)
{
	cudaEvent_t e0, e1;
	float ms[REPS], med = -1;
	int r;

	cudaEventCreate(&e0);
	cudaEventCreate(&e1);
	for (r = 0; r < WARMUP; r++)
		if (op->run(b))
			goto out;
	for (r = 0; r < REPS; r++) {
		cudaEventRecord(e0, b->s);
		if (op->run(b))
			goto out;
		cudaEventRecord(e1, b->s);
		if (cudaEventSynchronize(e1) != cudaSuccess ||
		    cudaEventElapsedTime(&ms[r], e0, e1) != cudaSuccess)
			goto out;
	}
	qsort(ms, REPS, sizeof(ms[0]), cmp_float);
	med = (ms[REPS / 2 - 1] + ms[REPS / 2]) / 2;
out:
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	return med;
}

/* A pool of `blocks` blocks in one region: layer l's K then V, unpadded. */
static uint8_t *pool_new(struct pdx_kv_layout *l, uint64_t bb)
{
	uint8_t *d = NULL;

	for (uint32_t i = 0; i < l->layers; i++) {
		l->layer[i].block_stride = bb;
		l->layer[i].base[0].offset = (uint64_t)(2 * i) * l->blocks * bb;
		l->layer[i].base[1].offset =
			(uint64_t)(2 * i + 1) * l->blocks * bb;
	}
	if (cudaMalloc((void **)&d, (uint64_t)l->layers * 2 * l->blocks * bb))
		return NULL;
	cudaMemset(d, 1, (uint64_t)l->layers * 2 * l->blocks * bb);
	return d;
}

static void print(const struct pdx_kv_layout *l, uint32_t n,
		  const struct bench *b, const char *dev, const float *ms,
		  int json)
{
	double gbps[NOPS];

	for (size_t i = 0; i < NOPS; i++)
		gbps[i] = (double)b->len / (ms[i] * 1e6);
	if (json) {
		printf("{\"device\": \"%s\", \"layers\": %u, \"tensors\": 2, "
		       "\"block_tokens\": %u, \"kv_heads\": %u, \"head_dim\": %u, "
		       "\"dtype_bytes\": %u, \"blocks\": %u, \"pool_blocks\": %u, "
		       "\"block_bytes\": %llu, \"bytes\": %llu, \"reps\": %d, "
		       "\"gbps\": {",
		       dev, l->layers, l->block_tokens, l->kv_heads,
		       l->head_dim, l->dtype_bytes, n, l->blocks,
		       (unsigned long long)pdx_kv_layout_block_bytes(l),
		       (unsigned long long)b->len, REPS);
		for (size_t i = 0; i < NOPS; i++)
			printf("%s\"%s\": %.2f", i ? ", " : "", ops[i].name,
			       gbps[i]);
		printf("}, \"ratio\": {");
		for (size_t i = NYARD; i < NOPS; i++)
			printf("%s\"%s\": %.4f", i > NYARD ? ", " : "",
			       ops[i].name,
			       gbps[i] / gbps[ops[i].yardstick]);
		printf("}}\n");
		return;
	}
	printf("%s: %u layers, %u tokens, %u heads, %u dim, %u-byte dtype; "
	       "%u of %u blocks (%.1f KiB each), %.1f MiB; median of %d\n",
	       dev, l->layers, l->block_tokens, l->kv_heads, l->head_dim,
	       l->dtype_bytes, n, l->blocks,
	       pdx_kv_layout_block_bytes(l) / 1024.0, b->len / 1048576.0, REPS);
	printf("%-26s %9s   %-12s %9s  %6s\n", "operation", "GB/s", "yardstick",
	       "GB/s", "ratio");
	for (size_t i = NYARD; i < NOPS; i++) {
		int y = ops[i].yardstick;

		printf("%-26s %9.1f   %-12s %9.1f  %6.3f\n", ops[i].label,
		       gbps[i], ops[y].label, gbps[y], gbps[i] / gbps[y]);
	}
}

int main(int argc, char **argv)
{
	uint32_t arg[5] = { 32, 16, 8, 128, 2048 }, nargs = 0, n;
	struct pdx_kv_layout la, lb;
	struct bench b = { 0 };
	uint8_t *da[1], *db[1];
	struct pdx_kv_region kva = { &la, da, 1 }, kvb = { &lb, db, 1 };
	struct cudaDeviceProp prop;
	uint32_t *ia, *ib;
	float ms[NOPS];
	int count = 0, json = 0;
	uint64_t bb;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			json = 1;
		else if (nargs < 5 && atoi(argv[i]) > 0)
			arg[nargs++] = (uint32_t)atoi(argv[i]);
		else {
			fprintf(stderr, "usage: %s [--json] [layers] [block_tokens] "
					"[kv_heads] [head_dim] [blocks]\n",
				argv[0]);
			return 2;
		}
	}
	if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
		printf("no CUDA device: skipped\n");
		return 77;
	}
	la = (struct pdx_kv_layout){ arg[0], 2, arg[4], arg[1], arg[2], arg[3],
				     2, PDX_KV_NHD, NULL };
	if (la.layers > PDX_MAX_LAYERS || la.blocks < 2) {
		fprintf(stderr, "1..%d layers, 2 or more blocks\n",
			PDX_MAX_LAYERS);
		return 2;
	}
	la.layer = calloc(la.layers, sizeof(*la.layer));
	lb = la;
	lb.layer = calloc(lb.layers, sizeof(*lb.layer));
	n = la.blocks / 2;
	ia = malloc(n * sizeof(*ia));
	ib = malloc(n * sizeof(*ib));
	/* scattered and distinct (7919 is prime); B's differ from A's */
	for (uint32_t i = 0; i < n; i++) {
		ia[i] = (uint32_t)(((uint64_t)i * 7919) % la.blocks);
		ib[i] = (uint32_t)(((uint64_t)i * 7919 + 1) % la.blocks);
	}
	bb = pdx_kv_layout_block_bytes(&la);
	b.layers = la.layers;
	b.per = 2ULL * n;
	b.len = la.layers * b.per * bb;
	da[0] = pool_new(&la, bb);
	db[0] = pool_new(&lb, bb);
	if (!da[0] || !db[0] || cudaMalloc((void **)&b.st, b.len) ||
	    cudaMalloc((void **)&b.copy, b.len) ||
	    cudaMallocHost((void **)&b.host, b.len) ||
	    cudaStreamCreateWithFlags(&b.s, cudaStreamNonBlocking)) {
		fprintf(stderr, "allocation failed\n");
		return 1;
	}
	if (pdx_kv_plan_new_cuda(&kva, ia, n, &b.a) ||
	    pdx_kv_plan_new_cuda(&kvb, ib, n, &b.b)) {
		fprintf(stderr, "pdx_kv_plan_new_cuda failed\n");
		return 1;
	}
	for (size_t i = 0; i < NOPS; i++) {
		ms[i] = time_op(&b, &ops[i]);
		if (ms[i] < 0) {
			fprintf(stderr, "%s failed\n", ops[i].name);
			return 1;
		}
	}
	cudaGetDeviceProperties(&prop, 0);
	print(&la, n, &b, prop.name, ms, json);
	cudaStreamSynchronize(b.s);
	pdx_kv_plan_free_cuda(b.a);
	pdx_kv_plan_free_cuda(b.b);
	return 0;
}
