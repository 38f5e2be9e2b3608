#include "engine/kv_seq.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

static uint32_t block_tokens(const struct pdx_kv_pool *pool)
{
	return pdx_kv_pool_layout(pool)->block_tokens;
}

static void hash_to(struct pdx_kv_seq *s, uint32_t to);

/* The blocks, from the prefix cache when the pool has one: its hits are
 * hashed first, so the prompt is. */
static pdx_status_t take_blocks(struct pdx_kv_seq *s, uint32_t nb)
{
	struct pdx_prefix_cache *c = pdx_kv_pool_cache(s->pool);
	uint32_t hits;
	pdx_status_t st;

	if (!c)
		return pdx_block_alloc_get(pdx_kv_pool_blocks(s->pool), nb,
					   s->blocks);
	hash_to(s, s->n_tokens);
	st = pdx_prefix_cache_get(c, s->hash, s->cache_salt, s->n_tokens, nb,
				  s->blocks, &hits);
	if (st == PDX_OK)
		s->cached = s->filled = hits * block_tokens(s->pool);
	return st;
}

/* Offers the full blocks of [0, filled) to the prefix cache, unless KV in
 * them was received and not checked. */
static void offer(struct pdx_kv_seq *s)
{
	struct pdx_prefix_cache *c = pdx_kv_pool_cache(s->pool);

	if (c && !s->unchecked)
		pdx_prefix_cache_offer(c, s->hash, s->cache_salt, s->blocks,
				       s->filled / block_tokens(s->pool));
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
			    uint64_t cache_salt, struct pdx_kv_seq **out)
{
	uint32_t nb = pdx_kv_seq_blocks_for(pool, n_prompt, max_new);
	struct pdx_kv_seq *s;
	pdx_status_t st = PDX_ENOMEM;

	s = calloc(1, sizeof(*s));
	if (!s)
		return PDX_ENOMEM;
	s->pool = pool;
	s->cache_salt = cache_salt;
	s->cap = n_prompt + max_new - 1;
	s->tokens = malloc(sizeof(*s->tokens) * s->cap);
	s->hash = malloc(sizeof(*s->hash) * s->cap);
	s->blocks = malloc(sizeof(*s->blocks) * nb);
	if (!s->tokens || !s->hash || !s->blocks)
		goto free_arrays;
	memcpy(s->tokens, prompt, sizeof(*prompt) * n_prompt);
	s->n_tokens = n_prompt;
	st = take_blocks(s, nb);
	if (st != PDX_OK)
		goto free_arrays;
	s->n_blocks = nb;
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
	struct pdx_prefix_cache *c;
	pdx_status_t st;

	if (!s)
		return;
	c = pdx_kv_pool_cache(s->pool);
	offer(s);
	st = c ? pdx_prefix_cache_put(c, s->blocks, s->n_blocks)
	       : pdx_block_alloc_put(pdx_kv_pool_blocks(s->pool), s->blocks,
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
	assert(n <= s->n_tokens && n >= s->cached);
	hash_to(s, n);
	s->filled = n;
	s->unchecked = n > s->cached;
}

void pdx_kv_seq_unfill(struct pdx_kv_seq *s)
{
	s->filled = s->cached;
	s->unchecked = false;
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

pdx_status_t pdx_kv_seq_verify(struct pdx_kv_seq *s, uint32_t n,
			       uint64_t *mismatches, uint32_t *bad)
{
	pdx_status_t st;

	assert(n <= s->filled);
	st = pdx_kv_pool_verify(s->pool, s->blocks, s->hash, n, mismatches,
				bad);
	if (st == PDX_OK && *mismatches == 0) {
		s->unchecked = false;
		offer(s);
	}
	return st;
}

void pdx_kv_seq_push(struct pdx_kv_seq *s, uint32_t token)
{
	assert(s->n_tokens < s->cap);
	s->tokens[s->n_tokens++] = token;
}
