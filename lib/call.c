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

#include <pthread.h>
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
	if (!e)
		return PDX_EINVAL;
	if (__atomic_exchange_n(&e->busy, 1, __ATOMIC_ACQUIRE))
		return busy(e, call);
	__atomic_store_n(&e->call, call, __ATOMIC_RELAXED);
	pdx__why_clear(e);
	if (pdx__forked(e))
		return pdx__leave(e, forked(e, call));
	return PDX_OK;
}

pdx_status_t pdx__leave(struct pdx_engine *e, pdx_status_t st)
{
	__atomic_store_n(&e->busy, 0, __ATOMIC_RELEASE);
	return st;
}
