/* What a DEALER's connects met, read from its ZeroMQ events: a host name
 * that does not resolve, a port where nothing listens (or no route), a
 * ZeroMQ peer that is not one of ours, packets dropped, or a peer that
 * took the connection. The agent's probe of its own address
 * (advertise_check.c) and its check that it can answer a peer at the
 * address the peer gives (peer_return.c) both read it. */
#include <stdio.h>
#include <zmq.h>

#include "agent/agent.h"
#include "common/clock.h"

/* a connect that ends sooner was refused; later, it timed out */
#define REFUSED_WITHIN_NS 300000000ULL

int connect_watch_open(struct agent *a, struct connect_watch *w, void *sock,
		       const char *name, event_callback_fn cb, void *arg)
{
	return zmonitor_open(a, &w->mon, sock, name, ZMQ_EVENT_ALL, cb, arg);
}

void connect_watch_read(struct connect_watch *w)
{
	uint16_t ev;
	uint32_t value;

	while (zmonitor_next(&w->mon, &ev, &value) == 0) {
		w->seen |= ev;
		if (ev == ZMQ_EVENT_CONNECT_DELAYED) {
			w->trying_ns = pdx_now_ns();
		} else if (w->trying_ns && (ev == ZMQ_EVENT_CLOSED ||
					    ev == ZMQ_EVENT_CONNECT_RETRIED)) {
			if (pdx_now_ns() - w->trying_ns < REFUSED_WITHIN_NS)
				w->refused = true;
			else
				w->dropped = true;
			w->trying_ns = 0;
		} else if (ev == ZMQ_EVENT_CONNECTED) {
			w->trying_ns = 0;
		}
	}
}

bool connect_watch_joined(const struct connect_watch *w)
{
	return w->seen & ZMQ_EVENT_HANDSHAKE_SUCCEEDED;
}

bool connect_watch_why(const struct connect_watch *w, char *why, size_t len)
{
	const char *s;
	bool sure = true;

	if (w->seen & ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
		s = "an agent there refused our CURVE key";
	else if (w->seen & (ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
		       ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
		       ZMQ_EVENT_CONNECTED))
		s = "no agent of ours listens there";
	else if (w->refused)
		s = "nothing listens there, or no route";
	else if (w->dropped || w->trying_ns) {
		s = "no answer from there";
		sure = false;
	} else
		s = "no such host here";
	snprintf(why, len, "%s", s);
	return sure;
}

void connect_watch_close(struct connect_watch *w)
{
	zmonitor_close(&w->mon);
}
