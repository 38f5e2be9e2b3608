/* A KV sequence: one request's tokens, their prefix hashes and its block
 * table in the engine's pool.
 *
 * The sequence gets every block it can ever need when it is made (prompt
 * plus all output tokens but the last, whose KV is never written), all at
 * once or none (block_alloc.h), so it never waits holding half. Positions
 * [0, filled) have their KV written in every layer; tokens [0, n_tokens)
 * are known (the prompt, then each generated token once it is pushed).
 *
 * Prefill (local): pdx_kv_seq_fill() up to the prompt's length, chunk by
 * chunk. Prefill (remote): the blocks are written by the agent instead,
 * then marked (pdx_kv_seq_received()), which sets filled to the
 * prompt's length.
 * Decode: push the newest token, fill its position, read the next token.
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
};

/* Makes a sequence of prompt[0..n_prompt) (n_prompt > 0) that may grow by
 * max_new tokens (>= 1), taking its blocks from pool. PDX_EAGAIN: not
 * enough free blocks now; PDX_ETOOBIG: more than the pool has;
 * PDX_ENOMEM. Nothing is held on failure. */
pdx_status_t pdx_kv_seq_new(struct pdx_kv_pool *pool, const uint32_t *prompt,
			    uint32_t n_prompt, uint32_t max_new,
			    struct pdx_kv_seq **out);

/* Returns the blocks to the pool and frees the sequence; NULL-safe. */
void pdx_kv_seq_free(struct pdx_kv_seq *s);

/* Blocks a sequence of n_prompt + max_new tokens takes in pool. */
uint32_t pdx_kv_seq_blocks_for(const struct pdx_kv_pool *pool,
			       uint32_t n_prompt, uint32_t max_new);

/* Writes the KV of positions [filled, to) in every layer, layer by layer
 * (to <= n_tokens). */
void pdx_kv_seq_fill(struct pdx_kv_seq *s, uint32_t to);

/* The token after positions [0, filled) (filled > 0) in a vocabulary of
 * vocab ids, read from the KV. */
uint32_t pdx_kv_seq_next_token(const struct pdx_kv_seq *s, uint32_t vocab);

/* The agent wrote the KV of positions [0, n) (n = the prompt's length):
 * hashes them; filled = n. */
void pdx_kv_seq_received(struct pdx_kv_seq *s, uint32_t n);

/* Probes the first and last position of every block of [0, n) in every
 * layer (pdx_synth_probe()); n <= filled. True when all match; else
 * false and the lowest position found wrong in *bad. */
bool pdx_kv_seq_probe(const struct pdx_kv_seq *s, uint32_t n, uint32_t *bad);

/* Appends a generated token (n_tokens < cap). */
void pdx_kv_seq_push(struct pdx_kv_seq *s, uint32_t token);

#endif
