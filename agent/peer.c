/* The peers we know: one DEALER each for what we send them (our ROUTER
 * takes what they send), found by address, and what their handshake
 * left here, dropped by peer_reset(). See docs/protocol.md section 2;
 * handshake.c fills a peer in, peer_dispatch.c reads its messages. */
#define PDX_LOG_TOPIC "peer"
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <zmq.h>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/log.h"

/* cut: its operations are ended (the UCX endpoint closed, not kept for
 * the next handshake). */
static void ep_kept_close(struct peer_ep_kept *k, bool cut)
{
	for (uint32_t i = 0; i < k->n_rkeys; i++)
		pdx_ucx_rkey_free(k->rkeys[i]);
	free(k->rkeys);
	if (cut)
		pdx_ucx_ep_cut(k->ep);
	else
		pdx_ucx_ep_close(k->ep);
	free(k);
}

/* Whether x needs its peer's endpoint: operations of ours in flight on
 * it, or the peer's gets of our memory (a pull we send, the peer's
 * "stopped" awaited): our worker answers them as they come on the
 * endpoint's connection, and drops one whose endpoint it closed, unheard
 * of (over TCP the connection may stay, the peer's own endpoints on it):
 * the peer's get never ended. */
static bool ep_needed(const struct xfer *x)
{
	return x->inflight ||
	       (x->role == XFER_SEND && x->pull && x->await_stopped);
}

/* Whether p's endpoint is needed: those of its transfers that need it
 * now are marked as on k. */
static bool ep_in_use(struct agent *a, struct peer *p, struct peer_ep_kept *k)
{
	struct xfer *x, *tmp;
	bool used = false;

	HASH_ITER(hh, a->xfers, x, tmp) {
		if (x->peer != p || !ep_needed(x) || x->ep_kept)
			continue;
		x->ep_kept = k;
		used = true;
	}
	return used;
}

/* A pull's receiver that closed its endpoint at its sender's "gone" cut
 * its gets short and said "stopped" at once, while the sender's UCX
 * worker (over TCP) still had answers to them queued: the sender let go
 * of the dead engine's memory at that word, and its worker's next answer
 * read unmapped memory (SIGSEGV). Kept, the gets end as the sender's
 * worker answers them, and "stopped" comes after. The sender, its new
 * engine's handshake made, keeps its old endpoint for them likewise. */
static bool ep_keep(struct agent *a, struct peer *p)
{
	struct peer_ep_kept *k = calloc(1, sizeof(*k));
	struct pdx_ucx_rkey **rkeys = calloc(p->n_regions + 1, sizeof(*rkeys));

	/* (out of memory: closed, as before) */
	if (!k || !rkeys || !ep_in_use(a, p, k)) {
		free(rkeys);
		free(k);
		return false;
	}
	k->rkeys = rkeys;
	k->ep = p->ep;
	k->kept_ns = pdx_now_ns();
	pdx_ucx_ep_mute(k->ep); /* a new handshake's transfers are not its */
	for (uint32_t i = 0; i < p->n_regions; i++) {
		k->rkeys[k->n_rkeys++] = p->regions[i].rkey;
		p->regions[i].rkey = NULL;
	}
	k->next = p->ep_kept;
	p->ep_kept = k;
	a->peers_ep_kept++;
	log_debug("peer %s: our endpoint to it kept until our operations on "
		  "it ended", p->addr);
	return true;
}

/* Whether transfers still need k, and it is not stuck: an operation of
 * theirs finished within --peer-timeout-ms (or k was kept since). Stuck
 * (the peer frozen, its data connection cut: *stuck), k is cut, which
 * ends them, as for a peer found lost (liveness.c): a peer whose
 * handshake was dropped is not watched for silence. */
static bool ep_kept_used(struct agent *a, struct peer *p,
			 struct peer_ep_kept *k, bool *stuck)
{
	uint64_t bound = (uint64_t)a->cfg.peer_timeout_ms * 1000000ULL;
	uint64_t last = k->kept_ns, now;
	struct xfer *x, *tmp;
	bool used = false;

	HASH_ITER(hh, a->xfers, x, tmp) {
		if (x->ep_kept != k || !ep_needed(x))
			continue;
		used = true;
		if (!xfer_ops_out(x)) /* it only waits for room: not stuck */
			last = pdx_now_ns();
		else if (x->op_done_ns > last)
			last = x->op_done_ns;
	}
	if (!used)
		return false;
	now = pdx_now_ns();
	if (now - last <= bound)
		return true;
	log_warn("peer %s: our operations on the endpoint kept for them "
		 "finished nothing in %u ms: it is cut, which ends them",
		 p->addr, a->cfg.peer_timeout_ms);
	*stuck = true;
	return false;
}

static void ep_kept_drop(struct agent *a, struct peer *p, bool all)
{
	struct peer_ep_kept **kp = &p->ep_kept;

	while (*kp) {
		struct peer_ep_kept *k = *kp;
		struct xfer *x, *tmp;
		bool stuck = false;

		if (!all && ep_kept_used(a, p, k, &stuck)) {
			kp = &k->next;
			continue;
		}
		HASH_ITER(hh, a->xfers, x, tmp)
			if (x->ep_kept == k) {
				x->ep_kept = NULL;
				x->ep_kept_cut = all || stuck;
			}
		*kp = k->next;
		a->peers_ep_kept--;
		/* its UCX endpoint is the handshake's too (one per peer
		 * worker, transport/ucx.h): cut, it stays open while the
		 * handshake holds it, so the peer is lost (liveness.c),
		 * which ends what is on it and meets the peer afresh */
		if (stuck && pdx_ucx_ep_same(k->ep, p->ep))
			p->stuck = true;
		ep_kept_close(k, all || stuck);
	}
}

void peers_kept_release(struct agent *a)
{
	struct peer *p, *tmp;

	if (!a->peers_ep_kept)
		return;
	HASH_ITER(hh, a->peers, p, tmp)
		if (p->ep_kept)
			ep_kept_drop(a, p, false);
}

/* peer_reset(), keeping the endpoint transfers still need (keep), or
 * closing it with the others (peer_cut). */
static void peer_drop(struct agent *a, struct peer *p, bool keep)
{
	bool kept = keep && p->ep && ep_keep(a, p); /* its rkeys with it */

	for (uint32_t i = 0; i < p->n_regions; i++) {
		pdx_ucx_rkey_free(p->regions[i].rkey);
		if (p->regions[i].map)
			munmap(p->regions[i].map, p->regions[i].size);
		if (p->regions[i].dptr)
			gpu_mem_close(p->agent->gpu, p->regions[i].dptr);
	}
	free(p->regions);
	p->regions = NULL;
	p->n_regions = 0;
	staged_peer_gone(a, p);
	staged_peer_unmap(a, p);
	p->staged_shared = false;
	/* closed, the UCX endpoint stays open for our next handshake with
	 * that worker (ucx.h); cut, it ends what is still on it */
	if (!kept && keep)
		pdx_ucx_ep_close(p->ep);
	else if (!kept)
		pdx_ucx_ep_cut(p->ep);
	p->ep = NULL;
	p->ep_failed = false;
	p->ep_renew = false;
	free(p->layout.layer);
	p->layout.layer = NULL;
	p->state = PEER_NEW;
	p->instance = 0;
}

void peer_reset(struct agent *a, struct peer *p)
{
	peer_drop(a, p, true);
}

void peer_cut(struct agent *a, struct peer *p)
{
	peer_drop(a, p, false);
	ep_kept_drop(a, p, true);
}

void peer_free(struct agent *a, struct peer *p)
{
	peer_cut(a, p);
	free(p->worker);
	if (a->peer_return)
		a->peer_return->closed(a, p);
	zmq_close(p->dealer);
	HASH_DEL(a->peers, p);
	free(p);
}

static void xfer_name_peers(struct xfer *x)
{
	if (x->peer)
		x->peer->named = true;
	for (uint32_t i = 0; i < x->n_held_also; i++)
		x->held_also[i]->named = true;
}

void peers_mark_named(struct agent *a)
{
	struct peer *p, *tmp;
	struct xfer *x, *xtmp;

	HASH_ITER(hh, a->peers, p, tmp)
		p->named = false;
	HASH_ITER(hh, a->xfers, x, xtmp)
		xfer_name_peers(x);
	for (x = a->dead; x; x = x->next_dead)
		xfer_name_peers(x);
}

/* Room for one more peer: at PEERS_MAX, the peer no transfer names
 * (in flight, or ended with operations still out) that we know least
 * goes, one without a handshake before one with, the longest silent
 * first. Any message with a new "from" makes a peer, each with a
 * DEALER (a descriptor, and one of the 1023 sockets of ZeroMQ's
 * context), and none went: pings from a few thousand made-up addresses
 * (or agents of pods come and gone) took every socket, and a new peer
 * was then never answered, with nothing logged. An evicted one that
 * speaks again is met afresh, as a restarted agent is. */
static bool peer_make_room(struct agent *a)
{
	struct peer *p, *tmp, *victim = NULL;

	if (HASH_COUNT(a->peers) < PEERS_MAX)
		return true;
	peers_mark_named(a);
	HASH_ITER(hh, a->peers, p, tmp) {
		if (p->named)
			continue;
		if (!victim ||
		    (peer_known(victim) && !peer_known(p)) ||
		    (peer_known(victim) == peer_known(p) &&
		     p->heard_ns < victim->heard_ns))
			victim = p;
	}
	if (!victim) {
		static uint64_t said_ns; /* each new address says it */

		if (pdx_once_a_second(&said_ns))
			log_warn("%u peers, each with transfers: no room for "
				 "another", HASH_COUNT(a->peers));
		return false;
	}
	log_debug("peer %s forgotten: %u peers at most", victim->addr,
		  PEERS_MAX);
	peer_free(a, victim);
	return true;
}

void *peer_dealer_new(struct agent *a, const char *addr)
{
	void *d = zmq_socket(a->zctx, ZMQ_DEALER);
	int linger = 0, hwm = 10000, rcvhwm = 16;
	/* what comes back on it is a hello_nack at most (peer_return.c) */
	int64_t rcvmax = 16384;
	/* ZeroMQ's heartbeats: ours, but not below 100 ms (a ping every
	 * millisecond is CPU, and a connection given 2 ms to answer under
	 * load was dropped and made again without end); 1 s at least to
	 * answer or to connect */
	int beat = a->cfg.heartbeat_ms < 100 ? 100 : (int)a->cfg.heartbeat_ms;
	int silent = 2 * beat < 1000 ? 1000 : 2 * beat;
	int connect = beat < 1000 ? 1000 : beat;

	if (!d) {
		log_warn("no socket for peer %s: %s", addr,
			 zmq_strerror(zmq_errno()));
		return NULL;
	}
	zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof(linger));
	zmq_setsockopt(d, ZMQ_SNDHWM, &hwm, sizeof(hwm));
	zmq_setsockopt(d, ZMQ_RCVHWM, &rcvhwm, sizeof(rcvhwm));
	zmq_setsockopt(d, ZMQ_MAXMSGSIZE, &rcvmax, sizeof(rcvmax));
	/* A connection whose far end is gone (its reset lost or filtered,
	 * across a partition) looks established to our kernel, which
	 * retransmits into it on a backed-off timer: what we sent after the
	 * link healed waited seconds behind it (hellos unanswered, two
	 * requests failed after a 5 s cut). ZeroMQ's pings close one silent
	 * for two heartbeats, and it reconnects (what it wrote is still
	 * delivered to a peer only frozen, whose kernel took it, and what
	 * is queued goes on the new connection); a connect that hangs is
	 * given up after a heartbeat and tried again (bounds above). */
	zmq_setsockopt(d, ZMQ_HEARTBEAT_IVL, &beat, sizeof(beat));
	zmq_setsockopt(d, ZMQ_HEARTBEAT_TIMEOUT, &silent, sizeof(silent));
	zmq_setsockopt(d, ZMQ_CONNECT_TIMEOUT, &connect, sizeof(connect));
	if (a->curve && pdx_curve_client(a->curve, d, addr)) {
		zmq_close(d);
		return NULL;
	}
	return d;
}

struct peer *peer_lookup(struct agent *a, const char *addr, bool create)
{
	struct peer *p = NULL;

	HASH_FIND_STR(a->peers, addr, p);
	if (p || !create || !peer_make_room(a))
		return p;
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	snprintf(p->addr, sizeof(p->addr), "%s", addr);
	p->agent = a;
	p->heard_ns = pdx_now_ns(); /* its silence counts from now */
	p->sn_told = -1; /* no "ucx_ep" said yet */
	p->dealer = peer_dealer_new(a, addr);
	if (!p->dealer)
		goto free_p;
	if (a->peer_return)
		a->peer_return->opened(a, p); /* its connects from the first */
	if (zmq_connect(p->dealer, addr) < 0) {
		log_warn("cannot connect to peer %s: %s", addr,
			 zmq_strerror(zmq_errno()));
		if (a->peer_return)
			a->peer_return->closed(a, p);
		zmq_close(p->dealer);
		goto free_p;
	}
	HASH_ADD_STR(a->peers, addr, p);
	return p;

free_p:
	free(p);
	return NULL;
}

void peer_send_to_addr(struct agent *a, const char *addr, const char *op,
		       const struct pdx_xfer_id *xfer, const char *reason)
{
	struct peer *p = peer_lookup(a, addr, true);

	if (p)
		peer_send(a, p, op, xfer, reason);
}

void peers_free(struct agent *a)
{
	struct peer *p, *tmp;

	HASH_ITER(hh, a->peers, p, tmp)
		peer_free(a, p);
}
