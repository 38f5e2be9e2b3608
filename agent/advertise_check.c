/* Does our advertised address reach this agent? A peer answers our hello
 * at the address it carries ("from", our --advertise): one that reaches
 * nobody, or another agent, left every transfer this agent receives
 * failing "no answer to our hello from P" and the proxy blaming P, whose
 * breaker opened, though P was fine (a new user's find). So at start a
 * probe ({"op": "probe", "nonce"}) goes to that address on a DEALER of
 * its own; peer_dispatch.c takes it back. Not back within PROBE_BOUND_MS:
 * said, with what the connection's events tell (no such host, nobody
 * listening, another ZeroMQ peer), and a hello left unanswered then
 * blames this agent (xfer.c), until a message from any peer comes, which
 * proves peers reach us there (a NAT that does not hairpin: peers reach
 * the address, we do not; peer_dispatch.c). ZeroMQ keeps the probe
 * queued and connects again, so one that comes back late (a DNS record
 * made after we started) still counts. */
#define PDX_LOG_TOPIC "advertise"
#include <sys/random.h>
#include <zmq.h>

#include "agent/agent.h"
#include "agent/curve.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/tcp_addr.h"

enum { PROBE_BOUND_MS = 3000, RECONNECT_MAX_MS = 5000 };

/* What the probe's connection met, and whether that is sure: a host
 * name that does not resolve, a port where nothing listens, another
 * agent there are; packets dropped (a firewall, or a NAT that does not
 * let a host reach its own outside address while peers reach it) are
 * not, and blame nobody. */
static bool describe(struct advertise_check *c)
{
	if (connect_watch_joined(&c->conn)) {
		snprintf(c->why, sizeof(c->why), "another agent took it");
		return true;
	}
	return connect_watch_why(&c->conn, c->why, sizeof(c->why));
}

static void on_event(evutil_socket_t fd, short what, void *arg)
{
	(void)fd, (void)what;
	connect_watch_read(&((struct agent *)arg)->advertise.conn);
}

static void probe_close(struct advertise_check *c)
{
	connect_watch_close(&c->conn);
	if (c->sock)
		zmq_close(c->sock);
	c->sock = NULL;
}

static void on_bound(evutil_socket_t fd, short what, void *arg)
{
	struct agent *a = arg;
	struct advertise_check *c = &a->advertise;
	bool sure;

	(void)fd, (void)what;
	on_event(-1, 0, a); /* its fd is edge-triggered */
	if (c->reached || c->peer_heard) { /* its work is done */
		probe_close(c);
		return;
	}
	sure = describe(c);
	c->late = sure;
	if (sure)
		log_warn("--advertise %s does not reach this agent: a probe "
			 "sent there did not come back in %d ms (%s). Peers "
			 "answer this agent's hellos there, so the transfers "
			 "it receives fail \"no answer to our hello\"; give "
			 "--advertise the address its peers reach it at",
			 a->peer_addr, PROBE_BOUND_MS, c->why);
	else
		log_warn("--advertise %s may not reach this agent: a probe "
			 "sent there did not come back in %d ms (%s: a "
			 "firewall drops it, or a NAT does not let this host "
			 "reach its own outside address, which peers may "
			 "still reach). If peers cannot, the transfers this "
			 "agent receives fail \"no answer to our hello\"",
			 a->peer_addr, PROBE_BOUND_MS, c->why);
}

int advertise_check_start(struct agent *a)
{
	struct advertise_check *c = &a->advertise;
	struct peer_msg pm;
	struct timeval bound = { PROBE_BOUND_MS / 1000,
				 PROBE_BOUND_MS % 1000 * 1000 };
	int reconnect_max = RECONNECT_MAX_MS;

	c->loopback = pdx_tcp_addr_where(a->peer_addr) == PDX_TCP_HOST_LOOPBACK;
	/* with CURVE our own line of the peers file vouches for the probe;
	 * without it nothing is checked (a file of the others only) */
	if (a->curve && !pdx_curve_key_of(a->curve, a->peer_addr)) {
		log_info("--advertise %s not checked: --curve-peers lists no "
			 "key for it", a->peer_addr);
		return 0;
	}
	if (getrandom(c->nonce, sizeof(c->nonce), 0) != sizeof(c->nonce) ||
	    !(c->sock = peer_dealer_new(a, a->peer_addr)) ||
	    zmq_setsockopt(c->sock, ZMQ_RECONNECT_IVL_MAX, &reconnect_max,
			   sizeof(reconnect_max)) ||
	    connect_watch_open(a, &c->conn, c->sock, "advertise", on_event,
			       a) ||
	    !(c->timer = evtimer_new(a->base, on_bound, a)) ||
	    zmq_connect(c->sock, a->peer_addr) < 0)
		return -1;
	peer_msg_begin(&pm, a, "probe", NULL, NULL);
	pdx_mp_msg_bin(&pm.m, "nonce", c->nonce, sizeof(c->nonce));
	if (peer_msg_send_on(&pm, c->sock, a->peer_addr))
		return -1;
	c->sent = true;
	c->sent_ns = pdx_now_ns();
	evtimer_add(c->timer, &bound);
	return 0;
}

void advertise_check_stop(struct agent *a)
{
	struct advertise_check *c = &a->advertise;

	probe_close(c);
	if (c->timer)
		event_free(c->timer);
	c->timer = NULL;
}
