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
 * (connect_watch.c), and a hello the peer sends meanwhile is answered
 * again within RETURN_BOUND_MS, by a hello_nack {"unreachable": true}
 * over the very connection the hello came on (our ROUTER, to its
 * DEALER), saying what our connects met: its transfers with us then fail
 * blaming its own address. Each agent reads its DEALERs for that answer
 * (on_reply). Installed by main.c as a->peer_return; the fuzz harness
 * leaves it out. */
#define PDX_LOG_TOPIC "peer"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/log.h"

enum { RETURN_WATCHES_MAX = 32, RETURN_BOUND_MAX_MS = 2000 };

struct peer_return {
	struct connect_watch conn; /* our DEALER's connects to the peer */
	struct event *bound;	   /* a hello of its waits on them */
	uint8_t route[256];	   /* that hello's connection (our ROUTER) */
	size_t route_len;
	bool said;		   /* a hello_nack went: joining is news */
};

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
	p->agent->settle(p->agent);
}

static void on_bound(evutil_socket_t fd, short what, void *arg)
{
	static uint64_t said_ns;
	struct peer *p = arg;
	struct agent *a = p->agent;
	struct peer_return *r = p->ret;
	char why[48], reason[PDX_REASON_MAX];
	struct peer_msg pm;

	(void)fd, (void)what;
	if (joined(a, p))
		return;
	connect_watch_why(&r->conn, why, sizeof(why));
	snprintf(reason, sizeof(reason),
		 "%s cannot reach %s, the address the hello gave to answer "
		 "at (%s): that agent's --advertise must be an address its "
		 "peers reach, through any firewall",
		 a->peer_addr, p->addr, why);
	if (pdx_once_a_second(&said_ns))
		log_warn("peer %s: cannot reach it there to answer its hello "
			 "(%s): told so over the connection the hello came "
			 "on", p->addr, why);
	r->said = true;
	peer_msg_begin(&pm, a, "hello_nack", NULL, reason);
	pdx_mp_msg_bool(&pm.m, "unreachable", true);
	peer_msg_reply(&pm, a->peer_sock, r->route, r->route_len, p->addr);
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
	struct peer_return *r;
	char name[32];
	int fd = -1;
	size_t len = sizeof(fd);

	if (!zmq_getsockopt(p->dealer, ZMQ_FD, &fd, &len) &&
	    (p->reply_ev = event_new(a->base, fd, EV_READ | EV_PERSIST,
				     on_reply, p)))
		event_add(p->reply_ev, NULL);
	/* its two sockets are two of ZeroMQ's 1023: a few at a time */
	if (a->peer_returns >= RETURN_WATCHES_MAX ||
	    !(r = calloc(1, sizeof(*r))))
		return;
	snprintf(name, sizeof(name), "return-%u", n++);
	p->ret = r;
	a->peer_returns++;
	if (connect_watch_open(a, &r->conn, p->dealer, name, on_conn_event,
			       p) ||
	    !(r->bound = evtimer_new(a->base, on_bound, p)))
		watch_end(a, p);
}

static void answered(struct agent *a, struct peer *p)
{
	unsigned ms = a->cfg.handshake_timeout_ms / 2;
	struct peer_return *r = p->ret;
	struct timeval tv;

	if (!r || !a->peer_route || a->peer_route_len > sizeof(r->route) ||
	    joined(a, p))
		return;
	memcpy(r->route, a->peer_route, a->peer_route_len);
	r->route_len = a->peer_route_len;
	if (evtimer_pending(r->bound, NULL))
		return;
	if (ms > RETURN_BOUND_MAX_MS)
		ms = RETURN_BOUND_MAX_MS;
	tv.tv_sec = ms / 1000;
	tv.tv_usec = ms % 1000 * 1000;
	evtimer_add(r->bound, &tv);
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
	.closed = closed,
};
