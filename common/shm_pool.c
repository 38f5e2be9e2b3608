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
#include <sys/statvfs.h>
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

/* Whether the existing object of that name was left by a process that
 * died: no one holds its lock (a live pool's creator takes it first
 * thing). Otherwise writes whose it is into err. */
static bool shm_stale(const char *name, char *err, size_t errlen)
{
	int fd = shm_open(name, O_RDWR, 0);
	char path[300];
	struct stat st;
	bool stale;

	snprintf(path, sizeof(path), "/dev/shm%s", name);
	if (fd < 0) {
		if (stat(path, &st) == 0 && st.st_uid != geteuid())
			snprintf(err, errlen,
				 "shm_open %s: it exists and belongs to uid %u, "
				 "not to this user (uid %u)",
				 name, (unsigned)st.st_uid, (unsigned)geteuid());
		else
			snprintf(err, errlen, "shm_open %s: it exists and "
				 "cannot be opened: %s", name, strerror(errno));
		return false;
	}
	stale = flock(fd, LOCK_EX | LOCK_NB) == 0;
	if (!stale)
		snprintf(err, errlen,
			 "shm_open %s: it exists and a live process holds it "
			 "(another pool's name: each must be unique on this "
			 "/dev/shm, also across PID namespaces sharing it)",
			 name);
	close(fd);
	return stale;
}

/* Creates the object afresh and takes its lock at once, before it is
 * sized and pre-faulted (seconds for a big pool): from its first moment
 * pdx_shm_pool_sweep() and shm_stale() see it alive. An object of that
 * name left by a process that died is replaced; one a live process holds,
 * or another user's, never is: err says whose. */
static int shm_create(const char *name, char *err, size_t errlen)
{
	int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);

	if (fd < 0 && errno == EEXIST) {
		if (!shm_stale(name, err, errlen))
			return -1;
		shm_unlink(name);
		fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
	}
	if (fd < 0) {
		snprintf(err, errlen, "shm_open %s: %s", name, strerror(errno));
		return -1;
	}
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		/* only a process that opened it in the instant since can hold
		 * it: not ours to fill */
		snprintf(err, errlen, "flock %s: %s", name, strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

int pdx_shm_reserve(int fd, uint64_t size, const char *what,
		    const char *smaller, char *err, size_t errlen)
{
	struct statvfs vfs;
	uint64_t avail = 0, total = 0;
	int rc;

	do
		rc = posix_fallocate(fd, 0, (off_t)size);
	while (rc == EINTR);
	if (rc != ENOSPC && rc != EFBIG)
		return 0; /* EOPNOTSUPP and the like: one that cannot say */
	if (fstatvfs(fd, &vfs) == 0) {
		avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
		total = (uint64_t)vfs.f_blocks * vfs.f_frsize;
	}
	snprintf(err, errlen,
		 "%s (%" PRIu64 " MiB) does not fit in /dev/shm (%" PRIu64
		 " MiB free of %" PRIu64 " MiB): give /dev/shm more room (a "
		 "container's is 64 MiB unless sized: docs/kubernetes.md) or "
		 "make it smaller (%s)",
		 what, size >> 20, avail >> 20, total >> 20, smaller);
	return -1;
}

static pdx_status_t map_pool(struct pdx_shm_pool *p, uint64_t size,
			     char *err, size_t errlen)
{
	int fd = shm_create(p->name, err, errlen);
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
	if (pdx_shm_reserve(fd, size, "the KV pool", "pdx-engine --kv-blocks",
			    err, errlen))
		goto unlink;
	base = mmap(NULL, size, PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_POPULATE, fd, 0);
	if (base == MAP_FAILED) {
		snprintf(err, errlen, "mmap %s (%" PRIu64 " bytes): %s",
			 p->name, size, strerror(errno));
		goto unlink;
	}
	/* The lock is held until the pool is destroyed, and by the kernel
	 * no longer once this process dies: pdx_shm_pool_sweep() tells an
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
	p->block_bytes = pdx_kv_layout_block_bytes(&layout);
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
