#include "engine/kv_seq.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

static uint32_t block_tokens(const struct pdx_kv_pool *pool)
{
	return pdx_kv_pool_shm(pool)->layout.block_tokens;
}

uint32_t pdx_kv_seq_blocks_for(const struct pdx_kv_pool *pool,
			       uint32_t n_prompt, uint32_t max_new)
{
	uint64_t positions = (uint64_t)n_prompt + max_new - 1;
	uint32_t bt = block_tokens(pool);

	return (uint32_t)((positions + bt - 1) / bt);
}

pdx_status_t pdx_kv_seq_new(struct pdx_kv_pool *pool, const uint32_t *prompt,
			    uint32_t n_prompt, uint32_t max_new,
			    struct pdx_kv_seq **out)
{
	uint32_t nb = pdx_kv_seq_blocks_for(pool, n_prompt, max_new);
	struct pdx_kv_seq *s;
	pdx_status_t st = PDX_ENOMEM;

	s = calloc(1, sizeof(*s));
	if (!s)
		return PDX_ENOMEM;
	s->pool = pool;
	s->cap = n_prompt + max_new - 1;
	s->tokens = malloc(sizeof(*s->tokens) * s->cap);
	s->hash = malloc(sizeof(*s->hash) * s->cap);
	s->blocks = malloc(sizeof(*s->blocks) * nb);
	if (!s->tokens || !s->hash || !s->blocks)
		goto free_arrays;
	st = pdx_block_alloc_get(pdx_kv_pool_blocks(pool), nb, s->blocks);
	if (st != PDX_OK)
		goto free_arrays;
	s->n_blocks = nb;
	memcpy(s->tokens, prompt, sizeof(*prompt) * n_prompt);
	s->n_tokens = n_prompt;
	*out = s;
	return PDX_OK;
free_arrays:
	free(s->blocks);
	free(s->hash);
	free(s->tokens);
	free(s);
	return st;
}

void pdx_kv_seq_free(struct pdx_kv_seq *s)
{
	pdx_status_t st;

	if (!s)
		return;
	st = pdx_block_alloc_put(pdx_kv_pool_blocks(s->pool), s->blocks,
				 s->n_blocks);
	assert(st == PDX_OK);
	(void)st;
	free(s->blocks);
	free(s->hash);
	free(s->tokens);
	free(s);
}

void pdx_kv_seq_fill(struct pdx_kv_seq *s, uint32_t to)
{
	struct pdx_synth_seq view;
	uint32_t layers;

	assert(to <= s->n_tokens && to <= s->cap);
	if (to <= s->filled)
		return;
	if (s->n_hashed < to) {
		uint64_t prev = s->n_hashed ? s->hash[s->n_hashed - 1]
					    : PDX_SYNTH_HASH_SEED;

		pdx_synth_hashes(prev, s->tokens + s->n_hashed,
				 to - s->n_hashed, s->hash + s->n_hashed);
		s->n_hashed = to;
	}
	view = pdx_kv_pool_seq(s->pool, s->blocks, s->hash);
	layers = view.layout->layers;
	for (uint32_t l = 0; l < layers; l++)
		pdx_synth_fill(&view, l, s->filled, to);
	s->filled = to;
}

static void hash_to(struct pdx_kv_seq *s, uint32_t to)
{
	uint64_t prev;

	if (s->n_hashed >= to)
		return;
	prev = s->n_hashed ? s->hash[s->n_hashed - 1] : PDX_SYNTH_HASH_SEED;
	pdx_synth_hashes(prev, s->tokens + s->n_hashed, to - s->n_hashed,
			 s->hash + s->n_hashed);
	s->n_hashed = to;
}

void pdx_kv_seq_received(struct pdx_kv_seq *s, uint32_t n)
{
	assert(n <= s->n_tokens);
	hash_to(s, n);
	s->filled = n;
}

bool pdx_kv_seq_probe(const struct pdx_kv_seq *s, uint32_t n, uint32_t *bad)
{
	struct pdx_synth_seq view =
	    pdx_kv_pool_seq(s->pool, s->blocks, s->hash);
	uint32_t bt = block_tokens(s->pool);

	assert(n <= s->filled);
	for (uint32_t a = 0; a < n; a += bt) {
		uint32_t b = a + bt < n ? a + bt : n;

		if (!pdx_synth_probe(&view, a, a + 1, bad) ||
		    !pdx_synth_probe(&view, b - 1, b, bad))
			return false;
	}
	return true;
}

uint32_t pdx_kv_seq_next_token(const struct pdx_kv_seq *s, uint32_t vocab)
{
	struct pdx_synth_seq view =
	    pdx_kv_pool_seq(s->pool, s->blocks, s->hash);

	return pdx_synth_next_token(&view, s->filled, vocab);
}

void pdx_kv_seq_push(struct pdx_kv_seq *s, uint32_t token)
{
	assert(s->n_tokens < s->cap);
	s->tokens[s->n_tokens++] = token;
}
