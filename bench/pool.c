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

/* Word w of token-block idx of (layer, tensor) of transfer seed, in the
 * block of all the model's KV heads (TP 1) laid out NHD, is key + w *
 * PDX_GOLDEN_STEP, key = block_key(). A rank of TP n holds some heads of
 * that block, in either order: its words are the same values at the same
 * global head and token, so the bytes a prefill rank sends for head h of
 * token t are the bytes any decode rank expects for them, whatever the
 * two TP sizes and orders. */
static inline uint64_t block_key(uint64_t seed, uint32_t layer, uint32_t tensor,
				 size_t idx)
{
	return pdx_mix64(seed ^ pdx_mix64((uint64_t)idx | (uint64_t)layer << 32 |
				  (uint64_t)tensor << 48));
}

/* Where a rank's block lies in the full NHD one: `groups` of `runs` runs
 * of `len` words, run (g, k) at local word g * local_group + k *
 * local_step and full word first + g * full_group + k * full_step. */
struct slice {
	size_t groups, runs, len;
	size_t local_group, local_step, full_group, full_step, first;
};

/* MLA (one tensor) is on every rank whole. Heads that are not whole
 * words (TP 1 only) are the block's words in its own order. */
static struct slice slice_of(const struct pdx_shm_pool *p, uint32_t rank,
			     uint32_t tp)
{
	const struct pdx_kv_layout *l = &p->layout;
	size_t bytes = (size_t)l->head_dim * l->dtype_bytes;
	size_t head = bytes / 8, heads = l->kv_heads, tokens = l->block_tokens;
	size_t all = l->tensors == 1 ? heads : heads * tp;
	size_t first = l->tensors == 1 ? 0 : rank * heads * head;
	struct slice s;

	if (bytes % 8)
		return (struct slice){ 1, 1, p->block_bytes / 8, 0, 0, 0, 0, 0 };
	if (l->order == PDX_KV_HND) /* [head][token][dim]: a run a head a token */
		s = (struct slice){ heads, tokens, head, tokens * head, head,
				    head, all * head, first };
	else /* NHD, [token][head][dim]: a run per token */
		s = (struct slice){ 1, tokens, heads * head, 0, heads * head, 0,
				    all * head, first };
	if (s.local_step == s.len && s.full_step == s.len) { /* end to end */
		s.len *= s.runs;
		s.runs = 1;
	}
	return s;
}

static void fill_words(uint64_t *w, size_t n, uint64_t key)
{
	for (size_t i = 0; i < n; i++)
		w[i] = key + i * PDX_GOLDEN_STEP;
}

void pb_fill_rank(const struct pdx_shm_pool *p, uint64_t seed,
		  const uint32_t *blocks, size_t n, size_t first, uint32_t rank,
		  uint32_t tp)
{
	struct slice s = slice_of(p, rank, tp);

	for (uint32_t l = 0; l < p->layout.layers; l++)
		for (uint32_t t = 0; t < p->layout.tensors; t++)
			for (size_t i = first; i < n; i++) {
				uint64_t *w = (uint64_t *)pdx_shm_pool_block(
					p, l, t, blocks[i]);
				uint64_t key = block_key(seed, l, t, i);

				for (size_t g = 0; g < s.groups; g++)
					for (size_t k = 0; k < s.runs; k++)
						fill_words(w + g * s.local_group +
								   k * s.local_step,
							   s.len,
							   key + (s.first +
								  g * s.full_group +
								  k * s.full_step) *
									 PDX_GOLDEN_STEP);
			}
}

void pb_fill(const struct pdx_shm_pool *p, uint64_t seed,
	     const uint32_t *blocks, size_t n, size_t first)
{
	pb_fill_rank(p, seed, blocks, n, first, 0, 1);
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

/* Block i of (l, t) against its slice of the pattern; -1 and the first
 * difference in err. */
static int verify_block(const struct pdx_shm_pool *p, const struct slice *s,
			uint64_t seed, uint32_t l, uint32_t t, size_t i,
			uint32_t block, char *err, size_t errlen)
{
	const uint64_t *w = (const uint64_t *)pdx_shm_pool_block(p, l, t, block);
	uint64_t key = block_key(seed, l, t, i);

	for (size_t k = 0; k < s->groups * s->runs; k++) {
		size_t g = k / s->runs, run = k % s->runs;
		const uint64_t *r = w + g * s->local_group + run * s->local_step;
		uint64_t rkey = key + (s->first + g * s->full_group +
				       run * s->full_step) *
				      PDX_GOLDEN_STEP;

		if (!diff_words(r, s->len, rkey))
			continue;
		for (size_t j = 0; j < s->len; j++) {
			uint64_t want = rkey + j * PDX_GOLDEN_STEP;

			if (r[j] == want)
				continue;
			snprintf(err, errlen,
				 "layer %u tensor %u token-block %zu (pool block %u) byte offset %zu: got 0x%016" PRIx64
				 " want 0x%016" PRIx64,
				 l, t, i, block, (size_t)(r + j - w) * 8, r[j],
				 want);
			return -1;
		}
	}
	return 0;
}

int pb_verify_rank(const struct pdx_shm_pool *p, uint64_t seed,
		   const uint32_t *blocks, size_t n, size_t first,
		   uint32_t rank, uint32_t tp, char *err, size_t errlen)
{
	struct slice s = slice_of(p, rank, tp);

	for (uint32_t l = 0; l < p->layout.layers; l++)
		for (uint32_t t = 0; t < p->layout.tensors; t++)
			for (size_t i = first; i < n; i++)
				if (verify_block(p, &s, seed, l, t, i, blocks[i],
						 err, errlen))
					return -1;
	return 0;
}

int pb_verify(const struct pdx_shm_pool *p, uint64_t seed,
	      const uint32_t *blocks, size_t n, size_t first, char *err,
	      size_t errlen)
{
	return pb_verify_rank(p, seed, blocks, n, first, 0, 1, err, errlen);
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
