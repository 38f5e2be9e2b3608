/* Each CUDA kernel (kernels/<name>.cu) against its CPU reference on random
 * layouts: same inputs, byte-for-byte the same outputs. Exits 77 (meson's
 * "skipped") where there is no GPU. */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels/kv_kernels.h"
#include "tests/check.h"

static uint64_t rng = 0x2545f4914f6cdd1dULL;

static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static uint32_t pick(const uint32_t *v, int n)
{
	return v[rnd() % (uint64_t)n];
}

/* A random layout in two regions, the same bytes on host and device. */
struct pool {
	struct pdx_kv_layout l;
	struct pdx_kv_layer layer[16];
	uint64_t size;
	uint8_t *h[2], *d[2];
	struct pdx_kv_region hkv, dkv;
};

static int pool_new(struct pool *p)
{
	static const uint32_t T[] = { 1, 3, 16, 32 }, H[] = { 1, 2, 4, 8 },
			      D[] = { 1, 7, 64, 128 }, DT[] = { 1, 2, 4 },
			      PAD[] = { 0, 0, 16, 5 };
	uint64_t bb, off = 0;

	memset(p, 0, sizeof(*p));
	p->l.layers = 1 + (uint32_t)(rnd() % 16);
	p->l.tensors = 1 + (uint32_t)(rnd() % 2);
	p->l.blocks = 1 + (uint32_t)(rnd() % 40);
	p->l.block_tokens = pick(T, 4);
	p->l.kv_heads = pick(H, 4);
	p->l.head_dim = pick(D, 4);
	p->l.dtype_bytes = pick(DT, 3);
	p->l.order = (enum pdx_kv_order)(rnd() % 2);
	p->l.layer = p->layer;
	bb = pdx_kv_layout_block_bytes(&p->l);
	for (uint32_t i = 0; i < p->l.layers; i++) {
		p->layer[i].block_stride = bb + pick(PAD, 4);
		for (uint32_t t = 0; t < p->l.tensors; t++)
			p->layer[i].base[t] =
				(struct pdx_kv_ref){ .region = t, .offset = off };
		off += (uint64_t)p->l.blocks * p->layer[i].block_stride;
	}
	p->size = off;
	for (int r = 0; r < 2; r++) {
		p->h[r] = malloc(p->size);
		for (uint64_t i = 0; i < p->size; i++)
			p->h[r][i] = (uint8_t)rnd();
		if (cudaMalloc((void **)&p->d[r], p->size) != cudaSuccess ||
		    cudaMemcpy(p->d[r], p->h[r], p->size,
			       cudaMemcpyHostToDevice) != cudaSuccess)
			return -1;
	}
	p->hkv = (struct pdx_kv_region){ &p->l, p->h, 2 };
	p->dkv = (struct pdx_kv_region){ &p->l, p->d, 2 };
	return 0;
}

/* Device regions equal host ones, byte for byte. */
static int pool_same(struct pool *p)
{
	uint8_t *x = malloc(p->size);
	int same = 1;

	for (int r = 0; r < 2; r++) {
		cudaMemcpy(x, p->d[r], p->size, cudaMemcpyDeviceToHost);
		same &= !memcmp(x, p->h[r], p->size);
	}
	free(x);
	return same;
}

static void pool_free(struct pool *p)
{
	for (int r = 0; r < 2; r++) {
		free(p->h[r]);
		cudaFree(p->d[r]);
	}
}

static int dev_same(const void *d, const void *h, uint64_t len)
{
	uint8_t *x = malloc(len ? len : 1);
	int same;

	cudaMemcpy(x, d, len, cudaMemcpyDeviceToHost);
	same = !memcmp(x, h, len);
	free(x);
	return same;
}

static void one_layout(int round)
{
	struct pool p;
	uint32_t ids[40], n;
	uint64_t bb, nb, len, seed = rnd();
	uint8_t *hs, *ds, *hp, *dp;
	uint64_t *h1, *h2;
	struct pdx_kv_shape s;

	if (pool_new(&p)) {
		CHECK(!"device allocation");
		return;
	}
	n = 1 + (uint32_t)(rnd() % p.l.blocks);
	for (uint32_t i = 0; i < n; i++)
		ids[i] = (uint32_t)(rnd() % p.l.blocks); /* repeats allowed */
	bb = pdx_kv_layout_block_bytes(&p.l);
	nb = (uint64_t)p.l.layers * p.l.tensors * n;
	len = nb * bb;
	hs = malloc(len);
	hp = malloc(len);
	h1 = malloc(nb * 8);
	h2 = malloc(nb * 8);
	cudaMalloc((void **)&ds, len);
	cudaMalloc((void **)&dp, len);

	/* gather */
	CHECK_EQ(pdx_kv_gather_cpu(&p.hkv, ids, n, hs), PDX_OK);
	CHECK_EQ(pdx_kv_gather_cuda(&p.dkv, ids, n, ds, NULL), PDX_OK);
	cudaDeviceSynchronize();
	CHECK(dev_same(ds, hs, len));
	/* hashes of the staging buffer */
	pdx_kv_buf_hashes_cpu(hs, bb, nb, h1);
	CHECK_EQ(pdx_kv_buf_hashes_cuda(ds, bb, nb, h2, NULL), PDX_OK);
	CHECK(!memcmp(h1, h2, nb * 8));
	/* fill, then scatter the gathered bytes back over it (distinct ids
	 * only, so the last writer of a repeated id cannot differ) */
	CHECK_EQ(pdx_kv_fill_cpu(&p.hkv, ids, n, seed), PDX_OK);
	CHECK_EQ(pdx_kv_fill_cuda(&p.dkv, ids, n, seed, NULL), PDX_OK);
	cudaDeviceSynchronize();
	CHECK(pool_same(&p));
	CHECK_EQ(pdx_kv_scatter_cpu(&p.hkv, ids, 1, hs), PDX_OK);
	CHECK_EQ(pdx_kv_scatter_cuda(&p.dkv, ids, 1, ds, NULL), PDX_OK);
	cudaDeviceSynchronize();
	CHECK(pool_same(&p));
	/* permute the staging buffer */
	s = pdx_kv_shape_of(&p.l);
	pdx_kv_permute_cpu(&s, hs, hp, nb);
	CHECK_EQ(pdx_kv_permute_cuda(&s, ds, dp, nb, NULL), PDX_OK);
	cudaDeviceSynchronize();
	CHECK(dev_same(dp, hp, len));
	/* reshard: split into every divisor, and 2 -> 4 / 4 -> 2 */
	for (uint32_t parts = 2; parts <= s.kv_heads; parts *= 2) {
		void *hsh[8], *dsh[8];
		uint64_t sl = len / parts;

		for (uint32_t i = 0; i < parts; i++) {
			hsh[i] = malloc(sl);
			cudaMalloc(&dsh[i], sl);
		}
		CHECK_EQ(pdx_kv_heads_split_cpu(&s, hs, parts, hsh, nb), PDX_OK);
		CHECK_EQ(pdx_kv_heads_reshard_cuda(&s, 1,
						   (const void *const *)&ds,
						   parts, dsh, nb, NULL),
			 PDX_OK);
		cudaDeviceSynchronize();
		for (uint32_t i = 0; i < parts; i++)
			CHECK(dev_same(dsh[i], hsh[i], sl));
		CHECK_EQ(pdx_kv_heads_reshard_cuda(&s, parts,
						   (const void *const *)dsh, 1,
						   (void *const *)&dp, nb, NULL),
			 PDX_OK);
		cudaDeviceSynchronize();
		CHECK(dev_same(dp, hs, len));
		for (uint32_t i = 0; i < parts; i++) {
			free(hsh[i]);
			cudaFree(dsh[i]);
		}
	}
	if (check_failures)
		fprintf(stderr,
			"round %d: layers %u tensors %u blocks %u T %u H %u D %u dt %u order %d n %u\n",
			round, p.l.layers, p.l.tensors, p.l.blocks,
			p.l.block_tokens, p.l.kv_heads, p.l.head_dim,
			p.l.dtype_bytes, p.l.order, n);
	free(hs);
	free(hp);
	free(h1);
	free(h2);
	cudaFree(ds);
	cudaFree(dp);
	pool_free(&p);
}

int main(void)
{
	int count = 0;

	if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
		printf("no CUDA device: skipped\n");
		return 77;
	}
	for (int i = 0; i < 200 && !check_failures; i++)
		one_layout(i);
	CHECK_DONE();
}
