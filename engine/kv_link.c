/* The engine's agent link on its loop: registration, announcements,
 * events to waiters. */
#define PDX_LOG_TOPIC "kvlink"
#include "engine/kv_link.h"

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
};

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
		if (!w) {
			pdx_xfer_id_hex(&ev.xfer, hex);
			log_debug("%s: event %d for no waiter", hex, ev.kind);
			continue;
		}
		LIST_REMOVE(w, link);
		w->active = false;
		w->cb(w->arg, &ev);
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
	st = pdx_engine_connect(&ep, &l->e);
	if (st != PDX_OK) {
		snprintf(err, errlen, "connecting to %s: %s", addr,
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

pdx_status_t pdx_kv_link_status(const struct pdx_kv_link *l, char *reason,
				size_t reason_len)
{
	return pdx_engine_link_status(l->e, reason, reason_len);
}

const char *pdx_kv_link_peer(const struct pdx_kv_link *l)
{
	return l->peer;
}

static void arm(struct pdx_kv_link *l, struct pdx_kv_waiter *w)
{
	LIST_INSERT_HEAD(&l->waiters, w, link);
	w->active = true;
}

pdx_status_t pdx_kv_link_send(struct pdx_kv_link *l, struct pdx_kv_waiter *w,
			      const char *peer, const uint32_t *blocks,
			      size_t n_blocks)
{
	pdx_status_t st;

	if (find(l, &w->xfer))
		return PDX_EEXIST;
	st = pdx_engine_send(l->e, &w->xfer, peer, blocks, n_blocks);
	if (st == PDX_OK)
		arm(l, w);
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

	poke(l);
	return st;
}

pdx_status_t pdx_kv_link_token(struct pdx_kv_link *l,
			       const struct pdx_kv_waiter *w, uint32_t token)
{
	pdx_status_t st = pdx_engine_token(l->e, &w->xfer, token);

	poke(l);
	return st;
}

pdx_status_t pdx_kv_link_recv(struct pdx_kv_link *l, struct pdx_kv_waiter *w,
			      const char *peer, const uint32_t *blocks,
			      size_t n_blocks, uint32_t skip_tokens)
{
	pdx_status_t st;

	if (find(l, &w->xfer))
		return PDX_EEXIST;
	st = pdx_engine_recv(l->e, &w->xfer, peer, blocks, n_blocks,
			     skip_tokens);
	if (st == PDX_OK)
		arm(l, w);
	poke(l);
	return st;
}

void pdx_kv_link_hold(struct pdx_kv_link *l, const struct pdx_xfer_id *xfer,
		      const char *peer)
{
	pdx_engine_hold(l->e, xfer, peer);
	poke(l);
}

void pdx_kv_link_abort_at(struct pdx_kv_link *l,
			  const struct pdx_xfer_id *xfer, const char *peer)
{
	pdx_engine_abort_at(l->e, xfer, peer);
	poke(l);
}

void pdx_kv_link_cancel(struct pdx_kv_link *l, struct pdx_kv_waiter *w)
{
	if (!w->active)
		return;
	LIST_REMOVE(w, link);
	w->active = false;
	pdx_engine_abort(l->e, &w->xfer);
	poke(l);
}
