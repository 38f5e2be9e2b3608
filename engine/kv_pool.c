/* A shared-memory pool and its allocator, made and unmade together. */
#include "engine/kv_pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pdx_kv_pool {
	struct pdx_shm_pool shm; /* not copied: region points into it */
	struct pdx_block_alloc *alloc;
};

pdx_status_t pdx_kv_pool_new(const struct pdx_kv_pool_params *params,
			     struct pdx_kv_pool **out, char *err,
			     size_t errlen)
{
	struct pdx_kv_pool *pool;
	pdx_status_t st;

	if (!params->model) {
		snprintf(err, errlen, "no model");
		return PDX_EINVAL;
	}
	pool = calloc(1, sizeof(*pool));
	if (!pool) {
		snprintf(err, errlen, "out of memory");
		return PDX_ENOMEM;
	}
	st = pdx_shm_pool_create(&pool->shm, params->shm_name, params->model,
				 params->blocks, err, errlen);
	if (st != PDX_OK)
		goto free_pool;
	st = pdx_synth_layout_check(&pool->shm.layout);
	if (st != PDX_OK) {
		snprintf(err, errlen,
			 "model %s: a shape the synthetic model cannot fill",
			 params->model->name);
		goto destroy_shm;
	}
	if (params->prefault)
		memset(pool->shm.base, 0, pool->shm.size);
	st = pdx_block_alloc_new(params->blocks, &pool->alloc);
	if (st != PDX_OK) {
		snprintf(err, errlen, "block allocator: %s",
			 pdx_status_str(st));
		goto destroy_shm;
	}
	*out = pool;
	return PDX_OK;
destroy_shm:
	pdx_shm_pool_destroy(&pool->shm);
free_pool:
	free(pool);
	return st;
}

void pdx_kv_pool_free(struct pdx_kv_pool *pool)
{
	if (!pool)
		return;
	pdx_block_alloc_free(pool->alloc);
	pdx_shm_pool_destroy(&pool->shm);
	free(pool);
}

const struct pdx_shm_pool *pdx_kv_pool_shm(const struct pdx_kv_pool *pool)
{
	return &pool->shm;
}

struct pdx_block_alloc *pdx_kv_pool_blocks(struct pdx_kv_pool *pool)
{
	return pool->alloc;
}

struct pdx_synth_seq pdx_kv_pool_seq(const struct pdx_kv_pool *pool,
				     const uint32_t *blocks,
				     const uint64_t *hash)
{
	return (struct pdx_synth_seq){
		.layout = &pool->shm.layout,
		.base = pool->shm.base,
		.blocks = blocks,
		.hash = hash,
	};
}
