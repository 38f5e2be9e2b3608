/* Transfers: the table, timeouts, and how each one ends (exactly one event
 * for the engine, one notification, and the peer told when it failed).
 * The outcome leaves through the agent's xfer_ops (agent.h): this file
 * calls nothing of the links or data paths above it. */
#define PDX_LOG_TOPIC "xfer"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utlist.h>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/tcp_addr.h"

struct xfer *xfer_find(struct agent *a, const struct pdx_xfer_id *id)
{
	struct xfer *x = NULL;

	HASH_FIND(hh, a->xfers, id->b, sizeof(id->b), x);
	return x;
}

static const char *xfer_stage(const struct xfer *x)
{
	if (x->peer && x->peer->state != PEER_READY)
		return "waiting for the handshake";
	if (x->role == XFER_RECV) {
		if (!x->announced)
			return "held while our engine queued it";
		if (x->pull && x->remote_blocks && !x->done_seen)
			return "reading the sender's blocks";
		return x->done_seen ? "receiving the last bytes"
				    : "waiting for the sender";
	}
	if (!x->announced)
		return "waiting for our engine to announce it";
	if (!x->sm.blocks_known)
		return "waiting for the receiver's blocks";
	if (x->sm.pushed_count < x->sm.layers)
		return "waiting for layers to be computed";
	return x->pull ? "waiting for the receiver to read"
		       : "pushing the last layers";
}

enum bound { BOUND_PHASE, BOUND_LEASE, BOUND_LAYER, BOUND_HANDSHAKE };

static uint64_t ms_ns(uint32_t ms)
{
	return (uint64_t)ms * 1000000ULL;
}

/* When x must end unless something moves it on, and which bound that is.
 * Renewals and computed layers only move these later, so they write their
 * field and the timer, when it fires early, sleeps again. */
static uint64_t xfer_deadline(const struct xfer *x, enum bound *which)
{
	const struct agent_config *c = &x->agent->cfg;
	const struct peer *p = x->peer;
	uint64_t d = x->begun_ns + ms_ns(x->timeout_ms);

	*which = BOUND_PHASE;
	if (x->tp) /* a group of legs: they say why first, a second before */
		d += ms_ns(1000);
	if (x->role == XFER_SEND && x->announced && !x->sm.blocks_known) {
		/* The receiver has not asked: its holds keep the KV. */
		*which = BOUND_LEASE;
		d = x->lease_ns;
	} else if (x->role == XFER_SEND && x->announced && !x->tp &&
		   x->sm.pushed_count < x->sm.layers &&
		   x->progress_ns + ms_ns(c->layer_timeout_ms) < d) {
		*which = BOUND_LAYER;
		d = x->progress_ns + ms_ns(c->layer_timeout_ms);
	}
	/* An unanswered hello is no reason to wait out the transfer's own
	 * bound: where no agent listens, nothing ever answers. A held one's
	 * too: liveness does not watch a peer that never answered our hello,
	 * so this bound is the only one before --xfer-timeout-ms. */
	if ((x->announced || x->held) && p && p->state == PEER_HELLO_SENT &&
	    p->hello_sent_ns + ms_ns(c->handshake_timeout_ms) < d) {
		*which = BOUND_HANDSHAKE;
		d = p->hello_sent_ns + ms_ns(c->handshake_timeout_ms);
	}
	return d;
}

void xfer_arm(struct xfer *x)
{
	enum bound which;
	uint64_t now = pdx_now_ns(), d = xfer_deadline(x, &which);
	uint64_t left = d > now ? d - now : 0;
	struct timeval tv = { (time_t)(left / 1000000000ULL),
			      (suseconds_t)(left % 1000000000ULL / 1000) };

	if (!x->finished)
		evtimer_add(x->timer, &tv);
}

void xfer_begin_phase(struct xfer *x)
{
	x->begun_ns = x->progress_ns = pdx_now_ns();
	if (x->role == XFER_SEND && x->announced && !x->sm.blocks_known)
		x->lease_ns = x->begun_ns + ms_ns(x->agent->cfg.lease_ms);
	xfer_arm(x);
}

/* The wait for "stopped" looks again a bound from now, and last at four
 * bounds from the transfer's end (so the wait is at most that, as
 * documented: armed a bound at a time, a timer a hair early made it
 * five). */
static void await_arm(struct xfer *x)
{
	uint64_t bound = ms_ns(x->agent->cfg.peer_timeout_ms);
	uint64_t spent = pdx_now_ns() - x->ended_ns, ns = bound;
	struct timeval tv;

	if (spent < 4 * bound && 4 * bound - spent < ns)
		ns = 4 * bound - spent;
	tv.tv_sec = (time_t)(ns / 1000000000ULL);
	tv.tv_usec = (suseconds_t)(ns % 1000000000ULL / 1000);
	evtimer_add(x->timer, &tv);
}

/* Our hello to x's peer went unanswered for its whole bound, or all but
 * a hair of it: the transfer's own bound, as long, runs out first (the
 * hello went after the transfer began). A shorter one says nothing of
 * the hello: our connects may not have had the time to meet anything. */
static bool hello_waited_out(const struct xfer *x)
{
	const struct peer *p = x->peer;

	return p && p->state == PEER_HELLO_SENT &&
	       pdx_now_ns() - p->hello_sent_ns + ms_ns(100) >=
		   ms_ns(x->agent->cfg.handshake_timeout_ms);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct xfer *x = arg;
	struct agent *a = x->agent;
	enum bound which;
	char why[48];

	if (x->finished) { /* only the wait for "stopped" is timed now */
		uint64_t bound = ms_ns(a->cfg.peer_timeout_ms);
		char hex[33];

		/* A sender still heard from may be draining a long queue of
		 * operations (a slow link): it says "stopped" after, or is
		 * found lost (liveness), or its stuck operations are ended
		 * (its own bound); so the wait goes on while it answers (a
		 * new instance too: it may be the same agent, its engine
		 * registered again), up to four bounds in all (an abort it
		 * dropped is never answered). */
		if (x->peer && pdx_now_ns() - x->peer->heard_ns < bound &&
		    pdx_now_ns() - x->ended_ns < 4 * bound) {
			await_arm(x);
			return;
		}
		pdx_xfer_id_hex(&x->id, hex);
		log_warn("xfer %s: no \"stopped\" from %s, silent %u ms: its "
			 "engine is told now", hex, x->peer_addr,
			 a->cfg.peer_timeout_ms);
		xfer_stop_heard(x);
		a->settle(a);
		return;
	}
	if (xfer_deadline(x, &which) > pdx_now_ns()) {
		xfer_arm(x); /* moved later since armed */
		return;
	}
	if (which == BOUND_LEASE && !x->peer_addr[0])
		xfer_fail(x, PDX_ETIMEDOUT, false,
			  "lease expired: no agent claimed it in %u ms",
			  a->cfg.lease_ms);
	else if (which == BOUND_LEASE)
		xfer_fail(x, PDX_ETIMEDOUT, true,
			  "lease expired: %s asked for no blocks and held "
			  "none for %u ms", x->peer_addr, a->cfg.lease_ms);
	else if (which == BOUND_HANDSHAKE && a->advertise.late)
		/* its answer went where our --advertise leads: our fault,
		 * not the peer's (PDX_EIO: a proxy blames this side) */
		xfer_fail(x, PDX_EIO, true,
			  "no answer to our hello from %s: this agent's "
			  "--advertise %s, where peers answer, does not reach "
			  "it (%s)",
			  x->peer_addr, a->peer_addr, a->advertise.why);
	else if (which == BOUND_HANDSHAKE &&
		 a->advertise.loopback &&
		 pdx_tcp_addr_where(x->peer_addr) == PDX_TCP_HOST_REMOTE)
		/* a host's agent left at a one-host example's loopback
		 * address: a peer elsewhere answers into its own loopback
		 * (our probe reaches us there; the peer was blamed) */
		xfer_fail(x, PDX_EIO, true,
			  "no answer to our hello from %s: this agent "
			  "advertises %s, a loopback address, where a peer on "
			  "another host cannot answer: give it --advertise "
			  "with this host's address",
			  x->peer_addr, a->peer_addr);
	else if (which == BOUND_HANDSHAKE && x->peer &&
		 x->peer->cannot_reach_us[0])
		/* it told us over our own connection: our address's doing
		 * (PDX_EIO: a proxy blames this side, not the peer); the words
		 * above, ours, say more where they apply */
		xfer_fail(x, PDX_EIO, true,
			  "no answer to our hello from %s in %u ms, which says "
			  "it cannot reach this agent's --advertise %s: %s",
			  x->peer_addr, a->cfg.handshake_timeout_ms,
			  a->peer_addr, x->peer->cannot_reach_us);
	else if ((which == BOUND_HANDSHAKE || hello_waited_out(x)) &&
		 a->peer_return &&
		 a->peer_return->unreached(a, x->peer, why, sizeof(why)))
		xfer_fail(x, PDX_EPEER, true,
			  "no answer to our hello from %s in %llu ms: our "
			  "connects there met: %s",
			  x->peer_addr,
			  (unsigned long long)((pdx_now_ns() -
						x->peer->hello_sent_ns) /
					       1000000),
			  why);
	else if (which == BOUND_HANDSHAKE)
		/* a CURVE agent and a plain one never hear each other:
		 * ZeroMQ drops the connection without a word to either */
		xfer_fail(x, PDX_EPEER, true,
			  "no answer to our hello from %s in %u ms "
			  "(--handshake-timeout-ms): is an agent listening "
			  "there, %s CURVE as this one%s?",
			  x->peer_addr, a->cfg.handshake_timeout_ms,
			  a->curve ? "with" : "without",
			  a->curve ? ", each one's public key in the other's "
				     "--curve-peers file" : "");
	else if (which == BOUND_LAYER)
		xfer_fail(x, PDX_ETIMEDOUT, true,
			  "no layer computed for %u ms (%u of %u pushed)%s",
			  a->cfg.layer_timeout_ms, x->sm.pushed_count,
			  x->sm.layers,
			  pdx_xfer_sm_none_computed(&x->sm)
			      ? "; no layer_done named it since its send (one "
				"before the send is not counted)"
			      : "");
	else
		xfer_fail(x, PDX_ETIMEDOUT, true, "timed out after %u ms %s",
			  x->timeout_ms, xfer_stage(x));
	a->settle(a);
}

struct xfer *xfer_new(struct agent *a, const struct pdx_xfer_id *id,
		      enum xfer_role role, const char *peer_addr,
		      uint32_t timeout_ms)
{
	struct xfer *x;

	if (a->n_xfers >= a->cfg.max_xfers) {
		log_warn("transfer refused: %u live transfers (--max-xfers)",
			 a->n_xfers);
		return NULL;
	}
	x = calloc(1, sizeof(*x));
	if (!x)
		return NULL;
	x->timer = evtimer_new(a->base, on_timeout, x);
	if (!x->timer) {
		free(x);
		return NULL;
	}
	x->id = *id;
	x->agent = a;
	x->role = role;
	x->first_token = -1;
	x->timeout_ms = timeout_ms;
	x->era = a->retired;
	x->t_first_ns = pdx_now_ns();
	snprintf(x->peer_addr, sizeof(x->peer_addr), "%s", peer_addr);
	pdx_xfer_sm_init(&x->sm, a->reg.ok ? a->reg.layout.layers : 0);
	xfer_begin_phase(x);
	HASH_ADD(hh, a->xfers, id.b, sizeof(x->id.b), x);
	a->n_xfers++;
	return x;
}

static void xfer_destroy(struct xfer *x)
{
	gpu_plan_free(x->agent->gpu, x->plan);
	gpu_plan_free(x->agent->gpu, x->peer_plan);
	event_free(x->timer);
	free(x->blocks);
	free(x->held_also);
	free(x->remote_blocks);
	free(x->runs);
	free(x->tp);
	free(x->meta);
	free(x);
}

/* Out of the table at once; freed at the end of agent_settle(), so the
 * callback that released it may still read it. */
static void xfer_unlink(struct agent *a, struct xfer *x)
{
	if (x->later) {
		DL_DELETE2(a->later, x, later_prev, later_next);
		x->later = NULL;
	}
	HASH_DEL(a->xfers, x);
	a->n_xfers--;
	x->released = true;
	x->next_dead = a->dead;
	a->dead = x;
}

/* The transfers that gave the loop back go on, those queued now once
 * each (one that yields again goes to the back; one that leaves the
 * table meanwhile leaves the queue). */
static void later_fire(evutil_socket_t fd, short what, void *arg)
{
	struct agent *a = arg;
	struct xfer *x;
	uint32_t n = 0;

	DL_COUNT2(a->later, x, n, later_next);
	a->turn_ns = pdx_now_ns();
	while (n-- && (x = a->later)) {
		void (*fn)(struct xfer *) = x->later;

		DL_DELETE2(a->later, x, later_prev, later_next);
		x->later = NULL;
		if (!x->finished)
			fn(x);
	}
	a->settle(a);
}

bool xfer_yield(struct xfer *x, void (*fn)(struct xfer *x))
{
	static const struct timeval now = { 0, 0 };
	struct agent *a = x->agent;

	if (pdx_now_ns() - a->turn_ns < TURN_SLICE_NS)
		return false;
	if (!a->later_ev)
		a->later_ev = evtimer_new(a->base, later_fire, a);
	if (!a->later_ev)
		return false; /* out of memory: go on now */
	if (!x->later) {
		x->later = fn;
		DL_APPEND2(a->later, x, later_prev, later_next);
	}
	/* a timer: after the loop looked at its fds */
	evtimer_add(a->later_ev, &now);
	return true;
}

void xfers_reap(struct agent *a)
{
	while (a->dead) {
		struct xfer *x = a->dead;

		a->dead = x->next_dead;
		xfer_destroy(x);
	}
}

bool xfer_pushed(const struct xfer *x)
{
	return x->role == XFER_SEND && !x->pull && x->bytes && !x->tp &&
	       !x->group;
}

void xfer_maybe_release(struct xfer *x)
{
	struct agent *a = x->agent;

	if (!x->finished || x->inflight || x->released || x->await_stopped)
		return;
	if ((x->owe_stopped || x->owe_abort) && a->xfer_ops->stop_flush &&
	    a->xfer_ops->stop_flush(x))
		return; /* the word goes at the flush's end */
	/* what the peer is owed now that nothing of ours can still land in
	 * its memory */
	if (x->owe_stopped)
		a->xfer_ops->tell_peer(a, x->peer_addr, "stopped", &x->id, NULL);
	else if (x->owe_abort)
		a->xfer_ops->tell_peer(a, x->peer_addr, "abort", &x->id,
				       x->reason);
	/* one our engine holds queued (not announced yet) fails by event
	 * too: its request need not wait to be admitted to learn it */
	if ((x->announced || x->held) && !x->event_sent && !x->group) {
		x->event_sent = true;
		xfer_mark(x, MARK_EVENT);
		a->xfer_ops->engine_event(a, x, x->status ? "failed"
					: x->role == XFER_SEND ? "sent"
							       : "received");
		if (a->trace)
			xfer_trace_log(x);
	}
	pdx_ended_add(a->ended, &x->id, x->peer_addr,
		  x->status ? x->reason : "it completed");
	if (!x->tp) /* a group's bytes and path are its legs' */
		metrics_xfer_ended(a, x, peer_known(x->peer) ? x->peer->path
							  : DATA_AUTO);
	xfer_unlink(a, x);
	if (x->group) { /* a leg gives its group back */
		x->group->inflight--;
		xfer_maybe_release(x->group);
	}
}

/* Whether the peer may still touch our memory for x: a sender that may
 * be writing into our blocks (we asked, we read nothing ourselves, no
 * "done" yet), or a pull's receiver that may be reading ours by UCX get
 * (we said "readable", no "pulled" yet): our UCX worker answers its gets
 * from our memory, which must stay mapped until they ended. The ipc
 * lane's receiver reads the pool it mapped itself, by its name. */
static bool peer_may_touch(const struct xfer *x)
{
	if (!x->peer || !x->peer->stops)
		return false;
	if (x->role == XFER_SEND)
		return x->pull && x->readable_sent && x->peer->path == DATA_PUT;
	return x->want_sent && !x->pull && !x->done_seen;
}

/* Such a transfer, told "abort", keeps its blocks from its engine (and
 * its engine's memory, the engine gone) until the peer says "stopped"
 * (a peer that says so: hello "stops"), the peer is gone, or
 * --peer-timeout-ms. */
static void await_stopped(struct xfer *x)
{
	if (!peer_may_touch(x))
		return;
	x->await_stopped = true;
	await_arm(x);
}

void xfer_stop_heard(struct xfer *x)
{
	if (!x->await_stopped)
		return;
	x->await_stopped = false;
	evtimer_del(x->timer);
	xfer_maybe_release(x);
}

void xfer_fail(struct xfer *x, pdx_status_t status, bool tell_peer,
	       const char *fmt, ...)
{
	char hex[33];
	va_list ap;

	if (x->finished)
		return;
	x->finished = true;
	x->ended_ns = pdx_now_ns();
	x->status = status;
	va_start(ap, fmt);
	vsnprintf(x->reason, sizeof(x->reason), fmt, ap);
	va_end(ap);
	evtimer_del(x->timer);
	if (x->peer && (status == PDX_ETIMEDOUT || status == PDX_EPEER ||
			status == PDX_ENOENT))
		x->peer->stale = true;
	pdx_xfer_id_hex(&x->id, hex);
	log_info("xfer %s %s %s failed: %s", hex,
		 x->role == XFER_SEND ? "to" : "from",
		 x->peer_addr[0] ? x->peer_addr : "(none)", x->reason);
	/* A transfer our engine named (or queued) is aborted; one only the
	 * peer named is unknown here. */
	if (tell_peer && x->peer_addr[0]) {
		bool ours = x->announced || x->held;

		/* A sender's operations in flight may still write the
		 * receiver's blocks, which it frees at our word, and a pull's
		 * reads in flight still read the sender's memory, which it
		 * releases at our word: said once they ended
		 * (xfer_maybe_release). A push's puts that ended here may
		 * still be on their way (over TCP): said after the
		 * endpoint's flush (xfer_ops.stop_flush), as "stopped" is. */
		if (ours && (x->role == XFER_SEND || x->pull) &&
		    (x->inflight || xfer_pushed(x)))
			x->owe_abort = true;
		else
			x->agent->xfer_ops->tell_peer(
			    x->agent, x->peer_addr, ours ? "abort" : "error",
			    &x->id, ours ? x->reason : "unknown transfer");
		if (ours)
			await_stopped(x);
	}
	/* held with more senders (TP legs): each keeps its KV until told;
	 * none has begun pushing, so none is awaited */
	if (tell_peer && x->held && !x->announced)
		for (uint32_t i = 0; i < x->n_held_also; i++)
			x->agent->xfer_ops->tell_peer(x->agent,
						      x->held_also[i]->addr,
						      "abort", &x->id,
						      x->reason);
	if (x->announced && !x->group)
		x->agent->xfer_ops->notify(x->agent, x, "failed");
	if (x->group || x->tp)
		x->agent->xfer_ops->legs_decided(x);
	xfer_maybe_release(x);
}

void xfer_succeed(struct xfer *x)
{
	char hex[33];

	if (x->finished)
		return;
	x->finished = true;
	x->ended_ns = pdx_now_ns();
	x->status = PDX_OK;
	evtimer_del(x->timer);
	pdx_xfer_id_hex(&x->id, hex);
	log_debug("xfer %s done: %llu bytes", hex, (unsigned long long)x->bytes);
	if (!x->group)
		x->agent->xfer_ops->notify(x->agent, x, x->role == XFER_SEND
						     ? "sent" : "received");
	if (x->group || x->tp)
		x->agent->xfer_ops->legs_decided(x);
	xfer_maybe_release(x);
}

/* The id is the only credential of an open send (docs/security.md): the
 * first agent to present it gets the KV, any later one is refused as for
 * a send that named another agent. */
void xfer_claim(struct xfer *x, struct peer *p)
{
	char hex[33];

	if (!x || x->role != XFER_SEND || !x->announced || x->finished ||
	    x->peer_addr[0] || x->tp)
		return;
	snprintf(x->peer_addr, sizeof(x->peer_addr), "%s", p->addr);
	x->peer = p;
	pdx_xfer_id_hex(&x->id, hex);
	log_debug("xfer %s: claimed by %s", hex, p->addr);
}

void xfers_peer_failed(struct agent *a, struct peer *p, uint64_t instance,
		       pdx_status_t status, const char *reason)
{
	struct xfer *x, *tmp;

	/* Told, as it may live on: a new instance may be the same agent,
	 * its engine registered again, and a failed endpoint is UCX's, not
	 * the ipc lanes'. A receive it may still write waits for its word
	 * (a restarted agent answers an abort it never heard of at once). */
	HASH_ITER(hh, a->xfers, x, tmp) {
		/* (a want unsure waits on the instance now known) */
		if (x->peer == p && !x->finished &&
		    (!instance || x->peer_instance == instance ||
		     x->want_unsure))
			xfer_fail(x, status, true, "peer %s: %s", p->addr,
				  reason);
	}
}

void xfers_free(struct agent *a)
{
	struct xfer *x, *tmp, *held = NULL;

	xfers_reap(a);
	HASH_ITER(hh, a->xfers, x, tmp) {
		x->finished = true; /* quietly: no event, no peer told */
		evtimer_del(x->timer);
		xfer_unlink(a, x);
	}
	while (a->dead) { /* GPU work drained: its plans go now */
		x = a->dead;
		a->dead = x->next_dead;
		gpu_plan_free(a->gpu, x->plan);
		gpu_plan_free(a->gpu, x->peer_plan);
		x->plan = x->peer_plan = NULL;
		if (x->inflight) { /* a UCX operation still names it */
			x->next_dead = held;
			held = x;
		} else {
			xfer_destroy(x);
		}
	}
	a->dead = held;
	if (a->later_ev) /* the queue went with the table */
		event_free(a->later_ev);
	a->later_ev = NULL;
}

pdx_status_t xfer_set_meta(struct xfer *x, const void *data, size_t len)
{
	uint8_t *copy = NULL;

	if (len && !(copy = malloc(len)))
		return PDX_ENOMEM;
	if (len)
		memcpy(copy, data, len);
	free(x->meta);
	x->meta = copy;
	x->meta_len = len;
	return PDX_OK;
}

void xfer_pack_outcome(struct pdx_mp_msg *m, const struct xfer *x,
		       const char *kind)
{
	pdx_mp_msg_xfer(m, "xfer", &x->id);
	pdx_mp_msg_str(m, "kind", kind);
	pdx_mp_msg_i64(m, "status", x->status);
	pdx_mp_msg_str(m, "reason", x->reason);
	pdx_mp_msg_u64(m, "bytes", x->bytes);
	pdx_mp_msg_u64(m, "t_first", x->t_first_ns);
	pdx_mp_msg_u64(m, "t_last", pdx_now_ns());
	pdx_mp_msg_i64(m, "first_token", x->first_token);
}
