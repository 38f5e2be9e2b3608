/* The synthetic model's CUDA kernels (engine/synth_cuda.h) against the
 * CPU reference (engine/synth_model.c) on random layouts and sequences:
 * the pool's bytes after a pass, byte for byte; the next tokens; the
 * check's count and lowest position after the same corruption on both.
 * Exits 77 (meson's "skipped") where there is no GPU. */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "engine/synth_cuda.h"
#include "engine/synth_model.h"
#include "tests/check.h"
#include "tests/gpu/gpu_skip.h"
#include "tests/rng.h"

#define MAX_SEQS 6

static struct test_rng rng = { 0x9e3779b97f4a7c15ULL };
static cudaStream_t stream;

static uint64_t rnd(void)
{
	return test_rnd(&rng);
}

static uint32_t pick(const uint32_t *v, int n)
{
	return test_pick(&rng, v, n);
}

struct pool {
	struct pdx_kv_layout l;
	struct pdx_kv_layer layer[8];
	uint64_t size;
	uint8_t *h, *d, *back;
};

struct seq {
	uint32_t len, *tokens, *blocks;
	uint64_t *hash;
};

/* A random NHD layout the synthetic model handles: slots of 8-byte
 * multiples, strides padded by whole words, tensors and layers apart by
 * random gaps; the same random bytes on host and device. */
static int pool_new(struct pool *p)
{
	static const uint32_t T[] = { 1, 3, 4, 16 }, H[] = { 1, 2, 8 },
			      D[] = { 4, 16, 64, 128 }, DT[] = { 1, 2, 4 },
			      PAD[] = { 0, 0, 8, 64 };
	uint64_t bb, off = 0;

	memset(p, 0, sizeof(*p));
	do {
		p->l.kv_heads = pick(H, 3);
		p->l.head_dim = pick(D, 4);
		p->l.dtype_bytes = pick(DT, 3);
	} while ((p->l.kv_heads * p->l.head_dim * p->l.dtype_bytes) % 8);
	p->l.layers = 1 + (uint32_t)(rnd() % 8);
	p->l.tensors = 1 + (uint32_t)(rnd() % 2);
	p->l.blocks = 8 + (uint32_t)(rnd() % 57);
	p->l.block_tokens = pick(T, 4);
	p->l.order = PDX_KV_NHD;
	p->l.layer = p->layer;
	bb = pdx_kv_layout_block_bytes(&p->l);
	for (uint32_t i = 0; i < p->l.layers; i++) {
		p->layer[i].block_stride = bb + pick(PAD, 4);
		for (uint32_t t = 0; t < p->l.tensors; t++) {
			p->layer[i].base[t] =
				(struct pdx_kv_ref){ .region = 0, .offset = off };
			off += (uint64_t)p->l.blocks * p->layer[i].block_stride +
			       pick(PAD, 4);
		}
	}
	p->size = off;
	p->h = malloc(p->size);
	p->back = malloc(p->size);
	if (!p->h || !p->back)
		return -1;
	for (uint64_t i = 0; i < p->size; i++)
		p->h[i] = (uint8_t)rnd();
	if (cudaMalloc((void **)&p->d, p->size) != cudaSuccess ||
	    cudaMemcpy(p->d, p->h, p->size, cudaMemcpyHostToDevice) !=
		    cudaSuccess)
		return -1;
	return 0;
}

static void pool_free(struct pool *p)
{
	cudaFree(p->d);
	free(p->h);
	free(p->back);
}

static int pool_same(struct pool *p)
{
	if (cudaMemcpy(p->back, p->d, p->size, cudaMemcpyDeviceToHost) !=
	    cudaSuccess)
		return 0;
	return memcmp(p->back, p->h, p->size) == 0;
}

/* Sequences of random lengths on disjoint random blocks of the pool. */
static uint32_t seqs_new(const struct pool *p, struct seq *s)
{
	uint32_t n = 1 + (uint32_t)(rnd() % MAX_SEQS), bt = p->l.block_tokens;
	uint32_t *perm = malloc(sizeof(*perm) * p->l.blocks), next = 0;

	for (uint32_t i = 0; i < p->l.blocks; i++)
		perm[i] = i;
	for (uint32_t i = p->l.blocks - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(rnd() % (i + 1)), x = perm[i];

		perm[i] = perm[j];
		perm[j] = x;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t nb = 1 + (uint32_t)(rnd() % (p->l.blocks / n));

		s[i].len = 1 + (uint32_t)(rnd() % (nb * bt));
		s[i].tokens = malloc(sizeof(uint32_t) * s[i].len);
		s[i].hash = malloc(sizeof(uint64_t) * s[i].len);
		s[i].blocks = malloc(sizeof(uint32_t) * nb);
		for (uint32_t k = 0; k < s[i].len; k++)
			s[i].tokens[k] = (uint32_t)(rnd() % 200000);
		pdx_synth_hashes(PDX_SYNTH_HASH_SEED, s[i].tokens, s[i].len,
				 s[i].hash);
		memcpy(s[i].blocks, perm + next, sizeof(uint32_t) * nb);
		next += nb;
	}
	free(perm);
	return n;
}

static void seqs_free(struct seq *s, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		free(s[i].tokens);
		free(s[i].hash);
		free(s[i].blocks);
	}
}

static struct pdx_synth_seq view(struct pool *p, struct seq *s)
{
	return (struct pdx_synth_seq){ .layout = &p->l, .base = p->h,
				       .blocks = s->blocks, .hash = s->hash };
}

/* One pass over runs on both sides: every layer filled, then tokens. */
static void pass(struct pool *p, struct pdx_synth_cuda *c, struct seq *s,
		 struct pdx_synth_run *runs, uint32_t n, uint32_t vocab)
{
	for (uint32_t l = 0; l < p->l.layers; l++) {
		for (uint32_t i = 0; i < n; i++) {
			struct pdx_synth_seq v = view(p, &s[i]);

			pdx_synth_fill(&v, l, runs[i].a, runs[i].b);
		}
	}
	CHECK_EQ(pdx_synth_cuda_stage(c, runs, n), PDX_OK);
	for (uint32_t l = 0; l < p->l.layers; l++)
		CHECK_EQ(pdx_synth_cuda_fill(c, l), PDX_OK);
	CHECK_EQ(pdx_synth_cuda_tokens(c, runs, n, vocab), PDX_OK);
	/* without tokens nothing waited for the fills */
	CHECK_EQ(cudaStreamSynchronize(stream), cudaSuccess);
	CHECK(pool_same(p));
	for (uint32_t i = 0; i < n; i++) {
		struct pdx_synth_seq v = view(p, &s[i]);

		if (runs[i].want_token)
			CHECK_EQ(runs[i].token,
				 pdx_synth_next_token(&v, runs[i].b, vocab));
	}
}

/* The CPU's answer for check(): positions of [a, b) that differ. */
static uint64_t cpu_mismatches(struct pool *p, struct seq *s, uint32_t a,
			       uint32_t b, uint32_t *lowest)
{
	struct pdx_synth_seq v = view(p, s);
	uint64_t n = 0;
	uint32_t bad;

	*lowest = UINT32_MAX;
	for (uint32_t q = a; q < b; q++) {
		if (pdx_synth_check(&v, q, q + 1, &bad))
			continue;
		n++;
		if (q < *lowest)
			*lowest = q;
	}
	return n;
}

/* Flips one random byte of a random filled slot of s, on both sides. */
static void corrupt(struct pool *p, struct seq *s)
{
	uint32_t q = (uint32_t)(rnd() % s->len), bt = p->l.block_tokens;
	uint32_t l = (uint32_t)(rnd() % p->l.layers);
	uint32_t t = (uint32_t)(rnd() % p->l.tensors);
	uint64_t slot = pdx_kv_layout_block_bytes(&p->l) / bt;
	uint64_t o = p->layer[l].base[t].offset +
		     (uint64_t)s->blocks[q / bt] * p->layer[l].block_stride +
		     (q % bt) * slot + rnd() % slot;

	p->h[o] ^= (uint8_t)(1 + rnd() % 255);
	CHECK_EQ(cudaMemcpy(p->d + o, p->h + o, 1, cudaMemcpyHostToDevice),
		 cudaSuccess);
}

static void one_layout(void)
{
	struct pdx_synth_run runs[MAX_SEQS];
	struct seq s[MAX_SEQS];
	struct pdx_synth_cuda *c = NULL;
	struct pool p;
	uint32_t n, vocab = 1 + (uint32_t)(rnd() % 150000), low, cpu_low;
	uint64_t bad;

	if (pool_new(&p)) {
		CHECK(!"pool");
		return;
	}
	CHECK_EQ(pdx_synth_cuda_new(&p.l, p.d, stream, &c), PDX_OK);
	if (!c)
		goto out;
	n = seqs_new(&p, s);
	/* a first chunk each (a prefill step), without tokens ... */
	for (uint32_t i = 0; i < n; i++)
		runs[i] = (struct pdx_synth_run){
			.blocks = s[i].blocks, .hash = s[i].hash, .a = 0,
			.b = (uint32_t)(rnd() % (s[i].len + 1)) };
	pass(&p, c, s, runs, n, vocab);
	/* ... the rest with the next token, as the last chunk or a decode
	 * step ... */
	for (uint32_t i = 0; i < n; i++) {
		runs[i].a = runs[i].b;
		runs[i].b = s[i].len;
		runs[i].want_token = true;
	}
	pass(&p, c, s, runs, n, vocab);
	/* ... and tokens of shorter prefixes, writing nothing */
	for (uint32_t i = 0; i < n; i++) {
		runs[i].b = 1 + (uint32_t)(rnd() % s[i].len);
		runs[i].a = runs[i].b;
		runs[i].want_token = rnd() % 2;
	}
	pass(&p, c, s, runs, n, vocab);

	/* the check: clean, then after the same corruption on both sides */
	for (uint32_t i = 0; i < n; i++) {
		runs[i] = (struct pdx_synth_run){
			.blocks = s[i].blocks, .hash = s[i].hash, .a = 0,
			.b = s[i].len };
		CHECK_EQ(pdx_synth_cuda_stage(c, &runs[i], 1), PDX_OK);
		CHECK_EQ(pdx_synth_cuda_check(c, &bad, &low), PDX_OK);
		CHECK_EQ(bad, 0);
		CHECK_EQ(low, UINT32_MAX);
		for (uint64_t k = rnd() % 4; k > 0; k--)
			corrupt(&p, &s[i]);
		runs[i].a = (uint32_t)(rnd() % s[i].len);
		CHECK_EQ(pdx_synth_cuda_stage(c, &runs[i], 1), PDX_OK);
		CHECK_EQ(pdx_synth_cuda_check(c, &bad, &low), PDX_OK);
		CHECK_EQ(bad, cpu_mismatches(&p, &s[i], runs[i].a, runs[i].b,
					     &cpu_low));
		CHECK_EQ(low, cpu_low);
	}

	/* a block id outside the pool is refused before anything runs */
	s[0].blocks[0] = p.l.blocks;
	runs[0] = (struct pdx_synth_run){ .blocks = s[0].blocks,
					  .hash = s[0].hash, .a = 0, .b = 1 };
	CHECK_EQ(pdx_synth_cuda_stage(c, runs, 1), PDX_ERANGE);
	seqs_free(s, n);
out:
	pdx_synth_cuda_free(c);
	pool_free(&p);
}

int main(void)
{
	int devices = 0, gate;

	gate = gpu_test_gate(cudaGetDeviceCount(&devices), devices);
	if (gate)
		return gate;
	if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) !=
	    cudaSuccess)
		return 1;
	for (int i = 0; i < 100; i++)
		one_layout();
	cudaStreamDestroy(stream);
	CHECK_DONE();
}
