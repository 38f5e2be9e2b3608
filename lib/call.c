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
 * with PDX_EINVAL; the child connects an engine of its own.
 */
#define PDX_LOG_TOPIC "engine"

#include "lib/client.h"

#include <unistd.h>

#include "common/log.h"

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
	if (getpid() != e->pid)
		return pdx__leave(e, forked(e, call));
	return PDX_OK;
}

pdx_status_t pdx__leave(struct pdx_engine *e, pdx_status_t st)
{
	__atomic_store_n(&e->busy, 0, __ATOMIC_RELEASE);
	return st;
}
