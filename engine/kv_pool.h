/* The reference engine's KV pool: paged blocks of the synthetic model's
 * KV (synth_model.h), the memory its agent registers, and the allocator
 * that says who holds which (block_alloc.h).
 *
 * The memory is POSIX shared memory (common/shm_pool.h, the default) or
 * one cudaMalloc allocation on a GPU, with the same layout either way
 * (engine/kv_mem.h hides which). Everything the engine does to the bytes
 * goes through a forward pass (pdx_kv_pool_pass()) or a check of
 * received KV (pdx_kv_pool_verify()), which run on the CPU or on the GPU
 * with the same results.
 *
 * The pool owns both. One thread at a time (the engine's loop); host
 * block bytes may be read from any thread that holds them.
 */
#ifndef PDX_ENGINE_KV_POOL_H
#define PDX_ENGINE_KV_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/engine.h>
#include <pdx/status.h>

#include "common/models.h"
#include "common/shm_pool.h"
#include "engine/block_alloc.h"
#include "engine/synth_model.h"

struct pdx_kv_pool;

struct pdx_kv_pool_params {
	enum pdx_mem_type mem;	       /* PDX_MEM_SHM (default) or _CUDA */
	const char *shm_name;	       /* shm: e.g. "/pdx-engine-<pid>" */
	int cuda_device;	       /* cuda: the device's ordinal */
	const struct pdx_model *model; /* the shape of every block */
	uint32_t blocks;	       /* blocks per layer and tensor */
	/* one rank of a tensor-parallel instance: the pool holds only that
	 * rank's KV heads (tp_slice.h), with the whole model's values for
	 * them; 0 and 0: TP 1 */
	uint32_t tp_size, tp_rank;
	/* shm: write every byte once now, so that requests never pay for
	 * the first write to a page: on the test VMs that costs ~1.3 s per
	 * GiB even after MAP_POPULATE (docs/engine.md). */
	bool prefault;
};

/* A pass that wrote nothing, or wrote host memory: no event to wait on
 * (pdx_engine_layer_done() rather than _slot()). */
#define PDX_KV_POOL_NO_SLOT UINT32_MAX

/* Makes the memory (shm: replacing a stale object of that name; cuda:
 * zeroed, exported for CUDA IPC with its ring of "layer computed"
 * events, include/pdx/engine.h) and an allocator with every block free.
 * On failure writes the reason to err and returns PDX_EINVAL (a bad
 * parameter, a shape the synthetic model cannot fill, or CUDA asked of a
 * build without it), PDX_ENOENT (no CUDA device, or not that one),
 * PDX_ENOMEM or PDX_EIO. */
pdx_status_t pdx_kv_pool_new(const struct pdx_kv_pool_params *params,
			     struct pdx_kv_pool **out, char *err,
			     size_t errlen);

/* Frees the memory; NULL-safe. A shm object is unlinked: an agent that
 * still maps it keeps its blocks until it unmaps them. */
void pdx_kv_pool_free(struct pdx_kv_pool *pool);

/* What pdx_engine_register_cuda() takes: the layout, the one region, and
 * the event ring (NULL for host memory). */
const struct pdx_kv_layout *pdx_kv_pool_layout(const struct pdx_kv_pool *pool);
const struct pdx_engine_region *
pdx_kv_pool_region(const struct pdx_kv_pool *pool);
const struct pdx_engine_cuda_events *
pdx_kv_pool_events(const struct pdx_kv_pool *pool);

/* Bytes, and where they are in words for the logs ("/dev/shm/NAME",
 * "cuda:0"). */
uint64_t pdx_kv_pool_size(const struct pdx_kv_pool *pool);
const char *pdx_kv_pool_where(const struct pdx_kv_pool *pool);

/* The shared-memory pool behind a host pool, for tests and tools that
 * read its bytes; NULL for GPU memory. */
const struct pdx_shm_pool *pdx_kv_pool_shm(const struct pdx_kv_pool *pool);

/* The allocator of the pool's block ids. */
struct pdx_block_alloc *pdx_kv_pool_blocks(struct pdx_kv_pool *pool);

/* One forward pass: writes positions [a, b) of every run (disjoint
 * slots) in every layer, layer by layer (layer l of every run, then
 * l + 1), then writes each wanted token (pdx_synth_next_token(b, vocab))
 * to its run. In GPU memory the writes are queued on the pool's stream,
 * and after layer l the event [slot * layers + l] of the pass's slot is
 * recorded (the slots cycle, one per pass that writes); the tokens wait
 * for the pass. *slot: that slot, or PDX_KV_POOL_NO_SLOT (host memory,
 * or nothing written). PDX_EIO: a CUDA error; PDX_EINVAL/PDX_ERANGE: a
 * bad run. */
pdx_status_t pdx_kv_pool_pass(struct pdx_kv_pool *pool,
			      struct pdx_synth_run *runs, size_t n,
			      uint32_t vocab, uint32_t *slot);

/* Checks the KV of positions [0, n) of a sequence (blocks, hash as in a
 * run) received from elsewhere: in host memory the first and last
 * position of every block are probed (pdx_synth_probe(): reading every
 * byte costs too much on a CPU's critical path), on a GPU every word of
 * every position is compared. *mismatches: positions found wrong (a
 * probe stops at the first); *bad: the lowest, UINT32_MAX when none.
 * PDX_EIO: the check itself failed. */
pdx_status_t pdx_kv_pool_verify(struct pdx_kv_pool *pool,
				const uint32_t *blocks, const uint64_t *hash,
				uint32_t n, uint64_t *mismatches,
				uint32_t *bad);

#endif
