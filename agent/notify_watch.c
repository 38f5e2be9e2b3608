/* The collector's connections watched (the agent's sockets are main.c's:
 * the fuzz targets link notify.c without them). */
#define PDX_LOG_TOPIC "notify"
#include <stdio.h>
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
	uint16_t ev;
	uint32_t value;

	while (zmonitor_next(&t->mon, &ev, &value) == 0) {
		if (ev == ZMQ_EVENT_CONNECTED) {
			t->connected = true; /* its handshake says more */
		} else if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
			if (t->refused || (!t->met && !t->bound))
				log_info("--notify %s: the collector answers",
					 t->addr);
			t->refused = false;
			t->met = true;
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

/* No collector met within NOTIFY_BOUND_MS of start, and no handshake
 * failed either: nothing accepts a connection there (a loopback address
 * copied to another host, a name that does not resolve, a port nobody
 * binds). Said nowhere before: the proxy counted transfers that had
 * ended until its --transfer-timeout, and least-loaded routed around
 * an idle instance. Said once; a collector met later is said too. */
enum { NOTIFY_BOUND_MS = 3000 };

static void on_bound(evutil_socket_t fd, short what, void *arg)
{
	struct notify_target *t = arg;

	(void)fd, (void)what;
	on_handshake(-1, EV_READ, t); /* its fd is edge-triggered */
	event_free(t->bound);
	t->bound = NULL;
	if (t->met || t->refused || t->connected)
		return;
	log_warn("--notify %s: no collector reached in %d ms (nothing "
		 "listens there, or no such host from here): notifications "
		 "wait (1000 at most, then dropped) until one answers",
		 t->addr, NOTIFY_BOUND_MS);
}

int notify_watch(struct agent *a, struct notify_target *t, unsigned i)
{
	struct timeval bound = {NOTIFY_BOUND_MS / 1000,
				NOTIFY_BOUND_MS % 1000 * 1000};
	/* an HTTP server reads ZeroMQ's greeting as the start of a request
	 * line and waits: without a bound of its own the handshake fails
	 * only after ZeroMQ's 30 s */
	int handshake_ms = 3000;
	char name[32];

	snprintf(name, sizeof(name), "notify-%u", i);
	if (zmq_setsockopt(t->sock, ZMQ_HANDSHAKE_IVL, &handshake_ms,
			   sizeof(handshake_ms)) ||
	    zmonitor_open(a, &t->mon, t->sock, name,
			  ZMQ_EVENT_CONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
				  ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
				  ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
				  ZMQ_EVENT_HANDSHAKE_FAILED_AUTH,
			  on_handshake, t) ||
	    !(t->bound = evtimer_new(a->base, on_bound, t)) ||
	    evtimer_add(t->bound, &bound))
		return -1;
	on_handshake(-1, EV_READ, t); /* its fd is edge-triggered */
	return 0;
}

void notify_unwatch(struct notify_target *t)
{
	if (t->bound)
		event_free(t->bound);
	t->bound = NULL;
	zmonitor_close(&t->mon);
}
