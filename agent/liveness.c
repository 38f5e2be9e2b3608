/* Liveness: heartbeats, leases and dead peers (docs/protocol.md, "ping").
 *
 * Every --heartbeat-ms an agent pings each peer it has transfers with. The
 * ping lists the transfers our engine holds queued for that peer, which
 * renews their senders' leases: the prefill side keeps a prompt's KV as
 * long as a live decode side still means to ask for it, and frees it soon
 * after one that does not. A peer that says nothing at all for
 * --peer-timeout-ms while transfers with it are under way is dead: they
 * fail (and it is told, should it be only slow), and the next transfer
 * with it begins with a fresh hello, so a restarted peer is met afresh.
 * Idle peers we hold a handshake with are pinged too, so that one that
 * restarts or dies between transfers is noticed before the next one. */
#define PDX_LOG_TOPIC "peer"
#include <stdlib.h>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/stall.h"
#include "common/log.h"

static bool held_for(const struct xfer *x, const struct peer *p)
{
	bool with = x->peer == p;

	for (uint32_t i = 0; !with && i < x->n_held_also; i++)
		with = x->held_also[i] == p;
	return with && x->role == XFER_RECV && x->held && !x->announced &&
	       !x->finished;
}

/* {"op": "ping", "hold": [xfer ids our engine holds queued for p]} */
static void send_ping(struct agent *a, struct peer *p)
{
	struct xfer *x, *tmp;
	struct peer_msg pm;
	uint32_t n = 0;

	HASH_ITER(hh, a->xfers, x, tmp)
		n += held_for(x, p);
	peer_msg_begin(&pm, a, "ping", NULL, NULL);
	msgpack_pack_array(pdx_mp_msg_key(&pm.m, "hold"), n);
	HASH_ITER(hh, a->xfers, x, tmp) {
		if (held_for(x, p))
			pdx_mp_bin(&pm.m.pk, x->id.b, sizeof(x->id.b));
	}
	peer_msg_send(&pm, p);
}

/* The peer is lost (why): its transfers fail, and its handshake with
 * them. */
static void peer_lost(struct agent *a, struct peer *p, const char *why)
{
	struct xfer *x, *tmp;

	log_warn("peer %s: %s: its transfers fail", p->addr, why);
	p->watched = false;
	HASH_ITER(hh, a->xfers, x, tmp) {
		if (x->peer != p)
			continue;
		if (!x->finished)
			xfer_fail(x, PDX_EPEER, true, "peer %s: %s", p->addr,
				  why);
		xfer_stop_heard(x); /* it will not answer: the endpoint goes */
	}
	/* Data still on its way over a dead link must not land in blocks
	 * our engine may reuse now, nor hold ours: the endpoint goes. A
	 * hello goes out at once, so a peer that was only stopped finds a
	 * fresh handshake waiting when it runs again. */
	peer_cut(a, p);
	peer_get(a, p->addr);
}

/* Operations of a transfer wait on the peer's UCX endpoint, which
 * finished none for the bound: its data connection is stuck while the
 * peer link answers (a firewall that drops UCX's ports,
 * docs/deployment.md). UCX gives up on a connection only after the
 * kernel's SYN retries (minutes): the endpoint is closed, which ends
 * them. A transfer that ended waits for them, holding the engine's
 * blocks. One under way waited for its own bound (--xfer-timeout-ms, 30
 * s, "timed out" the decode engine's only word): it now fails at twice
 * the bound, saying why, where its holds are UCX operations only (the
 * put and am lanes; not TP legs on the am lane, nor the GPU lanes, which
 * also hold while they wait for a layer's event; a wait for room for
 * slices, slice_bufs.c, is no UCX operation and not counted), the peer
 * link answers (a silent peer is liveness's below, with its own words)
 * and our own loop ran (we_stalled: nothing could finish meanwhile).
 * Twice: an endpoint made anew after a failure may take a while to
 * connect over TCP, and a bound of one silence cut it. Marks such
 * peers. */
static bool ops_stuck(const struct xfer *x, uint64_t now, uint64_t bound,
		      bool we_stalled)
{
	const struct peer *p = x->peer;

	if (!xfer_ops_out(x) || !peer_known(p) || x->ep_kept ||
	    now - p->ucx_done_ns <= bound)
		return false;
	if (x->finished) /* (on an endpoint kept for them: peer.c) */
		return !x->ep_kept_cut && now - x->ended_ns > bound;
	return !we_stalled && now - x->ops_since_ns > 2 * bound &&
	       now - p->ucx_done_ns > 2 * bound &&
	       now - p->heard_ns <= bound / 2 &&
	       (p->path == DATA_PUT || (p->path == DATA_AM && !x->group));
}

static void stuck_peers(struct agent *a, uint64_t now, uint64_t bound,
			bool we_stalled)
{
	struct xfer *x, *tmp;

	HASH_ITER(hh, a->xfers, x, tmp) {
		if (peer_known(x->peer) &&
		    x->op_done_ns > x->peer->ucx_done_ns)
			x->peer->ucx_done_ns = x->op_done_ns;
	}
	/* (those on an endpoint kept for them have its bound: peer.c, and
	 * are not the peer's new handshake's, even once it was cut: their
	 * operations end with it) */
	HASH_ITER(hh, a->xfers, x, tmp)
		if (ops_stuck(x, now, bound, we_stalled))
			x->peer->stuck = true;
}

static void on_beat(evutil_socket_t fd, short what, void *arg)
{
	struct agent *a = arg;
	uint64_t now = pdx_now_ns();
	uint64_t bound = (uint64_t)a->cfg.peer_timeout_ms * 1000000ULL;
	uint64_t period = (uint64_t)a->cfg.heartbeat_ms * 1000000ULL;
	/* We did not run for a while: whoever looked silent could not be
	 * heard. Their silence counts from now. A late beat counts as that
	 * only when it took half the silence bound: with a heartbeat of a
	 * few ms every beat is "late" by that much on a busy host, and
	 * silences that restart at every beat never end (a frozen or
	 * cut-off peer was then never found dead, and each beat logged a
	 * warning). */
	uint64_t stalled = pdx_stall_check(
	    &a->beat_ns, now, 2 * period > bound / 2 ? 2 * period : bound / 2);
	bool we_stalled = stalled != 0;
	struct peer *p, *ptmp;
	struct xfer *x, *xtmp;
	char why[PDX_REASON_MAX];

	/* a known hold is said as such, not as a stall of unknown cause */
	if (we_stalled && a->held_by)
		log_info("the loop was held %llu ms (%s): silences count from "
			 "now", (unsigned long long)(stalled / 1000000),
			 a->held_by);
	else if (we_stalled)
		log_warn("no heartbeat for %llu ms: silences count from now",
			 (unsigned long long)(stalled / 1000000));
	a->held_by = NULL;
	HASH_ITER(hh, a->peers, p, ptmp)
		p->busy = false;
	HASH_ITER(hh, a->xfers, x, xtmp) {
		/* one awaiting "stopped" waits on the peer too: its loss
		 * ends the wait */
		if (x->peer && (!x->finished || x->await_stopped))
			x->peer->busy = true;
		/* the other senders it is held with: pinged with it too */
		for (uint32_t i = 0; !x->finished && i < x->n_held_also; i++)
			x->held_also[i]->busy = true;
	}
	/* Peers without a handshake that no transfer names, silent for a
	 * silence bound, are forgotten (an agent of a pod replaced with
	 * another address, an address that never answered, a made-up
	 * "from"): kept, each one's DEALER went on reconnecting every
	 * 100 ms for the agent's life. One that speaks again is met
	 * afresh. A dead peer with a handshake loses it first (below). */
	if (!we_stalled) {
		peers_mark_named(a);
		HASH_ITER(hh, a->peers, p, ptmp) {
			/* a hello we sent (peer_lost's) waits a bound too */
			uint64_t last = p->heard_ns > p->hello_sent_ns
					    ? p->heard_ns
					    : p->hello_sent_ns;

			if (p->named || peer_known(p) || now - last <= bound)
				continue;
			log_debug("peer %s forgotten: no transfer, silent "
				  "for %llu ms", p->addr,
				  (unsigned long long)((now - last) / 1000000));
			peer_free(a, p);
		}
	}
	/* a transfer that failed while waiting for room for slices behind
	 * buffers that hang is released now, not when they end */
	slice_bufs_resume(a);
	/* (peer.c marks those whose endpoint kept for ended transfers is
	 * stuck too) */
	stuck_peers(a, now, bound, we_stalled);
	HASH_ITER(hh, a->peers, p, ptmp) {
		if (!p->stuck)
			continue;
		p->stuck = false;
		snprintf(why, sizeof(why),
			 "its UCX data connection finished nothing for over "
			 "%u ms (a firewall between the hosts must let UCX's "
			 "ports through)",
			 a->cfg.peer_timeout_ms);
		peer_lost(a, p, why);
	}
	HASH_ITER(hh, a->peers, p, ptmp) {
		/* Idle peers we hold a handshake with are pinged too: one
		 * that restarted answers with a hello (its new instance), so
		 * our next transfer with it does not go by the old one's
		 * handshake; one that died loses its handshake, so the next
		 * transfer meets it afresh. */
		/* never answered our hello: its transfers wait for that
		 * answer, bounded by --handshake-timeout-ms, whose failure
		 * says why ("no answer to our hello ... CURVE ...?"); it is
		 * not "silent", we never heard it (both bounds are 5 s by
		 * default, and this one said it first) */
		if ((!p->busy && !peer_known(p)) ||
		    (!peer_known(p) && p->state == PEER_HELLO_SENT)) {
			p->watched = false;
			continue;
		}
		if (!p->watched || we_stalled) {
			/* Its silence counts from now, not from long ago. */
			p->watched = true;
			p->heard_ns = now;
		}
		if (now - p->heard_ns > bound && p->busy) {
			snprintf(why, sizeof(why),
				 "silent for %llu ms (heartbeats unanswered)",
				 (unsigned long long)((now - p->heard_ns) /
						      1000000));
			peer_lost(a, p, why);
			continue;
		}
		if (now - p->heard_ns > bound) {
			log_info("peer %s silent for %llu ms: its handshake is dropped",
				 p->addr,
				 (unsigned long long)((now - p->heard_ns) / 1000000));
			p->watched = false;
			peer_cut(a, p);
			continue;
		}
		send_ping(a, p);
	}
	a->settle(a);
}

int liveness_start(struct agent *a)
{
	struct timeval tv = { a->cfg.heartbeat_ms / 1000,
			      (a->cfg.heartbeat_ms % 1000) * 1000 };

	a->beat_ev = event_new(a->base, -1, EV_PERSIST, on_beat, a);
	if (!a->beat_ev || event_add(a->beat_ev, &tv))
		return -1;
	return 0;
}

void liveness_stop(struct agent *a)
{
	if (a->beat_ev)
		event_free(a->beat_ev);
	a->beat_ev = NULL;
}
