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
 * one closed, and each message says which one it came on (ZMQ_SRCFD).
 * The kernel may give a closed connection's descriptor to the next one;
 * ZeroMQ says the close before it closes the descriptor, so that event
 * is in the monitor before any message of a connection that reuses it,
 * and the monitor is read before each engine message off ZeroMQ. */
#define PDX_LOG_TOPIC "engine"
#include <zmq.h>

#include "agent/agent.h"

void engine_watch_drain(struct agent *a)
{
	uint16_t ev;
	uint32_t fd;

	while (zmonitor_next(&a->engine_mon, &ev, &fd) == 0)
		if (ev == ZMQ_EVENT_DISCONNECTED && a->reg.ok &&
		    (int)fd == a->reg.engine_fd)
			engine_gone(a);
}

static void on_event(evutil_socket_t fd, short what, void *arg)
{
	struct agent *a = arg;

	engine_watch_drain(a);
	a->settle(a); /* what the engine's end started */
}

int engine_watch_start(struct agent *a)
{
	if (zmonitor_open(a, &a->engine_mon, a->engine_sock, "engine",
			  ZMQ_EVENT_DISCONNECTED, on_event, a))
		return -1;
	engine_watch_drain(a); /* its fd is edge-triggered */
	return 0;
}

void engine_watch_stop(struct agent *a)
{
	zmonitor_close(&a->engine_mon);
}
