/* Shared-memory objects locked while they live: created, reserved, told
 * stale and swept (shm_object.h). */
#include "common/shm_object.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* Whether the existing object of that name was left by a process that
 * died: no one holds its lock (a live object's creator takes it first
 * thing). Otherwise writes whose it is into err. */
static bool shm_object_stale(const char *name, char *err, size_t errlen)
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

int pdx_shm_object_create(const char *name, char *err, size_t errlen)
{
	int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);

	if (fd < 0 && errno == EEXIST) {
		if (!shm_object_stale(name, err, errlen))
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

int pdx_shm_object_reserve(int fd, uint64_t size, const char *what,
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

int pdx_shm_object_sweep(const char *prefix, int min_age_s)
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
