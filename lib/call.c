/* A public call's entry and exit on an engine: what an engine author can
 * get wrong about whose engine it is, refused there with why instead of
 * left to crash or hang deeper down.
 *
 * Two threads at once: a struct pdx_engine belongs to one thread at a
 * time (its ZeroMQ sockets, its tables). A call that finds another one
 * under way on the same engine fails at once (PDX_EINVAL); it touches
 * nothing of the engine, last_error included (the other thread's call
 * owns it), and the first such call on an engine is logged. Overlapping
 * calls are only caught when they do overlap: the lock an engine needs is
 * still the engine's.
 *
 * pdx_engine_free() from another thread while a call is under way (a
 * Python Engine.close() beside a thread in wait_event(None)) is the one
 * overlap taken in stride: freed there and then, the engine went from
 * under the call, whose wait failed on a closed socket and which then
 * wrote into freed memory. The free marks the engine instead, wakes the
 * call's wait (an eventfd every wait polls, written and never read: each
 * later wait of the call returns at once too), and the call returns
 * PDX_EINVAL and frees the engine as it leaves. Two flags and a third,
 * FREEING, for the free's own use of the engine after marking it: of the
 * free and the call's exit, the one that finishes last frees. A call that
 * starts after pdx_engine_free() returned uses freed memory, as always.
 *
 * A forked child: the engine's ZeroMQ context belongs to the process that
 * connected it (its I/O thread is not in the child, whose waits on it
 * fail with EINTR forever). Every call but pdx_engine_free() fails there
 * with PDX_EINVAL; the child connects an engine of its own. A child is
 * told from its parent by a fork generation, not by getpid(): the check
 * is on every call, layer_done's once a layer among them, and a load
 * costs nothing where a system call does not.
 */
#define PDX_LOG_TOPIC "engine"

#include "lib/client.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/log.h"

/* Forks this process has been through: each child starts one past its
 * parent (fork() runs the handler in the child, single-threaded). A child
 * made without fork()'s handlers (vfork, posix_spawn) only execs. */
static unsigned fork_generation;
static pthread_once_t forks_once = PTHREAD_ONCE_INIT;
static int forks_watch_err;

static void forked_child_bump(void)
{
	__atomic_add_fetch(&fork_generation, 1, __ATOMIC_RELAXED);
}

static void forks_watch(void)
{
	forks_watch_err = pthread_atfork(NULL, NULL, forked_child_bump);
}

pdx_status_t pdx__fork_generation(unsigned *out)
{
	pthread_once(&forks_once, forks_watch);
	if (forks_watch_err)
		return PDX_ENOMEM;
	*out = __atomic_load_n(&fork_generation, __ATOMIC_RELAXED);
	return PDX_OK;
}

bool pdx__forked(const struct pdx_engine *e)
{
	return __atomic_load_n(&fork_generation, __ATOMIC_RELAXED) !=
	       e->fork_generation;
}

/* The refusal of a call made while another thread is in one (call). */
static pdx_status_t busy(struct pdx_engine *e, const char *call)
{
	const char *other = __atomic_load_n(&e->call, __ATOMIC_RELAXED);

	/* once per engine: a loop of refused calls floods nothing */
	if (!__atomic_exchange_n(&e->told_busy, 1, __ATOMIC_RELAXED))
		log_error("pdx_engine_%s: another thread is in pdx_engine_%s "
			  "on this engine; an engine belongs to one thread at "
			  "a time (lock around its calls)",
			  call, other ? other : "?");
	return PDX_EINVAL;
}

/* The refusal of a call in a forked child. */
static pdx_status_t forked(struct pdx_engine *e, const char *call)
{
	return pdx__fail(e, PDX_EINVAL,
			 "%s: this engine was connected by process %d, this "
			 "is %d (forked): connect another here; this one may "
			 "only be freed",
			 call, (int)e->pid, (int)getpid());
}

pdx_status_t pdx__enter(struct pdx_engine *e, const char *call)
{
	int was;

	if (!e)
		return PDX_EINVAL;
	was = __atomic_fetch_or(&e->busy, PDX__BUSY_CALL, __ATOMIC_ACQUIRE);
	if (was & PDX__BUSY_CALL)
		return busy(e, call);
	__atomic_store_n(&e->call, call, __ATOMIC_RELAXED);
	pdx__why_clear(e);
	/* came while pdx_engine_free() runs in another thread: not one to
	 * run, but the one to free the engine, as it leaves */
	if (was & PDX__BUSY_FREED)
		return pdx__leave(e, pdx__freed_fail(e, call));
	if (pdx__forked(e))
		return pdx__leave(e, forked(e, call));
	return PDX_OK;
}

pdx_status_t pdx__leave(struct pdx_engine *e, pdx_status_t st)
{
	int was =
	    __atomic_fetch_and(&e->busy, ~PDX__BUSY_CALL, __ATOMIC_ACQ_REL);

	/* freed during the call, and the free is done with the engine */
	if ((was & (PDX__BUSY_FREED | PDX__BUSY_FREEING)) == PDX__BUSY_FREED)
		e->destroy(e);
	return st;
}

bool pdx__free_defer(struct pdx_engine *e)
{
	int was = __atomic_fetch_or(
	    &e->busy, PDX__BUSY_FREED | PDX__BUSY_FREEING, __ATOMIC_ACQ_REL);

	if (!(was & PDX__BUSY_CALL))
		return false;
	/* The call leaves the engine to us until FREEING is off. */
	log_warn("pdx_engine_free: another thread is in pdx_engine_%s on "
		 "this engine; freed as that call returns (it fails)",
		 __atomic_load_n(&e->call, __ATOMIC_RELAXED));
	if (eventfd_write(e->wake, 1))
		log_warn("pdx_engine_free: cannot wake the other thread's "
			 "wait: %s; it frees the engine when it returns",
			 strerror(errno));
	was =
	    __atomic_fetch_and(&e->busy, ~PDX__BUSY_FREEING, __ATOMIC_ACQ_REL);
	/* the call still runs (and frees as it leaves), or it returned
	 * meanwhile and, seeing FREEING, left the engine to us */
	return was & PDX__BUSY_CALL;
}

bool pdx__freed(const struct pdx_engine *e)
{
	return __atomic_load_n(&e->busy, __ATOMIC_ACQUIRE) & PDX__BUSY_FREED;
}

pdx_status_t pdx__freed_fail(struct pdx_engine *e, const char *what)
{
	return pdx__fail(e, PDX_EINVAL,
			 "%s: the engine was freed by another thread "
			 "(pdx_engine_free) during the call",
			 what);
}
