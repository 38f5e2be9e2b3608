/* A POSIX shared-memory object whose creator holds its lock while it
 * lives (the KV pool, the agent's GPU staging), so that one left in
 * /dev/shm by a process that died is told from a live one: nobody holds
 * its lock. That holds across PID namespaces sharing /dev/shm, where the
 * pid in a name says nothing.
 *
 * Returns codes and writes reasons into the caller's buffer; logs
 * nothing. Any thread may call; an object's fd is its caller's.
 */
#ifndef PDX_COMMON_SHM_OBJECT_H
#define PDX_COMMON_SHM_OBJECT_H

#include <stddef.h>
#include <stdint.h>

/* Creates the object `name` ("/..."), 0600, and locks it (flock
 * LOCK_EX) at once, before it is sized and filled (seconds for a big
 * pool): from its first moment pdx_shm_object_sweep() sees it alive.
 * Closing the fd (or the process's death) releases the lock, so keep it
 * open while the object lives. An object of that name left by a process
 * that died is replaced; one a live process holds, or another user's,
 * never is. Returns the fd, or -1 with why in err (whose it is, there). */
int pdx_shm_object_create(const char *name, char *err, size_t errlen);

/* Allocates the pages of the object fd (size bytes) now, while a
 * /dev/shm too small for it can still be said: found full later, it is a
 * SIGBUS at the write that needs a page. 0 (also where the file system
 * cannot say), or -1 with why in err: what (e.g. "the KV pool") does not
 * fit, and smaller, the option that makes it smaller. */
int pdx_shm_object_reserve(int fd, uint64_t size, const char *what,
			   const char *smaller, char *err, size_t errlen);

/* pdx_shm_object_create() locks an object microseconds after making it:
 * one younger than this may be in that instant; one left by a dead
 * process is as old as that process was. */
#define PDX_SHM_OBJECT_SWEEP_MIN_AGE_S 1

/* Removes the objects named `prefix`* (e.g. "pdx-engine-") that were
 * left by a process that died without removing them: no process holds
 * their lock, and they are at least min_age_s old (so one being created
 * is not taken for one). Returns how many it removed. */
int pdx_shm_object_sweep(const char *prefix, int min_age_s);

#endif
