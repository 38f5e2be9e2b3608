#include "engine/kv_seq.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

static uint32_t block_tokens(const struct pdx_kv_pool *pool)
{
	return pdx_kv_pool_layout(pool)->block_tokens;
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

struct pdx_synth_run pdx_kv_seq_run(struct pdx_kv_seq *s, uint32_t to,
				    bool want_token)
{
	struct pdx_synth_run r = {
	    .blocks = s->blocks,
	    .hash = s->hash,
	    .a = s->filled,
	    .b = to,
	    .want_token = want_token,
	};

	assert(to <= s->n_tokens && to <= s->cap && to >= s->filled);
	hash_to(s, to);
	s->filled = to;
	return r;
}

pdx_status_t pdx_kv_seq_next_token(struct pdx_kv_seq *s, uint32_t vocab,
				   uint32_t *out)
{
	struct pdx_synth_run r = pdx_kv_seq_run(s, s->filled, true);
	uint32_t slot;
	pdx_status_t st;

	assert(s->filled > 0);
	st = pdx_kv_pool_pass(s->pool, &r, 1, vocab, &slot);
	if (st == PDX_OK)
		*out = r.token;
	return st;
}

pdx_status_t pdx_kv_seq_verify(const struct pdx_kv_seq *s, uint32_t n,
			       uint64_t *mismatches, uint32_t *bad)
{
	assert(n <= s->filled);
	return pdx_kv_pool_verify(s->pool, s->blocks, s->hash, n, mismatches,
				  bad);
}

void pdx_kv_seq_push(struct pdx_kv_seq *s, uint32_t token)
{
	assert(s->n_tokens < s->cap);
	s->tokens[s->n_tokens++] = token;
}
