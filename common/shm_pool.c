/* Creating and destroying the shared-memory KV pool. */
#include "common/shm_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
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

/* NAME, NAME-2, ... NAME-16: engines of as many PID namespaces with one
 * pid in one /dev/shm */
#define SHM_NAME_TRIES 16

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

/* Whether fd is still the object called name (nobody unlinked it and
 * made another of that name meanwhile). */
static bool same_object(int fd, const char *name)
{
	struct stat a, b;
	int nfd = shm_open(name, O_RDONLY, 0);
	bool same;

	if (nfd < 0)
		return false;
	same = fstat(fd, &a) == 0 && fstat(nfd, &b) == 0 &&
	       a.st_dev == b.st_dev && a.st_ino == b.st_ino;
	close(nfd);
	return same;
}

/* Creates a new object, locked (flock, until the process closes it or
 * dies), named after base: base itself, else base-2, base-3, ...; the
 * name taken in name. An object of that name that nobody holds was left
 * by a process that died (callers put their pid in base) and is
 * replaced. One that a live process holds is left alone: a pid names a
 * process only within its PID namespace, and processes of several
 * namespaces may share one /dev/shm (containers of a Kubernetes pod,
 * each engine the PID 1 of its own container). Returns the fd, or -1
 * with errno set. */
static int shm_create(const char *base, char *name, size_t len)
{
	for (int n = 1; n <= SHM_NAME_TRIES; n++) {
		int fd, old;

		if (n == 1)
			snprintf(name, len, "%s", base);
		else if ((size_t)snprintf(name, len, "%s-%d", base, n) >= len)
			break;
		fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
		if (fd < 0 && errno == EEXIST) {
			old = shm_open(name, O_RDWR, 0);
			if (old >= 0 && flock(old, LOCK_EX | LOCK_NB) == 0)
				shm_unlink(name); /* its process died */
			if (old >= 0)
				close(old);
			fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
		}
		if (fd < 0) {
			if (errno == EEXIST)
				continue; /* a live process's */
			return -1;
		}
		/* another process starting at this moment may have taken it
		 * for a dead one's before the lock: then the name is its */
		if (flock(fd, LOCK_EX | LOCK_NB) == 0 && same_object(fd, name))
			return fd;
		close(fd);
	}
	errno = EEXIST;
	return -1;
}

static pdx_status_t map_pool(struct pdx_shm_pool *p, const char *base_name,
			     uint64_t size, char *err, size_t errlen)
{
	int fd = shm_create(base_name, p->name, sizeof(p->name));
	struct statvfs vfs;
	void *base;
	int rc;

	if (fd < 0) {
		snprintf(err, errlen, "shm_open %s: %s", base_name,
			 strerror(errno));
		p->name[0] = '\0';
		return PDX_EIO;
	}
	if (ftruncate(fd, (off_t)size)) {
		snprintf(err, errlen, "ftruncate %s to %" PRIu64 " bytes: %s",
			 p->name, size, strerror(errno));
		goto unlink;
	}
	/* The pages now, while a full /dev/shm can still be said: one
	 * found full later is a SIGBUS at the write that needs a page. */
	do
		rc = posix_fallocate(fd, 0, (off_t)size);
	while (rc == EINTR);
	if (rc == ENOSPC || rc == EFBIG) {
		uint64_t avail = 0, total = 0;

		if (fstatvfs(fd, &vfs) == 0) {
			avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
			total = (uint64_t)vfs.f_blocks * vfs.f_frsize;
		}
		snprintf(err, errlen,
			 "the KV pool (%" PRIu64 " MiB) does not fit in "
			 "/dev/shm (%" PRIu64 " MiB free of %" PRIu64 " MiB): "
			 "give /dev/shm more room (a container's is 64 MiB "
			 "unless sized: docs/kubernetes.md) or make the pool "
			 "smaller (pdx-engine --kv-blocks)",
			 size >> 20, avail >> 20, total >> 20);
		goto unlink;
	}
	/* EOPNOTSUPP and the like: a file system that cannot say, as before */
	base = mmap(NULL, size, PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_POPULATE, fd, 0);
	if (base == MAP_FAILED) {
		snprintf(err, errlen, "mmap %s (%" PRIu64 " bytes): %s",
			 p->name, size, strerror(errno));
		goto unlink;
	}
	/* The lock is held until the pool is destroyed, and by the kernel
	 * no longer once this process dies: pdx_shm_pool_sweep() and
	 * shm_create() tell an object left by a dead process from a live
	 * one by it. */
	p->lock_fd = fd;
	p->has_lock = true;
	p->base = base;
	p->size = size;
	return PDX_OK;
unlink:
	shm_unlink(p->name);
	close(fd);
	p->name[0] = '\0';
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
	st = map_pool(p, shm_name, size, err, errlen);
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
