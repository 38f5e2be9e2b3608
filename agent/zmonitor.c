/* ZeroMQ socket monitors, read from the agent's loop: the collector's
 * handshakes (notify_watch.c) and the engine link's connections
 * (engine_watch.c). */
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "agent/agent.h"

int zmonitor_open(struct agent *a, struct zmonitor *z, void *sock,
		  const char *name, int events, event_callback_fn cb,
		  void *arg)
{
	/* No bound on the monitor's queue (RCVHWM 0): ZeroMQ's I/O thread
	 * must never wait on us to read it (it holds the monitor's lock). */
	int linger = 0, unbounded = 0, fd;
	size_t len = sizeof(fd);
	char addr[64];

	snprintf(addr, sizeof(addr), "inproc://pdx-agent-%s", name);
	z->sock = sock;
	z->mon = zmq_socket(a->zctx, ZMQ_PAIR);
	if (!z->mon ||
	    zmq_setsockopt(z->mon, ZMQ_LINGER, &linger, sizeof(linger)) ||
	    zmq_setsockopt(z->mon, ZMQ_RCVHWM, &unbounded,
			   sizeof(unbounded)) ||
	    zmq_socket_monitor(sock, addr, events) ||
	    zmq_connect(z->mon, addr) ||
	    zmq_getsockopt(z->mon, ZMQ_FD, &fd, &len))
		return -1;
	z->ev = event_new(a->base, fd, EV_READ | EV_PERSIST, cb, arg);
	if (!z->ev || event_add(z->ev, NULL))
		return -1;
	return 0;
}

int zmonitor_next(struct zmonitor *z, uint16_t *event, uint32_t *value)
{
	zmq_msg_t msg;
	int more = 0;
	size_t len = sizeof(more);
	uint8_t head[6] = { 0 };

	if (!z->mon)
		return -1;
	zmq_msg_init(&msg);
	if (zmq_msg_recv(&msg, z->mon, ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&msg);
		return -1;
	}
	/* the first frame: the event (16 bits), then its value (32 bits) */
	memcpy(head, zmq_msg_data(&msg),
	       zmq_msg_size(&msg) < sizeof(head) ? zmq_msg_size(&msg)
						 : sizeof(head));
	memcpy(event, head, sizeof(*event));
	memcpy(value, head + 2, sizeof(*value));
	if (!zmq_getsockopt(z->mon, ZMQ_RCVMORE, &more, &len) && more)
		zmq_msg_recv(&msg, z->mon, 0); /* the endpoint */
	zmq_msg_close(&msg);
	return 0;
}

/* The monitor stops before its reader closes (libpdx's link.c says why:
 * ZeroMQ's I/O thread could wait on a reader gone). */
void zmonitor_close(struct zmonitor *z)
{
	if (z->sock && z->mon)
		zmq_socket_monitor(z->sock, NULL, 0);
	if (z->ev)
		event_free(z->ev);
	if (z->mon)
		zmq_close(z->mon);
	memset(z, 0, sizeof(*z));
}
