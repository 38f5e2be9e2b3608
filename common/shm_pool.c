/* Creating and destroying the shared-memory KV pool. */
#include "common/shm_pool.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/shm_object.h"

pdx_status_t pdx_shm_pool_layout(const struct pdx_model *m, uint32_t blocks,
				 struct pdx_kv_layout *out, uint64_t *size,
				 char *err, size_t errlen)
{
	struct pdx_kv_layer *ly;
	uint64_t bb;

	if (blocks == 0) {
		snprintf(err, errlen, "bad pool size");
		return PDX_EINVAL;
	}
	bb = (uint64_t)m->block_tokens * m->kv_heads * m->head_dim *
	     m->dtype_bytes;
	if (bb == 0 || bb % 8) {
		snprintf(err, errlen,
			 "block bytes %" PRIu64 " is not a multiple of 8", bb);
		return PDX_EINVAL;
	}
	ly = calloc(m->layers, sizeof(*ly));
	if (!ly) {
		snprintf(err, errlen, "out of memory");
		return PDX_ENOMEM;
	}
	for (uint32_t l = 0; l < m->layers; l++) {
		for (uint32_t t = 0; t < m->tensors; t++)
			ly[l].base[t].offset =
				((uint64_t)m->tensors * l + t) * blocks * bb;
		ly[l].block_stride = bb;
	}
	*out = (struct pdx_kv_layout){
		.layers = m->layers,
		.tensors = m->tensors,
		.blocks = blocks,
		.block_tokens = m->block_tokens,
		.kv_heads = m->kv_heads,
		.head_dim = m->head_dim,
		.dtype_bytes = m->dtype_bytes,
		.order = PDX_KV_NHD,
		.layer = ly,
	};
	*size = bb * blocks * m->tensors * m->layers;
	return PDX_OK;
}

static pdx_status_t map_pool(struct pdx_shm_pool *p, uint64_t size,
			     char *err, size_t errlen)
{
	int fd = pdx_shm_object_create(p->name, err, errlen);
	struct stat st;
	void *base;

	if (fd < 0)
		return PDX_EIO;
	if (fstat(fd, &st)) {
		snprintf(err, errlen, "fstat %s: %s", p->name, strerror(errno));
		goto unlink;
	}
	if (ftruncate(fd, (off_t)size)) {
		snprintf(err, errlen, "ftruncate %s to %" PRIu64 " bytes: %s",
			 p->name, size, strerror(errno));
		goto unlink;
	}
	if (pdx_shm_object_reserve(fd, size, "the KV pool",
				   "pdx-engine --kv-blocks", err, errlen))
		goto unlink;
	base = mmap(NULL, size, PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_POPULATE, fd, 0);
	if (base == MAP_FAILED) {
		snprintf(err, errlen, "mmap %s (%" PRIu64 " bytes): %s",
			 p->name, size, strerror(errno));
		goto unlink;
	}
	/* The lock is held until the pool is destroyed, and by the kernel
	 * no longer once this process dies: pdx_shm_object_sweep() tells an
	 * object left by a dead process from a live one by it. */
	p->lock_fd = fd;
	p->has_lock = true;
	p->dev = st.st_dev;
	p->ino = st.st_ino;
	p->base = base;
	p->size = size;
	return PDX_OK;
unlink:
	close(fd);
	shm_unlink(p->name);
	return PDX_EIO;
}

pdx_status_t pdx_shm_pool_create(struct pdx_shm_pool *p, const char *shm_name,
				 const struct pdx_model *m, uint32_t blocks,
				 char *err, size_t errlen)
{
	struct pdx_kv_layout layout;
	pdx_status_t st;
	uint64_t size;

	memset(p, 0, sizeof(*p));
	if (!shm_name || strlen(shm_name) >= sizeof(p->name)) {
		snprintf(err, errlen, "bad pool name");
		return PDX_EINVAL;
	}
	st = pdx_shm_pool_layout(m, blocks, &layout, &size, err, errlen);
	if (st != PDX_OK)
		return st;
	snprintf(p->name, sizeof(p->name), "%s", shm_name);
	st = map_pool(p, size, err, errlen);
	if (st != PDX_OK) {
		free(layout.layer);
		memset(p, 0, sizeof(*p));
		return st;
	}
	p->block_bytes = layout.layer[0].block_stride; /* each layer's: bb */
	p->layout = layout;
	p->region = (struct pdx_engine_region){
		.type = PDX_MEM_SHM,
		.shm_name = p->name,
		.size = p->size,
	};
	return PDX_OK;
}

/* The name still names our object, not one another process made after
 * ours was unlinked (by hand, say), which is not ours to remove. */
static bool shm_still_ours(const struct pdx_shm_pool *p)
{
	char path[300];
	struct stat st;

	snprintf(path, sizeof(path), "/dev/shm%s", p->name);
	return stat(path, &st) == 0 && st.st_dev == p->dev &&
	       st.st_ino == p->ino;
}

void pdx_shm_pool_destroy(struct pdx_shm_pool *p)
{
	if (p->base)
		munmap(p->base, p->size);
	if (p->has_lock && shm_still_ours(p))
		shm_unlink(p->name);
	if (p->has_lock)
		close(p->lock_fd);
	free(p->layout.layer);
	memset(p, 0, sizeof(*p));
}
