/* A KV sequence: one request's tokens, their prefix hashes and its block
 * table in the engine's pool.
 *
 * The sequence gets every block it can ever need when it is made (prompt
 * plus all output tokens but the last, whose KV is never written), all at
 * once or none (block_alloc.h), so it never waits holding half. Positions
 * [0, filled) have their KV written in every layer; tokens [0, n_tokens)
 * are known (the prompt, then each generated token once it is pushed).
 *
 * Prefill (local): pdx_kv_seq_run() up to the prompt's length, chunk by
 * chunk, each run written by a forward pass (pdx_kv_pool_pass()).
 * Prefill (remote): the blocks are written by the agent instead, then
 * marked (pdx_kv_seq_received()), which sets filled to the prompt's
 * length, and checked (pdx_kv_seq_verify()).
 * Decode: push the newest token, run its position with want_token.
 *
 * With the pool's prefix cache (prefix_cache.h) the sequence starts with
 * the cached blocks its prompt begins with: positions [0, cached) are
 * filled from the start and never written again (other requests may hold
 * them too), a local prefill starts after them, and a decode engine asks
 * its agent for the rest only. Its own full blocks are offered to the
 * cache once their KV is known right: received KV when it passed its
 * check, all of them when the sequence is freed (but received KV never
 * checked).
 *
 * Owned by the caller; one thread (the engine's loop).
 */
#ifndef PDX_ENGINE_KV_SEQ_H
#define PDX_ENGINE_KV_SEQ_H

#include <stdbool.h>
#include <stdint.h>

#include <pdx/status.h>

#include "engine/kv_pool.h"

struct pdx_kv_seq {
	struct pdx_kv_pool *pool;
	uint32_t *tokens; /* [cap] */
	uint64_t *hash;	  /* [cap]: hash[p] covers tokens 0..p */
	uint32_t *blocks; /* [n_blocks]: position p in blocks[p / bt] */
	uint32_t n_blocks;
	uint32_t cap;	   /* positions the blocks hold */
	uint32_t n_tokens; /* known tokens */
	uint32_t n_hashed; /* hash[0..n_hashed) computed */
	uint32_t filled;   /* positions with KV written */
	uint32_t cached;   /* leading positions from the prefix cache */
	bool unchecked;	   /* [cached, filled) received, not checked yet */
	uint64_t cache_salt; /* the prefix cache's salt (prefix_cache.h) */
};

/* Makes a sequence of prompt[0..n_prompt) (n_prompt > 0) that may grow by
 * max_new tokens (>= 1), taking its blocks from pool (from its prefix
 * cache under cache_salt, 0: none). PDX_EAGAIN: not
 * enough free blocks now; PDX_ETOOBIG: more than the pool has;
 * PDX_ENOMEM. Nothing is held on failure. */
pdx_status_t pdx_kv_seq_new(struct pdx_kv_pool *pool, const uint32_t *prompt,
			    uint32_t n_prompt, uint32_t max_new,
			    uint64_t cache_salt, struct pdx_kv_seq **out);

/* Returns the blocks to the pool and frees the sequence; NULL-safe. */
void pdx_kv_seq_free(struct pdx_kv_seq *s);

/* Blocks a sequence of n_prompt + max_new tokens takes in pool. */
uint32_t pdx_kv_seq_blocks_for(const struct pdx_kv_pool *pool,
			       uint32_t n_prompt, uint32_t max_new);

/* The run that writes positions [filled, to) (to <= n_tokens), for a
 * forward pass (pdx_kv_pool_pass()) that the caller runs before using
 * the sequence again; want_token: the pass also reads the token after
 * them. Hashes the positions; filled = to. The run points into s. */
struct pdx_synth_run pdx_kv_seq_run(struct pdx_kv_seq *s, uint32_t to,
				    bool want_token);

/* The token after positions [0, filled) (filled > 0) in a vocabulary of
 * vocab ids, read from the KV (a pass that writes nothing). */
pdx_status_t pdx_kv_seq_next_token(struct pdx_kv_seq *s, uint32_t vocab,
				   uint32_t *out);

/* The agent wrote the KV of positions [0, n) (n = the prompt's length):
 * hashes them; filled = n. */
void pdx_kv_seq_received(struct pdx_kv_seq *s, uint32_t n);

/* Checks the received KV of [0, n) (n <= filled), the cached prefix with
 * it, with pdx_kv_pool_verify(): PDX_OK with *mismatches and *bad (see
 * there). Right KV is offered to the prefix cache. */
pdx_status_t pdx_kv_seq_verify(struct pdx_kv_seq *s, uint32_t n,
			       uint64_t *mismatches, uint32_t *bad);

/* Forgets the KV past the cached prefix (received and wrong, or never
 * received): filled = cached, where a prefill here starts. */
void pdx_kv_seq_unfill(struct pdx_kv_seq *s);

/* Appends a generated token (n_tokens < cap). */
void pdx_kv_seq_push(struct pdx_kv_seq *s, uint32_t token);

#endif
