/* A paged KV pool in POSIX shared memory, laid out the way the synthetic
 * engines register it with their agent.
 *
 * Layer-major: tensor t of layer l starts at (tensors * l + t) * blocks *
 * block_bytes, and block b of it lies block_bytes further per block. One
 * region (index 0) holds everything. The agent maps the same object by
 * name, so the pool is the memory UCX reads and writes.
 *
 * The struct is owned by the caller and must not be copied once created
 * (region.shm_name points into it). Not thread-safe: create and destroy
 * from one thread; the bytes themselves may be used from any.
 */
#ifndef PDX_COMMON_SHM_POOL_H
#define PDX_COMMON_SHM_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <pdx/engine.h>
#include <pdx/layout.h>
#include <pdx/status.h>

#include "common/models.h"

struct pdx_shm_pool {
	char name[64];        /* shm_open() name */
	uint8_t *base;
	size_t size;
	uint64_t block_bytes; /* one block of one tensor of one layer */
	struct pdx_kv_layout layout;
	struct pdx_engine_region region; /* for pdx_engine_register() */
	int lock_fd;    /* holds flock(LOCK_EX) while the pool lives */
	bool has_lock;  /* lock_fd is open */
	dev_t dev;      /* the object's identity: destroy unlinks the name */
	ino_t ino;      /* only while it still names this object */
};

/* Creates, sizes, maps and pre-faults a pool of `blocks` blocks of model
 * m. An object of that name left by a process that died is replaced; one
 * a live process holds (another engine, maybe in another PID namespace
 * sharing /dev/shm) or another user's never is (PDX_EIO, saying whose).
 * Its pages are allocated here: a /dev/shm too small for it is an error
 * that says so, not a SIGBUS later. Block bytes must be a multiple of 8. On failure writes the reason to err
 * and returns PDX_EINVAL (bad arguments), PDX_ENOMEM or PDX_EIO; nothing
 * is left behind then. */
pdx_status_t pdx_shm_pool_create(struct pdx_shm_pool *p, const char *shm_name,
				 const struct pdx_model *m, uint32_t blocks,
				 char *err, size_t errlen);

/* The layout pdx_shm_pool_create() gives a pool of `blocks` blocks of m
 * (layer-major, above) and its size in bytes; the same for a pool in
 * other memory (a GPU's). out->layer is allocated: free() it. On failure
 * writes the reason to err and returns PDX_EINVAL or PDX_ENOMEM. */
pdx_status_t pdx_shm_pool_layout(const struct pdx_model *m, uint32_t blocks,
				 struct pdx_kv_layout *out, uint64_t *size,
				 char *err, size_t errlen);

/* Unmaps and unlinks; safe on a zeroed or destroyed pool. */
void pdx_shm_pool_destroy(struct pdx_shm_pool *p);

/* The first byte of block `block` of tensor `tensor` of layer `layer`. */
static inline uint8_t *pdx_shm_pool_block(const struct pdx_shm_pool *p,
					  uint32_t layer, uint32_t tensor,
					  uint32_t block)
{
	const struct pdx_kv_layer *ly = &p->layout.layer[layer];

	return p->base + ly->base[tensor].offset +
	       (uint64_t)block * ly->block_stride;
}

#endif
