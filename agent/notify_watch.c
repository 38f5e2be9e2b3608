/* The collector's connections watched (the agent's sockets are main.c's:
 * the fuzz targets link notify.c without them). */
#define PDX_LOG_TOPIC "notify"
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "agent/agent.h"
#include "common/log.h"

/* The collector's handshakes as they happen: one that fails (no ZeroMQ
 * peer there: an HTTP port given for the proxy's --notify-bind) is said
 * once, until one succeeds. Said nowhere before, every notification was
 * dropped, and the proxy counted transfers that had ended until its
 * --transfer-timeout. */
static void on_handshake(evutil_socket_t fd, short what, void *arg)
{
	struct notify_target *t = arg;

	for (;;) {
		zmq_msg_t msg;
		uint16_t ev = 0;
		int more = 0;
		size_t len = sizeof(more);

		zmq_msg_init(&msg);
		if (zmq_msg_recv(&msg, t->mon, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&msg);
			return;
		}
		if (zmq_msg_size(&msg) >= sizeof(ev))
			memcpy(&ev, zmq_msg_data(&msg), sizeof(ev));
		if (!zmq_getsockopt(t->mon, ZMQ_RCVMORE, &more, &len) && more)
			zmq_msg_recv(&msg, t->mon, 0); /* the endpoint */
		zmq_msg_close(&msg);
		if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
			if (t->refused)
				log_info("--notify %s: the collector answers",
					 t->addr);
			t->refused = false;
		} else if (!t->refused) {
			t->refused = true;
			log_warn("--notify %s: what listens there is no ZeroMQ "
				 "collector (its handshake failed): is it the "
				 "proxy's --notify-bind? Notifications are "
				 "dropped until one answers",
				 t->addr);
		}
	}
}

int notify_watch(struct agent *a, struct notify_target *t, unsigned i)
{
	/* an HTTP server reads ZeroMQ's greeting as the start of a request
	 * line and waits: without a bound of its own the handshake fails
	 * only after ZeroMQ's 30 s */
	int linger = 0, unbounded = 0, handshake_ms = 3000, fd;
	size_t len = sizeof(fd);
	char mon[48];

	snprintf(mon, sizeof(mon), "inproc://pdx-agent-notify-%u", i);
	t->mon = zmq_socket(a->zctx, ZMQ_PAIR);
	if (!t->mon ||
	    zmq_setsockopt(t->sock, ZMQ_HANDSHAKE_IVL, &handshake_ms,
			   sizeof(handshake_ms)) ||
	    zmq_setsockopt(t->mon, ZMQ_LINGER, &linger, sizeof(linger)) ||
	    zmq_setsockopt(t->mon, ZMQ_RCVHWM, &unbounded,
			   sizeof(unbounded)) ||
	    zmq_socket_monitor(t->sock, mon,
			       ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
				   ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
				   ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
				   ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) ||
	    zmq_connect(t->mon, mon) ||
	    zmq_getsockopt(t->mon, ZMQ_FD, &fd, &len))
		return -1;
	t->mon_ev = event_new(a->base, fd, EV_READ | EV_PERSIST, on_handshake,
			      t);
	if (!t->mon_ev || event_add(t->mon_ev, NULL))
		return -1;
	on_handshake(fd, EV_READ, t); /* its fd is edge-triggered */
	return 0;
}

/* The monitor stops before its reader closes (libpdx's link.c says why:
 * ZeroMQ's I/O thread could wait on a reader gone). */
void notify_unwatch(struct notify_target *t)
{
	if (t->sock)
		zmq_socket_monitor(t->sock, NULL, 0);
	if (t->mon_ev)
		event_free(t->mon_ev);
	t->mon_ev = NULL;
	if (t->mon)
		zmq_close(t->mon);
	t->mon = NULL;
}
