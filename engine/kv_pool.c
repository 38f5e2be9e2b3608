/* A KV pool: memory from a backend (kv_mem.h) and an allocator, made
 * and unmade together. */
#include "engine/kv_pool.h"

#include <stdio.h>
#include <stdlib.h>

#include "engine/kv_mem.h"
#include "engine/tp_slice.h"

struct pdx_kv_pool {
	struct pdx__kv_mem *mem;
	struct pdx_block_alloc *alloc;
	struct pdx_tp_slice slice; /* its heads; slice.model its shape */
};

pdx_status_t pdx_kv_pool_new(const struct pdx_kv_pool_params *params,
			     struct pdx_kv_pool **out, char *err,
			     size_t errlen)
{
	uint32_t tp = params->tp_size ? params->tp_size : 1;
	struct pdx_kv_pool_params q = *params;
	struct pdx_kv_pool *pool;
	pdx_status_t st;

	if (!params->model) {
		snprintf(err, errlen, "no model");
		return PDX_EINVAL;
	}
	if (tp > 1 && params->mem != PDX_MEM_SHM) {
		snprintf(err, errlen, "tensor parallelism runs in host memory "
				      "only (not yet on a GPU)");
		return PDX_EINVAL;
	}
	pool = calloc(1, sizeof(*pool));
	if (!pool) {
		snprintf(err, errlen, "out of memory");
		return PDX_ENOMEM;
	}
	if (pdx_tp_slice(params->model, tp, params->tp_rank, &pool->slice, err,
			 errlen)) {
		st = PDX_EINVAL;
		goto free_pool;
	}
	q.model = &pool->slice.model;
	switch (params->mem) {
	case PDX_MEM_SHM:
		st = pdx__kv_mem_host_new(&q, &pool->mem, err, errlen);
		break;
	case PDX_MEM_CUDA:
		st = pdx__kv_mem_cuda_new(&q, &pool->mem, err, errlen);
		break;
	default:
		snprintf(err, errlen, "unknown memory type %d",
			 (int)params->mem);
		st = PDX_EINVAL;
	}
	if (st != PDX_OK)
		goto free_pool;
	pool->mem->head0 = pool->slice.head0;
	st = pdx_block_alloc_new(params->blocks, &pool->alloc);
	if (st != PDX_OK) {
		snprintf(err, errlen, "block allocator: %s",
			 pdx_status_str(st));
		goto free_mem;
	}
	*out = pool;
	return PDX_OK;
free_mem:
	pool->mem->ops->free(pool->mem);
free_pool:
	free(pool);
	return st;
}

void pdx_kv_pool_free(struct pdx_kv_pool *pool)
{
	if (!pool)
		return;
	pdx_block_alloc_free(pool->alloc);
	pool->mem->ops->free(pool->mem);
	free(pool);
}

const struct pdx_kv_layout *pdx_kv_pool_layout(const struct pdx_kv_pool *pool)
{
	return pool->mem->layout;
}

const struct pdx_engine_region *
pdx_kv_pool_region(const struct pdx_kv_pool *pool)
{
	return pool->mem->region;
}

const struct pdx_engine_cuda_events *
pdx_kv_pool_events(const struct pdx_kv_pool *pool)
{
	return pool->mem->events;
}

uint64_t pdx_kv_pool_size(const struct pdx_kv_pool *pool)
{
	return pool->mem->size;
}

const char *pdx_kv_pool_where(const struct pdx_kv_pool *pool)
{
	return pool->mem->where;
}

const struct pdx_shm_pool *pdx_kv_pool_shm(const struct pdx_kv_pool *pool)
{
	return pool->mem->shm;
}

struct pdx_block_alloc *pdx_kv_pool_blocks(struct pdx_kv_pool *pool)
{
	return pool->alloc;
}

pdx_status_t pdx_kv_pool_pass(struct pdx_kv_pool *pool,
			      struct pdx_synth_run *runs, size_t n,
			      uint32_t vocab, uint32_t *slot)
{
	*slot = PDX_KV_POOL_NO_SLOT;
	if (n == 0)
		return PDX_OK;
	return pool->mem->ops->pass(pool->mem, runs, n, vocab, slot);
}

pdx_status_t pdx_kv_pool_verify(struct pdx_kv_pool *pool,
				const uint32_t *blocks, const uint64_t *hash,
				uint32_t n, uint64_t *mismatches,
				uint32_t *bad)
{
	struct pdx_synth_run run = {
		.blocks = blocks, .hash = hash, .a = 0, .b = n};

	*mismatches = 0;
	*bad = UINT32_MAX;
	if (n == 0)
		return PDX_OK;
	return pool->mem->ops->verify(pool->mem, &run, mismatches, bad);
}
