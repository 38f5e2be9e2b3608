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

/* Allocates the pages of the shared-memory object fd (size bytes) now,
 * while a /dev/shm too small for it can still be said: found full later,
 * it is a SIGBUS at the write that needs a page. 0 (also where the file
 * system cannot say), or -1 with why in err: what (e.g. "the KV pool")
 * does not fit, and smaller, the option that makes it smaller. */
int pdx_shm_reserve(int fd, uint64_t size, const char *what,
		    const char *smaller, char *err, size_t errlen);

/* Its creator locks a pool microseconds after making it (shm_create):
 * one younger than this may be in that instant; one left by a dead
 * process is as old as that process was. */
#define PDX_SHM_SWEEP_MIN_AGE_S 1

/* Removes the shared-memory objects named `prefix`* (e.g. "pdx-engine-")
 * that were left by a process that died without destroying its pool: no
 * process holds their lock, and they are at least min_age_s old (so a
 * pool being created is not taken for one). Works across PID namespaces
 * that share /dev/shm. Returns how many it removed. */
int pdx_shm_pool_sweep(const char *prefix, int min_age_s);

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
