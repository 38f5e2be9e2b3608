/* Can a peer hear our answers? We answer a peer at the address its
 * messages carry ("from": its --advertise), on a DEALER of ours. One that
 * we cannot reach there while its own host can (a firewall that lets
 * only local connections in to its port, a name only its own host
 * resolves) never heard our hello_ack: its transfers failed "no answer
 * to our hello" blaming us, and a proxy opened our breaker for the
 * peer's --advertise (every prefill instance's, for one such decode
 * instance). Its own probe (advertise_check.c) cannot see this.
 *
 * So a new peer's DEALER is watched until a connection of it joins
 * (connect_watch.c), and a hello of its that we took while we have not
 * reached it is answered again after RETURN_BOUND_MS by a hello_nack
 * {"unreachable": true} over the very connection the hello came on (our
 * ROUTER, to its DEALER), saying what our connects met: its transfers
 * with us then fail at its hello's bound blaming its own address (its
 * hello_ack, queued, still wins should our connects join meanwhile).
 * Each agent reads its DEALERs for that answer (on_reply). A watch with
 * no hello to answer for IDLE_MS ends (any message with a made-up "from"
 * makes a peer). Installed by main.c as a->peer_return; the fuzz harness
 * leaves it out. */
#define PDX_LOG_TOPIC "peer"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/log.h"

enum {
	/* two of ZeroMQ's 1023 sockets and two descriptors each: within
	 * AGENT_FDS_BASE's margin over an idle agent's */
	RETURN_WATCHES_MAX = 8,
	RETURN_BOUND_MAX_MS = 2000,
	IDLE_MS = 10000,
};

struct peer_return {
	struct connect_watch conn; /* our DEALER's connects to the peer */
	struct event *bound;	   /* a hello of its waits, or IDLE_MS */
	uint8_t route[256];	   /* that hello's connection (our ROUTER) */
	size_t route_len;	   /* 0: no hello waits */
	bool said;		   /* a hello_nack went: joining is news */
};

static void arm(struct event *ev, unsigned ms)
{
	struct timeval tv = { ms / 1000, ms % 1000 * 1000 };

	evtimer_add(ev, &tv);
}

static void watch_end(struct agent *a, struct peer *p)
{
	struct peer_return *r = p->ret;

	if (!r)
		return;
	connect_watch_close(&r->conn);
	if (r->bound)
		event_free(r->bound);
	free(r);
	p->ret = NULL;
	a->peer_returns--;
}

/* Reads the connects' events; true once a connection joined (the watch
 * then ends: a peer reached is not watched again). */
static bool joined(struct agent *a, struct peer *p)
{
	struct peer_return *r = p->ret;

	connect_watch_read(&r->conn);
	if (!connect_watch_joined(&r->conn))
		return false;
	if (r->said)
		log_info("peer %s reached now: its hellos are answered there",
			 p->addr);
	watch_end(a, p);
	return true;
}

static void on_conn_event(evutil_socket_t fd, short what, void *arg)
{
	struct peer *p = arg;

	(void)fd, (void)what;
	joined(p->agent, p);
}

/* Without CURVE anyone may ask, so the reason does not say what our
 * connects met (which would tell a stranger what listens where from
 * here); our log does. */
static void tell(struct agent *a, struct peer *p, const char *why)
{
	struct peer_return *r = p->ret;
	char reason[PDX_REASON_MAX];
	struct peer_msg pm;

	snprintf(reason, sizeof(reason),
		 "%s cannot reach %s, where the hello asks to be answered%s%s%s:"
		 " its --advertise must be an address peers reach, through "
		 "any firewall",
		 a->peer_addr, p->addr, a->curve ? " (" : "",
		 a->curve ? why : "", a->curve ? ")" : "");
	peer_msg_begin(&pm, a, "hello_nack", NULL, reason);
	pdx_mp_msg_bool(&pm.m, "unreachable", true);
	peer_msg_reply(&pm, a->peer_sock, r->route, r->route_len, p->addr);
}

static void on_bound(evutil_socket_t fd, short what, void *arg)
{
	static uint64_t said_ns;
	struct peer *p = arg;
	struct agent *a = p->agent;
	struct peer_return *r = p->ret;
	char why[48];

	(void)fd, (void)what;
	if (joined(a, p))
		return;
	if (!r->route_len) { /* no hello of its for IDLE_MS */
		watch_end(a, p);
		return;
	}
	connect_watch_why(&r->conn, why, sizeof(why));
	if (pdx_once_a_second(&said_ns))
		log_warn("peer %s: cannot reach it there to answer its hello "
			 "(%s): told so over the connection the hello came "
			 "on", p->addr, why);
	tell(a, p, why);
	r->said = true;
	r->route_len = 0;
	arm(r->bound, IDLE_MS);
	a->settle(a);
}

/* What the peer answers on our DEALER: only a hello_nack of the above
 * (peer_dispatch.c). ZMQ_FD is edge-triggered: drained each time, and
 * looked at again after each send on the DEALER (sent below). */
static void on_reply(evutil_socket_t fd, short what, void *arg)
{
	struct peer *p = arg;
	struct agent *a = p->agent;

	(void)fd, (void)what;
	for (;;) {
		zmq_msg_t m;

		zmq_msg_init(&m);
		if (zmq_msg_recv(&m, p->dealer, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&m);
			break;
		}
		peer_on_reply(a, p, zmq_msg_data(&m), zmq_msg_size(&m));
		zmq_msg_close(&m);
	}
	a->settle(a);
}

static void opened(struct agent *a, struct peer *p)
{
	static unsigned n;
	static uint64_t said_ns;
	struct peer_return *r;
	char name[32];
	int fd = -1;
	size_t len = sizeof(fd);

	if (!zmq_getsockopt(p->dealer, ZMQ_FD, &fd, &len) &&
	    (p->reply_ev = event_new(a->base, fd, EV_READ | EV_PERSIST,
				     on_reply, p)))
		event_add(p->reply_ev, NULL);
	if (a->peer_returns >= RETURN_WATCHES_MAX) {
		if (pdx_once_a_second(&said_ns))
			log_debug("peer %s: not watched, %u peers are",
				  p->addr, a->peer_returns);
		return;
	}
	if (!(r = calloc(1, sizeof(*r))))
		return;
	snprintf(name, sizeof(name), "return-%u", n++);
	p->ret = r;
	a->peer_returns++;
	if (connect_watch_open(a, &r->conn, p->dealer, name, on_conn_event,
			       p) ||
	    !(r->bound = evtimer_new(a->base, on_bound, p)))
		watch_end(a, p);
	else
		arm(r->bound, IDLE_MS);
}

static void answered(struct agent *a, struct peer *p)
{
	unsigned ms = a->cfg.handshake_timeout_ms / 2;
	struct peer_return *r = p->ret;

	if (!r || !a->peer_route || a->peer_route_len > sizeof(r->route) ||
	    joined(a, p))
		return;
	if (r->route_len) /* a hello already waits: its bound holds */
		return;
	memcpy(r->route, a->peer_route, a->peer_route_len);
	r->route_len = a->peer_route_len;
	arm(r->bound, ms < RETURN_BOUND_MAX_MS ? ms : RETURN_BOUND_MAX_MS);
}

static void sent(struct peer *p)
{
	int events = 0;
	size_t len = sizeof(events);

	if (p->reply_ev &&
	    !zmq_getsockopt(p->dealer, ZMQ_EVENTS, &events, &len) &&
	    (events & ZMQ_POLLIN))
		event_active(p->reply_ev, EV_READ, 0);
}

/* Our connects to p never joined, and what they met is sure (no such
 * host here, nothing listens there, our CURVE key refused): a hello of
 * ours unanswered says it, where it said "is an agent listening there"
 * whatever they met. One that something took with no handshake of it
 * is left to those words, which ask about CURVE on both sides: so it
 * goes between an agent with CURVE and one without. */
static bool unreached(struct agent *a, struct peer *p, char *why, size_t len)
{
	const struct connect_watch *w;

	if (!p->ret || joined(a, p))
		return false;
	w = &p->ret->conn;
	if (!(w->seen & ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) &&
	    (w->seen & (ZMQ_EVENT_CONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
			ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)))
		return false;
	return connect_watch_why(w, why, len);
}

static void closed(struct agent *a, struct peer *p)
{
	watch_end(a, p);
	if (p->reply_ev)
		event_free(p->reply_ev);
	p->reply_ev = NULL;
}

const struct peer_return_ops peer_return_ops = {
	.opened = opened,
	.answered = answered,
	.sent = sent,
	.unreached = unreached,
	.closed = closed,
};
