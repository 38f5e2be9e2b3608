/* The engine client's transfers in flight and its event queue.
 *
 * Every transfer announced on the link ends in exactly one event, agent or
 * no agent: the agent's, or when the link is lost one made here (failed,
 * PDX_EAGENT), after which what the agent may still say about it is
 * dropped. So does one held (pdx_engine_hold) that fails before it is
 * announced, unless we abort it. Such a failure does not mean nobody touches the blocks any
 * more (engine.h). The queue holds the events read while something else
 * was awaited (a register's answer) and those made here.
 */
#define PDX_LOG_TOPIC "engine"

#include "lib/client.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/log.h"

#define EVENT_QUEUE_MAX (1u << 20) /* events parked during register */

int pdx__queue_push(struct pdx_engine *e, const struct pdx_engine_event *ev)
{
	if (e->q_len == e->q_cap) {
		size_t cap = e->q_cap ? e->q_cap * 2 : 16;
		struct pdx_engine_event *q;

		if (e->q_cap >= EVENT_QUEUE_MAX)
			return -1;
		q = malloc(cap * sizeof(*q));
		if (!q)
			return -1;
		/* unroll the ring into the new array */
		for (size_t i = 0; i < e->q_len; i++)
			q[i] = e->q[(e->q_head + i) % e->q_cap];
		free(e->q);
		e->q = q;
		e->q_cap = cap;
		e->q_head = 0;
	}
	e->q[(e->q_head + e->q_len) % e->q_cap] = *ev;
	e->q_len++;
	return 0;
}

bool pdx__queue_pop(struct pdx_engine *e, struct pdx_engine_event *ev)
{
	if (!e->q_len)
		return false;
	*ev = e->q[e->q_head];
	e->q_head = (e->q_head + 1) % e->q_cap;
	e->q_len--;
	return true;
}

bool pdx__inflight_has(struct pdx_engine *e, const struct pdx_xfer_id *x)
{
	struct pdx__inflight *t;

	HASH_FIND(hh, e->live, x->b, sizeof(x->b), t);
	return t != NULL;
}

/* Takes t (made by the caller before announcing x, so that nothing can
 * fail after the announcement went out). */
void pdx__inflight_add(struct pdx_engine *e, struct pdx__inflight *t,
		       const struct pdx_xfer_id *x)
{
	t->id = *x;
	t->t_first_ns = pdx_now_ns();
	HASH_ADD(hh, e->live, id.b, sizeof(t->id.b), t);
}

static struct pdx__inflight *inflight_find(struct pdx_engine *e,
					    const struct pdx_xfer_id *x)
{
	struct pdx__inflight *t;

	HASH_FIND(hh, e->live, x->b, sizeof(x->b), t);
	return t;
}

void pdx__inflight_hold(struct pdx_engine *e, const struct pdx_xfer_id *x)
{
	struct pdx__inflight *t;

	if (inflight_find(e, x))
		return; /* held with one more sender, or announced */
	t = calloc(1, sizeof(*t));
	if (!t) { /* its failure comes at its announcement, as before */
		log_warn("no memory to follow a held transfer");
		return;
	}
	pdx__inflight_add(e, t, x);
	t->held = true;
}

bool pdx__inflight_held(struct pdx_engine *e, const struct pdx_xfer_id *x)
{
	struct pdx__inflight *t = inflight_find(e, x);

	return t && t->held;
}

bool pdx__inflight_announced(struct pdx_engine *e, struct pdx__inflight *t,
			     const struct pdx_xfer_id *x)
{
	struct pdx__inflight *h = inflight_find(e, x);

	if (!h || !h->held) {
		pdx__inflight_add(e, t, x);
		return false;
	}
	h->held = false;
	h->t_first_ns = pdx_now_ns();
	return true;
}

void pdx__inflight_unhold(struct pdx_engine *e, const struct pdx_xfer_id *x)
{
	if (pdx__inflight_held(e, x))
		pdx__inflight_take(e, x);
}

/* Takes x off the transfers in flight; false when it was not there. */
bool pdx__inflight_take(struct pdx_engine *e, const struct pdx_xfer_id *x)
{
	struct pdx__inflight *t;

	HASH_FIND(hh, e->live, x->b, sizeof(x->b), t);
	if (!t)
		return false;
	HASH_DEL(e->live, t);
	free(t);
	return true;
}

/* An event read while something else is awaited, for a later
 * pdx_engine_next_event(); one for a transfer no longer in flight here
 * (the link was lost, its event made here) is dropped. */
bool pdx__queue_keep(struct pdx_engine *e, const struct pdx_engine_event *ev)
{
	if (!pdx__inflight_take(e, &ev->xfer)) {
		log_debug("dropped an event for a transfer not in flight");
		return false;
	}
	if (pdx__queue_push(e, ev)) {
		log_error("event queue full: an event was lost");
		return false;
	}
	return true;
}

/* The link was lost (e->why_down says how, e->down_ns when): every
 * transfer in flight fails now, by an event of ours. */
void pdx__inflight_fail_all(struct pdx_engine *e, pdx_status_t st)
{
	struct pdx__inflight *t, *tmp;
	unsigned n = 0;

	HASH_ITER(hh, e->live, t, tmp)
	{
		struct pdx_engine_event ev = {
		    .xfer = t->id,
		    .kind = PDX_EVENT_FAILED,
		    .status = st,
		    .t_first_ns = t->t_first_ns,
		    .t_last_ns = e->down_ns,
		    .first_token = -1,
		};

		snprintf(ev.reason, sizeof(ev.reason), "%s", e->why_down);
		if (pdx__queue_push(e, &ev))
			log_error("event queue full: an event was lost");
		HASH_DEL(e->live, t);
		free(t);
		n++;
	}
	log_warn("%s; %u transfers in flight failed", e->why_down, n);
}

/* pdx_engine_free(): the transfers in flight and the queue, silently. */
void pdx__inflight_free(struct pdx_engine *e)
{
	struct pdx__inflight *t, *tmp;

	HASH_ITER(hh, e->live, t, tmp)
	{
		HASH_DEL(e->live, t);
		free(t);
	}
	free(e->q);
}
