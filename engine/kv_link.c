/* The engine's agent link on its loop: registration, announcements,
 * events to waiters. */
#define PDX_LOG_TOPIC "kvlink"
#include "engine/kv_link.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* While the agent is away, the link is read this often even if its fd
 * stays quiet, so a registration the agent refused is tried again. */
#define AWAY_POLL_MS 250

struct pdx_kv_link {
	struct pdx_engine *e;
	struct event *ev; /* the link's fd, persistent */
	struct event *away_poll; /* persistent, AWAY_POLL_MS */
	bool away; /* as last seen, for the log */
	LIST_HEAD(, pdx_kv_waiter) waiters;
	char peer[PDX_ADDR_MAX];
	struct pdx_tp_leader *tp; /* rank 0 of a TP instance, else NULL */
	uint32_t tp_size;	  /* 1 without */
	uint32_t rank, ranks;	  /* this engine's TP rank, of ranks */
	/* events no waiter takes: held transfers' (pdx_kv_link_on_held) */
	void (*held_cb)(void *arg, const struct pdx_engine_event *ev);
	void *held_arg;
};

/* The one agent of the other side (its ranks' agents, rank order) that
 * ours deals with alone: at equal TP sizes, our rank's pair. NULL at
 * different sizes, where our agent takes our heads from the ranks that
 * hold them and gives its own to those that want them (docs/protocol.md,
 * "TP legs"), or when none is known. */
static const char *own_pair(const struct pdx_kv_link *l,
			    const struct pdx_kv_peers *other)
{
	return other && other->n == l->ranks ? other->addr[l->rank] : NULL;
}

/* A transfer action for the follower ranks, if any, with the other
 * side's agents (each rank picks its own, as own_pair says). */
static void to_ranks(struct pdx_kv_link *l, enum pdx_tp_kind kind,
		     const struct pdx_xfer_id *xfer, uint32_t value,
		     const struct pdx_kv_peers *other)
{
	struct pdx_tp_msg m = {.kind = kind, .xfer = *xfer, .value = value};

	if (!l->tp)
		return;
	if (other)
		m.peers = *other;
	pdx_tp_leader_xfer(l->tp, &m);
}

/* Not a rank's event: the link's own verdict (pdx_kv_link_fail_all). */
#define NO_RANK UINT32_MAX

/* The waiter's event from one rank: the first failure aborts the ranks
 * still under way, and the outcome (that failure, else the last rank's
 * success with rank 0's event, its first token) comes once every rank
 * reported: a rank's blocks are written until its agent's event (its
 * sender's "stopped"), and the leader's next step hands the same block
 * ids to another request on every rank. A failure of the link itself
 * (NO_RANK: the agent away, the ranks lost) ends it at once. */
static void deliver(struct pdx_kv_link *l, struct pdx_kv_waiter *w,
		    uint32_t rank, const struct pdx_engine_event *ev)
{
	bool failed = ev->kind == PDX_EVENT_FAILED;

	if (rank == 0)
		w->local_done = true;
	if (failed && (!w->failing || rank == NO_RANK)) {
		w->ev = *ev;
		w->failed_here = rank == NO_RANK || ev->status == PDX_EAGENT ||
				 ev->status == PDX_ENOTREG;
		if (rank && rank != NO_RANK)
			snprintf(w->ev.reason, sizeof(w->ev.reason),
				 "tensor-parallel rank %u: %s", rank,
				 ev->reason);
		if (!w->failing || rank == NO_RANK) {
			if (!w->local_done)
				pdx_engine_abort(l->e, &w->xfer);
			to_ranks(l, PDX_TP_ABORT, &w->xfer, 0, NULL);
		}
		w->failing = true;
	} else if (!failed && rank == 0 && !w->failing) {
		w->ev = *ev;
	}
	if (rank != NO_RANK && --w->pending)
		return;
	LIST_REMOVE(w, link);
	w->active = false;
	w->cb(w->arg, &w->ev);
}

static struct pdx_kv_waiter *find(struct pdx_kv_link *l,
				  const struct pdx_xfer_id *x)
{
	struct pdx_kv_waiter *w;

	LIST_FOREACH(w, &l->waiters, link)
	{
		if (!memcmp(&w->xfer, x, sizeof(*x)))
			return w;
	}
	return NULL;
}

/* Logs the link going away and coming back, once each. */
static void note_state(struct pdx_kv_link *l)
{
	char why[PDX_REASON_MAX + 32];
	bool away = pdx_engine_link_status(l->e, why, sizeof(why)) != PDX_OK;

	if (away && !l->away)
		log_error("the agent is away: %s; transfers are refused until "
			  "it is back",
			  why);
	else if (!away && l->away)
		log_info("the agent is back, the KV pool registered again");
	l->away = away;
}

/* Drains every queued event (the fd is edge-triggered). */
static void on_events(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_kv_link *l = arg;
	struct pdx_engine_event ev;
	struct pdx_kv_waiter *w;
	char hex[33];

	while (pdx_engine_next_event(l->e, &ev) == PDX_OK) {
		w = find(l, &ev.xfer);
		if (!w && l->held_cb) {
			l->held_cb(l->held_arg, &ev);
			continue;
		}
		if (!w) {
			pdx_xfer_id_hex(&ev.xfer, hex);
			log_debug("%s: event %d for no waiter", hex, ev.kind);
			continue;
		}
		deliver(l, w, 0, &ev);
	}
	note_state(l);
}

static void on_away_poll(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_kv_link *l = arg;

	if (l->away)
		on_events(-1, EV_READ, l);
}

/* After any call of the API: events it queued are read from the loop. */
static void poke(struct pdx_kv_link *l)
{
	event_active(l->ev, EV_READ, 0);
}

pdx_status_t pdx_kv_link_new(struct event_base *base, const char *addr,
			     uint32_t liveness_ms, struct pdx_kv_pool *pool,
			     uint32_t rank, uint32_t ranks,
			     struct pdx_kv_link **out, char *err,
			     size_t errlen)
{
	struct pdx_engine_params ep = {.agent = addr,
				       .liveness_ms = (int)liveness_ms};
	struct timeval away_tv = {0, AWAY_POLL_MS * 1000};
	struct pdx_kv_link *l = calloc(1, sizeof(*l));
	pdx_status_t st;

	if (!l)
		return PDX_ENOMEM;
	LIST_INIT(&l->waiters);
	l->tp_size = 1;
	l->rank = rank;
	l->ranks = ranks;
	st = pdx_engine_connect(&ep, &l->e);
	if (st != PDX_OK) {
		snprintf(err, errlen, "connecting to %s: %s", addr,
			 pdx_status_str(st));
		goto fail;
	}
	if (ranks > 1) /* the agent reshards heads between TP sizes */
		st = pdx_engine_set_tp(l->e, rank, ranks);
	if (st != PDX_OK) {
		snprintf(err, errlen, "TP rank %u of %u: %s", rank, ranks,
			 pdx_status_str(st));
		goto fail;
	}
	st = pdx_engine_register_cuda(
	    l->e, pdx_kv_pool_layout(pool), pdx_kv_pool_region(pool), 1,
	    pdx_kv_pool_events(pool), l->peer, sizeof(l->peer));
	if (st != PDX_OK) {
		snprintf(err, errlen, "registering the KV pool with %s: %s",
			 addr, pdx_status_str(st));
		goto fail;
	}
	l->ev = event_new(base, pdx_engine_fd(l->e), EV_READ | EV_PERSIST,
			  on_events, l);
	l->away_poll = event_new(base, -1, EV_PERSIST, on_away_poll, l);
	if (!l->ev || event_add(l->ev, NULL) || !l->away_poll ||
	    event_add(l->away_poll, &away_tv)) {
		st = PDX_ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	poke(l);
	*out = l;
	return PDX_OK;
fail:
	pdx_kv_link_free(l);
	return st;
}

void pdx_kv_link_free(struct pdx_kv_link *l)
{
	struct pdx_kv_waiter *w;

	if (!l)
		return;
	while ((w = LIST_FIRST(&l->waiters))) {
		LIST_REMOVE(w, link);
		w->active = false;
	}
	if (l->ev)
		event_free(l->ev);
	if (l->away_poll)
		event_free(l->away_poll);
	pdx_engine_free(l->e);
	free(l);
}

void pdx_kv_link_set_tp(struct pdx_kv_link *l, struct pdx_tp_leader *tp,
			uint32_t size)
{
	l->tp = tp;
	l->tp_size = size;
}

void pdx_kv_link_rank_event(struct pdx_kv_link *l, uint32_t rank,
			    const struct pdx_engine_event *ev)
{
	struct pdx_kv_waiter *w = find(l, &ev->xfer);

	if (w)
		deliver(l, w, rank, ev);
}

void pdx_kv_link_fail_all(struct pdx_kv_link *l, const char *why)
{
	struct pdx_engine_event ev = {.kind = PDX_EVENT_FAILED,
				      .status = PDX_EPEER,
				      .first_token = -1};
	struct pdx_kv_waiter *w;

	snprintf(ev.reason, sizeof(ev.reason), "%s", why);
	while ((w = LIST_FIRST(&l->waiters))) {
		ev.xfer = w->xfer;
		deliver(l, w, NO_RANK, &ev);
	}
}

pdx_status_t pdx_kv_link_status(const struct pdx_kv_link *l, char *reason,
				size_t reason_len)
{
	pdx_status_t st = pdx_engine_link_status(l->e, reason, reason_len);

	if (st == PDX_OK)
		st = pdx_kv_link_ranks_status(l, reason, reason_len);
	if (st == PDX_OK && l->tp)
		st = pdx_tp_leader_agents(l->tp, reason, reason_len);
	return st;
}

pdx_status_t pdx_kv_link_ranks_status(const struct pdx_kv_link *l,
				      char *reason, size_t reason_len)
{
	return l->tp ? pdx_tp_leader_status(l->tp, reason, reason_len)
		     : PDX_OK;
}

/* The agent's now: restarted at another address, it answered libpdx's
 * register again with it (the one registered first went stale). */
const char *pdx_kv_link_peer(const struct pdx_kv_link *l)
{
	return pdx_engine_peer_addr(l->e);
}

uint32_t pdx_kv_link_tp_size(const struct pdx_kv_link *l)
{
	return l->tp_size;
}

void pdx_kv_link_peers(const struct pdx_kv_link *l, struct pdx_kv_peers *out)
{
	out->n = l->tp ? l->tp_size : 1;
	for (uint32_t r = 0; r < out->n; r++)
		snprintf(out->addr[r], sizeof(out->addr[r]), "%s",
			 r ? pdx_tp_leader_peer(l->tp, r)
			   : pdx_kv_link_peer(l));
}

static void arm(struct pdx_kv_link *l, struct pdx_kv_waiter *w)
{
	LIST_INSERT_HEAD(&l->waiters, w, link);
	w->active = true;
	w->local_done = false;
	w->failed_here = false;
	w->failing = false;
	w->pending = l->tp_size;
}

/* SEND or RECV of w to the follower ranks. */
static void start_ranks(struct pdx_kv_link *l, struct pdx_kv_waiter *w,
			enum pdx_tp_kind kind, const struct pdx_kv_peers *other,
			const uint32_t *blocks, size_t n_blocks,
			uint32_t skip_tokens)
{
	struct pdx_tp_msg m = {
	    .kind = kind,
	    .value = skip_tokens,
	    .xfer = w->xfer,
	    .n_block_ids = (uint32_t)n_blocks,
	    .block_ids = (uint32_t *)blocks,
	};

	if (!l->tp)
		return;
	if (kind == PDX_TP_RECV) {
		m.tokens = (uint32_t *)w->tokens;
		m.n_tokens = w->n_tokens;
	}
	if (other)
		m.peers = *other;
	pdx_tp_leader_xfer(l->tp, &m);
}

pdx_status_t pdx_kv_link_send(struct pdx_kv_link *l, struct pdx_kv_waiter *w,
			      const struct pdx_kv_peers *other,
			      const uint32_t *blocks, size_t n_blocks)
{
	pdx_status_t st;

	if (find(l, &w->xfer))
		return PDX_EEXIST;
	st = pdx_engine_send(l->e, &w->xfer, own_pair(l, other), blocks,
			     n_blocks);
	if (st == PDX_OK) {
		arm(l, w);
		start_ranks(l, w, PDX_TP_SEND, other, blocks, n_blocks, 0);
	}
	poke(l);
	return st;
}

pdx_status_t pdx_kv_link_layer_done(struct pdx_kv_link *l,
				    const struct pdx_kv_waiter *w,
				    uint32_t layer, uint32_t slot)
{
	pdx_status_t st;

	if (slot == PDX_KV_POOL_NO_SLOT)
		st = pdx_engine_layer_done(l->e, layer, &w->xfer, 1);
	else
		st = pdx_engine_layer_done_slot(l->e, layer, slot, &w->xfer, 1);
	to_ranks(l, PDX_TP_LAYER, &w->xfer, layer, NULL);
	poke(l);
	return st;
}

pdx_status_t pdx_kv_link_token(struct pdx_kv_link *l,
			       const struct pdx_kv_waiter *w, uint32_t token)
{
	pdx_status_t st = pdx_engine_token(l->e, &w->xfer, token);

	to_ranks(l, PDX_TP_TOKEN, &w->xfer, token, NULL);
	poke(l);
	return st;
}

pdx_status_t pdx_kv_link_recv(struct pdx_kv_link *l, struct pdx_kv_waiter *w,
			      const struct pdx_kv_peers *other,
			      const uint32_t *blocks, size_t n_blocks,
			      uint32_t skip_tokens)
{
	const char *addrs[PDX_TP_MAX];
	struct pdx_recv_opts opts = {.skip_tokens = skip_tokens,
				     .mode = PDX_XFER_DEFAULT};
	const char *peer = own_pair(l, other);
	pdx_status_t st;

	if (!other || !other->n)
		return PDX_EINVAL; /* no sender to ask */
	if (find(l, &w->xfer))
		return PDX_EEXIST;
	if (!peer) { /* every prefill rank: the agent takes our heads */
		for (uint32_t r = 0; r < other->n; r++)
			addrs[r] = other->addr[r];
		opts.peers = addrs;
		opts.n_peers = other->n;
	}
	st = pdx_engine_recv_opts(l->e, &w->xfer, peer, blocks, n_blocks,
				  &opts);
	if (st == PDX_OK) {
		arm(l, w);
		start_ranks(l, w, PDX_TP_RECV, other, blocks, n_blocks,
			    skip_tokens);
	}
	poke(l);
	return st;
}

/* op (pdx_engine_hold or _abort_at) of xfer at our pair, or at every rank
 * of the other side at different TP sizes (each holds the transfer), and
 * the same at the follower ranks. */
static void at_peers(struct pdx_kv_link *l, enum pdx_tp_kind kind,
		     pdx_status_t (*op)(struct pdx_engine *,
					const struct pdx_xfer_id *,
					const char *),
		     const struct pdx_xfer_id *xfer,
		     const struct pdx_kv_peers *other)
{
	const char *peer = own_pair(l, other);

	for (uint32_t r = 0; other && r < other->n; r++)
		if (!peer || peer == other->addr[r])
			op(l->e, xfer, other->addr[r]);
	to_ranks(l, kind, xfer, 0, other);
	poke(l);
}

void pdx_kv_link_hold(struct pdx_kv_link *l, const struct pdx_xfer_id *xfer,
		      const struct pdx_kv_peers *other)
{
	at_peers(l, PDX_TP_HOLD, pdx_engine_hold, xfer, other);
}

void pdx_kv_link_on_held(struct pdx_kv_link *l,
			 void (*cb)(void *arg, const struct pdx_engine_event *ev),
			 void *arg)
{
	l->held_cb = cb;
	l->held_arg = arg;
}

void pdx_kv_link_abort_at(struct pdx_kv_link *l,
			  const struct pdx_xfer_id *xfer,
			  const struct pdx_kv_peers *other)
{
	at_peers(l, PDX_TP_ABORT_AT, pdx_engine_abort_at, xfer, other);
}

void pdx_kv_link_abort(struct pdx_kv_link *l, struct pdx_kv_waiter *w)
{
	if (!w->active)
		return;
	if (!w->local_done)
		pdx_engine_abort(l->e, &w->xfer);
	to_ranks(l, PDX_TP_ABORT, &w->xfer, 0, NULL);
	poke(l);
}

void pdx_kv_link_cancel(struct pdx_kv_link *l, struct pdx_kv_waiter *w)
{
	if (!w->active)
		return;
	LIST_REMOVE(w, link);
	w->active = false;
	if (!w->local_done)
		pdx_engine_abort(l->e, &w->xfer);
	to_ranks(l, PDX_TP_ABORT, &w->xfer, 0, NULL);
	poke(l);
}
