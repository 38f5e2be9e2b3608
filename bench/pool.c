/* KV pools tracked for cleanup, the data pattern and block picking. */
#include "bench/pdx_bench.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pb_pool_create(struct pdx_shm_pool *p, const char *shm_name,
		   const struct pdx_model *m, uint32_t blocks)
{
	char err[256];

	/* tracked before it exists, so a signal mid-way still unlinks it */
	pb_track_shm(shm_name);
	if (pdx_shm_pool_create(p, shm_name, m, blocks, err, sizeof(err))) {
		pb_untrack_shm(shm_name);
		fprintf(stderr, "pool: %s\n", err);
		return -1;
	}
	return 0;
}

void pb_pool_destroy(struct pdx_shm_pool *p)
{
	if (p->name[0])
		pb_untrack_shm(p->name);
	pdx_shm_pool_destroy(p);
}

/* ---- the pattern ---- */


/* The first word of token-block idx of (layer, tensor) of transfer seed;
 * word w of the block is key + w * PDX_GOLDEN_STEP. */
static inline uint64_t block_key(uint64_t seed, uint32_t layer, uint32_t tensor,
				 size_t idx)
{
	return pdx_mix64(seed ^ pdx_mix64((uint64_t)idx | (uint64_t)layer << 32 |
				  (uint64_t)tensor << 48));
}

static void fill_words(uint64_t *w, size_t n, uint64_t key)
{
	for (size_t i = 0; i < n; i++)
		w[i] = key + i * PDX_GOLDEN_STEP;
}

void pb_fill(const struct pdx_shm_pool *p, uint64_t seed,
	     const uint32_t *blocks, size_t n, size_t first)
{
	size_t words = p->block_bytes / 8;

	for (uint32_t l = 0; l < p->layout.layers; l++)
		for (uint32_t t = 0; t < p->layout.tensors; t++)
			for (size_t i = first; i < n; i++)
				fill_words((uint64_t *)pdx_shm_pool_block(
					   p, l, t, blocks[i]),
					   words, block_key(seed, l, t, i));
}

void pb_poison(const struct pdx_shm_pool *p, const uint32_t *blocks, size_t n,
	       size_t first)
{
	for (uint32_t l = 0; l < p->layout.layers; l++)
		for (uint32_t t = 0; t < p->layout.tensors; t++)
			for (size_t i = first; i < n; i++)
				memset(pdx_shm_pool_block(p, l, t, blocks[i]),
				       0, p->block_bytes);
}

/* OR of the differences: zero when the block matches (vectorizes). */
static uint64_t diff_words(const uint64_t *w, size_t n, uint64_t key)
{
	uint64_t d = 0;

	for (size_t i = 0; i < n; i++)
		d |= w[i] ^ (key + i * PDX_GOLDEN_STEP);
	return d;
}

int pb_verify(const struct pdx_shm_pool *p, uint64_t seed,
	      const uint32_t *blocks, size_t n, size_t first, char *err,
	      size_t errlen)
{
	size_t words = p->block_bytes / 8;

	for (uint32_t l = 0; l < p->layout.layers; l++) {
		for (uint32_t t = 0; t < p->layout.tensors; t++) {
			for (size_t i = first; i < n; i++) {
				const uint64_t *w =
					(const uint64_t *)pdx_shm_pool_block(
						p, l, t, blocks[i]);
				uint64_t key = block_key(seed, l, t, i);

				if (!diff_words(w, words, key))
					continue;
				for (size_t k = 0; k < words; k++) {
					uint64_t want = key + k * PDX_GOLDEN_STEP;

					if (w[k] == want)
						continue;
					snprintf(err, errlen,
						 "layer %u tensor %u token-block %zu (pool block %u) byte offset %zu: got 0x%016" PRIx64
						 " want 0x%016" PRIx64,
						 l, t, i, blocks[i], k * 8, w[k],
						 want);
					return -1;
				}
			}
		}
	}
	return 0;
}

uint64_t pb_runs(const uint32_t *src, const uint32_t *dst, size_t n)
{
	uint64_t runs = n ? 1 : 0;

	for (size_t i = 1; i < n; i++)
		if (src[i] != src[i - 1] + 1 || dst[i] != dst[i - 1] + 1)
			runs++;
	return runs;
}

void pb_pick_blocks(uint32_t *out, size_t n, uint32_t pool_blocks, bool random,
		    uint64_t *rng)
{
	uint32_t *all;

	if (!random || n > pool_blocks) {
		for (size_t i = 0; i < n; i++)
			out[i] = (uint32_t)i;
		return;
	}
	all = malloc((size_t)pool_blocks * sizeof(*all));
	if (!all) {
		for (size_t i = 0; i < n; i++)
			out[i] = (uint32_t)i;
		return;
	}
	for (uint32_t i = 0; i < pool_blocks; i++)
		all[i] = i;
	/* partial Fisher-Yates: the first n are a uniform random subset */
	for (size_t i = 0; i < n; i++) {
		size_t j = i + pdx_splitmix64(rng) % (pool_blocks - i);
		uint32_t t = all[i];

		all[i] = all[j];
		all[j] = t;
		out[i] = all[i];
	}
	free(all);
}
