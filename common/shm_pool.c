/* Creating and destroying the shared-memory KV pool. */
#include "common/shm_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

/* Creates the object afresh: a name left over by a run that died is
 * unlinked first (callers put their pid in the name). */
static int shm_create(const char *name)
{
	int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);

	if (fd < 0 && errno == EEXIST) {
		shm_unlink(name);
		fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
	}
	return fd;
}

static pdx_status_t map_pool(struct pdx_shm_pool *p, uint64_t size,
			     char *err, size_t errlen)
{
	int fd = shm_create(p->name);
	void *base;

	if (fd < 0) {
		snprintf(err, errlen, "shm_open %s: %s", p->name,
			 strerror(errno));
		return PDX_EIO;
	}
	if (ftruncate(fd, (off_t)size)) {
		snprintf(err, errlen, "ftruncate %s to %" PRIu64 " bytes: %s",
			 p->name, size, strerror(errno));
		goto unlink;
	}
	base = mmap(NULL, size, PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_POPULATE, fd, 0);
	if (base == MAP_FAILED) {
		snprintf(err, errlen, "mmap %s (%" PRIu64 " bytes): %s",
			 p->name, size, strerror(errno));
		goto unlink;
	}
	/* Held until the pool is destroyed, and by the kernel no longer
	 * once this process dies: pdx_shm_pool_sweep() tells an object left
	 * by a dead process from a live one by it. */
	if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
		p->lock_fd = fd;
		p->has_lock = true;
	} else {
		close(fd);
	}
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
	p->block_bytes = pdx_kv_layout_block_bytes(&layout);
	p->layout = layout;
	p->region = (struct pdx_engine_region){
		.type = PDX_MEM_SHM,
		.shm_name = p->name,
		.size = p->size,
	};
	return PDX_OK;
}

void pdx_shm_pool_destroy(struct pdx_shm_pool *p)
{
	if (p->base)
		munmap(p->base, p->size);
	if (p->name[0])
		shm_unlink(p->name);
	if (p->has_lock)
		close(p->lock_fd);
	free(p->layout.layer);
	memset(p, 0, sizeof(*p));
}

int pdx_shm_pool_sweep(const char *prefix, int min_age_s)
{
	DIR *d = opendir("/dev/shm");
	size_t plen = strlen(prefix);
	struct dirent *e;
	int removed = 0;

	if (!d)
		return 0;
	while ((e = readdir(d)) != NULL) {
		char name[300];
		struct stat st;
		int fd;

		if (strncmp(e->d_name, prefix, plen) != 0)
			continue;
		snprintf(name, sizeof(name), "/%s", e->d_name);
		fd = shm_open(name, O_RDWR, 0);
		if (fd < 0)
			continue;
		if (fstat(fd, &st) == 0 &&
		    time(NULL) - st.st_ctime >= min_age_s &&
		    flock(fd, LOCK_EX | LOCK_NB) == 0) {
			shm_unlink(name);
			removed++;
		}
		close(fd);
	}
	closedir(d);
	return removed;
}
