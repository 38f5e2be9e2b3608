/* The engine's prefix cache: full KV blocks kept after the request that
 * wrote them, found again by the tokens they cover, so that a request
 * whose prompt starts with them takes them instead of computing them (a
 * local prefill) or receiving them (a decode engine asks its agent only
 * for the tail: skip_tokens, include/pdx/engine.h).
 *
 * A block's key is the prefix hash of its last position (kv_seq.h: hash[p]
 * covers tokens 0..p), so block i of a prompt is keyed by tokens
 * 0..(i+1)*block_tokens, and a prompt's hits are its longest run of
 * leading blocks found. A request's cache salt (0: none; vLLM's
 * cache_salt, hashed) is XORed into its keys, so requests of different
 * salts never share a block, as in vLLM, whose salt is for tenants that
 * must not learn from each other's hits. Only full blocks whose KV is known right are
 * offered: computed here, or received and checked.
 *
 * The cache holds one reference on each cached block (block_alloc.h). A
 * cached block no request holds is evictable: when a request needs more
 * free blocks than there are, the least recently released of those go
 * back to the free list, deepest in their prompt first. To whoever asks
 * for blocks, evictable blocks count as free, so the cache never makes a
 * request wait or fail that would have fit without it.
 *
 * Memory is allocated in pdx_prefix_cache_new() only. One thread (the
 * engine's loop).
 */
#ifndef PDX_ENGINE_PREFIX_CACHE_H
#define PDX_ENGINE_PREFIX_CACHE_H

#include <stdint.h>

#include <pdx/status.h>

#include "engine/block_alloc.h"

struct pdx_prefix_cache;

struct pdx_prefix_cache_stats {
	uint32_t cached;       /* blocks in the cache */
	uint32_t evictable;    /* ... that no request holds */
	uint64_t query_tokens; /* prompt tokens of requests that got blocks */
	uint64_t hit_tokens;   /* ... whose KV was found here */
	uint64_t evicted;      /* blocks evicted to make room */
};

/* An empty cache over the blocks of a (borrowed) allocator whose blocks
 * hold block_tokens positions each. PDX_EINVAL, PDX_ENOMEM. */
pdx_status_t pdx_prefix_cache_new(struct pdx_block_alloc *a,
				  uint32_t block_tokens,
				  struct pdx_prefix_cache **out);

/* Drops the cache's references; NULL-safe. */
void pdx_prefix_cache_free(struct pdx_prefix_cache *c);

/* Takes n blocks into out for a sequence whose prompt has n_prompt
 * tokens with prefix hashes hash[0..n_prompt): first the cached blocks
 * that start the prompt (a reference each; *hits of them), then free ones,
 * evicting cached blocks when too few are free. As
 * pdx_block_alloc_get(): PDX_EAGAIN when fewer than needed are free or
 * evictable (nothing taken), PDX_ETOOBIG when n exceeds the pool. */
pdx_status_t pdx_prefix_cache_get(struct pdx_prefix_cache *c,
				  const uint64_t *hash, uint64_t salt,
				  uint32_t n_prompt,
				  uint32_t n, uint32_t *out, uint32_t *hits);

/* Offers the full blocks ids[0..n) of a sequence whose positions
 * [0, n * block_tokens) have prefix hashes hash and right KV: each whose
 * key is not cached yet is cached (the cache takes a reference). */
void pdx_prefix_cache_offer(struct pdx_prefix_cache *c, const uint64_t *hash,
			    uint64_t salt, const uint32_t *ids, uint32_t n);

/* As pdx_block_alloc_put(): a holder lets go of ids[0..n). Cached blocks
 * left to the cache alone become evictable, the last of ids first, and
 * the allocator's on_free hook runs (pdx_block_alloc_wake()): to whoever
 * waits for blocks they are as good as free. */
pdx_status_t pdx_prefix_cache_put(struct pdx_prefix_cache *c,
				  const uint32_t *ids, uint32_t n);

void pdx_prefix_cache_stats(const struct pdx_prefix_cache *c,
			    struct pdx_prefix_cache_stats *out);

#endif
