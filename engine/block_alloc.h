/* The block allocator of a paged KV pool: which block ids are free, and
 * how many holders each held block has.
 *
 * A request's blocks are allocated all at once or not at all, so a
 * request never waits holding half of what it needs. A block reachable by
 * more than one request (a shared prefix) has one reference per holder and
 * returns to the free list when the last lets go. Ids come back in the
 * order they were freed, last first; a fresh allocator hands out 0, 1, 2,
 * ... so the blocks of early requests are consecutive (one UCX operation
 * per run).
 *
 * Memory is allocated in pdx_block_alloc_new() only. One thread at a time.
 */
#ifndef PDX_ENGINE_BLOCK_ALLOC_H
#define PDX_ENGINE_BLOCK_ALLOC_H

#include <stdint.h>

#include <pdx/status.h>

struct pdx_block_alloc;

struct pdx_block_stats {
	uint32_t total;  /* blocks in the pool */
	uint32_t free;   /* on the free list */
	uint32_t held;   /* total - free */
	uint32_t shared; /* held by more than one holder */
};

/* An allocator of ids 0..blocks-1, all free. PDX_EINVAL for 0 blocks,
 * PDX_ENOMEM. */
pdx_status_t pdx_block_alloc_new(uint32_t blocks, struct pdx_block_alloc **out);

/* NULL-safe. */
void pdx_block_alloc_free(struct pdx_block_alloc *a);

/* Takes n free blocks, each with one reference, into out. PDX_EAGAIN when
 * fewer than n are free now (nothing taken), PDX_ETOOBIG when n exceeds
 * the pool (it never fits). n == 0 succeeds. */
pdx_status_t pdx_block_alloc_get(struct pdx_block_alloc *a, uint32_t n,
				 uint32_t *out);

/* Adds a reference to each of ids[0..n) (held blocks: a new holder of a
 * shared prefix). PDX_ERANGE for an id that is out of range or free;
 * nothing changes then. */
pdx_status_t pdx_block_alloc_ref(struct pdx_block_alloc *a,
				 const uint32_t *ids, uint32_t n);

/* Drops one reference from each of ids[0..n); blocks left with none are
 * free again. An id may appear more than once (once per reference).
 * PDX_ERANGE when an id is out of range or would drop below zero
 * references; nothing changes then. */
pdx_status_t pdx_block_alloc_put(struct pdx_block_alloc *a,
				 const uint32_t *ids, uint32_t n);

/* cb(arg) runs at the end of every pdx_block_alloc_put() that freed a
 * block, so whoever waits for blocks (the scheduler's queue) learns of
 * them whichever holder let go: a request's end or abort, or a held
 * prefill's KV once its transfer ended. One hook; cb NULL: none. cb must
 * not call back into the allocator. */
void pdx_block_alloc_on_free(struct pdx_block_alloc *a,
			     void (*cb)(void *arg), void *arg);

/* Runs the on_free hook now: for blocks that became as good as free
 * without their last reference going (the prefix cache's, evictable once
 * no request holds them: prefix_cache.h). */
void pdx_block_alloc_wake(struct pdx_block_alloc *a);

/* References block id holds now (0: free or out of range). */
uint32_t pdx_block_alloc_refs(const struct pdx_block_alloc *a, uint32_t id);

void pdx_block_alloc_stats(const struct pdx_block_alloc *a,
			   struct pdx_block_stats *out);

#endif
