/* The engine link's connections watched: when the registered engine's
 * ZeroMQ connection closes, the engine is gone (it exited or was killed:
 * the kernel closes its sockets; or it freed its handle), and its
 * registration ends at once (engine_gone()). Its memory must not wait
 * for the next register: GPU memory stays allocated while any process
 * has it open by CUDA IPC, and a pool in /dev/shm stays while mapped, so
 * an engine restarted in its place found the memory it needs held by
 * the agents (its own and its peers') of the one before.
 *
 * A connection is told by its descriptor: ZeroMQ's monitor says which
 * one was accepted and which closed, and each message says which one it
 * came on (ZMQ_SRCFD). The kernel may give a closed connection's
 * descriptor to the next one. ZeroMQ says a close before it closes the
 * descriptor, and an accept before the connection's first message, and
 * the monitor is read before each engine message off ZeroMQ: so a
 * message on a descriptor whose last event was its close is left over
 * from a connection that closed (an engine that registered and died
 * before we read it), and is dropped; registered, it would never be
 * retired. */
#define PDX_LOG_TOPIC "engine"
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "agent/agent.h"
#include "common/log.h"

/* Marks descriptor fd closed (or open again): a byte per descriptor,
 * grown to the highest one seen. */
static void mark(struct engine_watch *w, uint32_t fd, bool closed)
{
	if (fd >= w->n) {
		size_t n = w->n ? w->n : 64;
		uint8_t *c;

		if (!closed)
			return; /* never closed: open by default */
		while (n <= fd)
			n *= 2;
		if (!(c = realloc(w->closed, n)))
			return; /* unknown: taken as open, as before */
		memset(c + w->n, 0, n - w->n);
		w->closed = c;
		w->n = n;
	}
	w->closed[fd] = closed;
}

void engine_watch_drain(struct agent *a)
{
	struct engine_watch *w = &a->engine_watch;
	uint16_t ev;
	uint32_t fd;

	while (zmonitor_next(&w->mon, &ev, &fd) == 0) {
		mark(w, fd, ev == ZMQ_EVENT_DISCONNECTED);
		if (ev == ZMQ_EVENT_DISCONNECTED && a->reg.ok &&
		    (int)fd == a->reg.engine_fd)
			engine_gone(a);
	}
}

bool engine_watch_closed(struct agent *a, int fd)
{
	const struct engine_watch *w = &a->engine_watch;

	return fd >= 0 && (size_t)fd < w->n && w->closed[fd];
}

static void on_event(evutil_socket_t fd, short what, void *arg)
{
	struct agent *a = arg;

	engine_watch_drain(a);
	a->settle(a); /* what the engine's end started */
}

int engine_watch_start(struct agent *a)
{
	if (zmonitor_open(a, &a->engine_watch.mon, a->engine_sock, "engine",
			  ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED,
			  on_event, a))
		return -1;
	engine_watch_drain(a); /* its fd is edge-triggered */
	return 0;
}

void engine_watch_stop(struct agent *a)
{
	zmonitor_close(&a->engine_watch.mon);
	free(a->engine_watch.closed);
	a->engine_watch.closed = NULL;
	a->engine_watch.n = 0;
}
