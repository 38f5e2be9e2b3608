/* The reference engine's KV pool: paged blocks in POSIX shared memory
 * (common/shm_pool.h: the layout its agent maps and registers) and the
 * allocator that says who holds which (block_alloc.h).
 *
 * The pool owns both. One thread at a time (the engine's loop); the
 * block bytes may be written and read from any thread that holds them.
 */
#ifndef PDX_ENGINE_KV_POOL_H
#define PDX_ENGINE_KV_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/status.h>

#include "common/models.h"
#include "common/shm_pool.h"
#include "engine/block_alloc.h"
#include "engine/synth_model.h"

struct pdx_kv_pool;

struct pdx_kv_pool_params {
	const char *shm_name;          /* e.g. "/pdx-engine-<pid>" */
	const struct pdx_model *model; /* the shape of every block */
	uint32_t blocks;               /* blocks per layer and tensor */
	/* Write every byte once now, so that requests never pay for the
	 * first write to a page: on the test VMs that costs ~1.3 s per GiB
	 * even after MAP_POPULATE (docs/engine.md). */
	bool prefault;
};

/* Creates the shared-memory object (replacing a stale one of that name)
 * and an allocator with every block free. On failure writes the reason
 * to err and returns PDX_EINVAL (a bad parameter, or a shape the
 * synthetic model cannot fill), PDX_ENOMEM or PDX_EIO. */
pdx_status_t pdx_kv_pool_new(const struct pdx_kv_pool_params *params,
			     struct pdx_kv_pool **out, char *err,
			     size_t errlen);

/* Unmaps and unlinks the memory; NULL-safe. Blocks an agent still maps
 * stay valid for it until it unmaps them. */
void pdx_kv_pool_free(struct pdx_kv_pool *pool);

/* The memory: layout and region for pdx_engine_register(), base. */
const struct pdx_shm_pool *pdx_kv_pool_shm(const struct pdx_kv_pool *pool);

/* The allocator of the pool's block ids. */
struct pdx_block_alloc *pdx_kv_pool_blocks(struct pdx_kv_pool *pool);

/* A view of one sequence in the pool for synth_model.h: its block table
 * and prefix hashes, both owned by the caller. */
struct pdx_synth_seq pdx_kv_pool_seq(const struct pdx_kv_pool *pool,
				     const uint32_t *blocks,
				     const uint64_t *hash);

#endif
