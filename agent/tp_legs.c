/* An engine's transfer between TP sizes p != d as a group of legs
 * (docs/protocol.md, "TP legs"): each pair of a prefill rank and a decode
 * rank whose heads overlap is one ordinary transfer (a "leg", its id
 * derived from the engine's by tp_leg_id()), and the engine's transfer is
 * a group that holds its legs: it ends when they all ended, its first
 * failed leg fails it and the others, and the engine hears of it once.
 * The decode agent picks the legs; the prefill agent binds each "want"
 * to its engine's transfer by the want's "of". */
#define PDX_LOG_TOPIC "xfer"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mp.h"
#include "common/tcp_addr.h"

#define MAX_TP 0x7fff

struct tp_group {
	uint32_t expected;  /* legs when every one joined */
	uint32_t joined;    /* legs made so far (a sender's come by want) */
	uint32_t succeeded;
	uint32_t peer_size; /* the other side's TP size */
	struct pdx_xfer_id legs[];
};

static struct tp_group *group_new(struct xfer *x, uint32_t expected,
				  uint32_t peer_size)
{
	struct tp_group *g = calloc(1, sizeof(*g) +
					       expected * sizeof(g->legs[0]));

	if (g) {
		g->expected = expected;
		g->peer_size = peer_size;
	}
	x->tp = g;
	return g;
}

/* leg becomes one of g's legs, holding it until released. */
static void group_join(struct xfer *g, struct xfer *leg)
{
	leg->group = g;
	g->inflight++; /* given back by xfer_maybe_release(leg) */
	g->tp->legs[g->tp->joined++] = leg->id;
}

/* g's legs still going */
static struct xfer *group_leg(struct xfer *g, uint32_t i)
{
	struct xfer *leg = xfer_find(g->agent, &g->tp->legs[i]);

	return leg && leg->group == g && !leg->finished ? leg : NULL;
}

int tp_legs_pick(const struct agent *a, const msgpack_object *peers,
		 char *peer, size_t len, char *why, size_t whylen)
{
	const struct pdx_kv_layout *l = &a->reg.layout;
	struct tp_rank me = a->reg.tp;
	uint32_t n;

	if (peers->type != MSGPACK_OBJECT_ARRAY || !peers->via.array.size ||
	    peers->via.array.size > MAX_TP) {
		snprintf(why, whylen, "peers: want an array of the prefill "
			 "ranks' tcp:// addresses, rank order");
		return -1;
	}
	n = peers->via.array.size;
	for (uint32_t i = 0; i < n; i++) {
		const msgpack_object *o = &peers->via.array.ptr[i];
		char addr[PDX_ADDR_MAX], detail[PDX_ADDR_MAX + 96] = "no str that fits";

		/* as a plain recv's peer (engine_link.c): one an agent may
		 * listen at */
		if (o->type == MSGPACK_OBJECT_STR &&
		    o->via.str.size < PDX_ADDR_MAX) {
			snprintf(addr, sizeof(addr), "%.*s",
				 (int)o->via.str.size, o->via.str.ptr);
			if (pdx_tcp_addr_ok(addr, false, detail,
					    sizeof(detail)))
				continue;
		}
		snprintf(why, whylen, "peers[%u]: want a tcp:// address (%s)",
			 i, detail);
		return -1;
	}
	if (n == me.size) {
		const msgpack_object *o = &peers->via.array.ptr[me.rank];

		snprintf(peer, len, "%.*s", (int)o->via.str.size,
			 o->via.str.ptr);
		return 0; /* equal TP: our rank's peer, as a plain recv */
	}
	if (tp_size_refusal(n, why, whylen))
		return -1;
	if (l->tensors != 1 && (l->kv_heads * me.size) % n) {
		snprintf(why, whylen, "peers: %u KV heads (kv_heads %u x tp %u) "
			 "do not split over TP %u", l->kv_heads * me.size,
			 l->kv_heads, me.size, n);
		return -1;
	}
	return 1;
}

/* Whether prefill rank s and decode rank r exchange KV, and what. */
static bool pair(const struct pdx_kv_layout *l, uint32_t heads,
		 struct tp_rank s, struct tp_rank r, struct tp_slice *sl,
		 bool *skip_all)
{
	*sl = (struct tp_slice){ 0 };
	*skip_all = false;
	return l->tensors == 1 ? tp_mla_pair(s, r, skip_all)
			       : tp_slice_of(heads, s, r, sl);
}

void tp_legs_recv(struct xfer *x, const msgpack_object *peers)
{
	struct agent *a = x->agent;
	const struct pdx_kv_layout *l = &a->reg.layout;
	struct tp_rank me = a->reg.tp;
	uint32_t n = peers->via.array.size, heads = l->kv_heads * me.size;
	uint32_t count = 0;
	struct tp_slice sl;
	bool skip_all;

	for (uint32_t i = 0; i < n; i++)
		count += pair(l, heads, (struct tp_rank){ i, n }, me, &sl,
			      &skip_all);
	if (!group_new(x, count, n)) {
		xfer_fail(x, PDX_ENOMEM, false, "out of memory");
		return;
	}
	for (uint32_t i = 0; i < n && !x->finished; i++) {
		const msgpack_object *o = &peers->via.array.ptr[i];
		char addr[PDX_ADDR_MAX];
		struct pdx_xfer_id id;
		struct xfer *leg;

		if (!pair(l, heads, (struct tp_rank){ i, n }, me, &sl,
			  &skip_all))
			continue;
		snprintf(addr, sizeof(addr), "%.*s", (int)o->via.str.size,
			 o->via.str.ptr);
		tp_leg_id(&x->id, i, me.rank, &id);
		leg = xfer_find(a, &id) ? NULL
					: xfer_new(a, &id, XFER_RECV, addr,
						   x->timeout_ms);
		if (!leg) {
			xfer_fail(x, PDX_ETOOBIG, true, "leg from rank %u: its "
				  "id is in use, or --max-xfers is reached", i);
			return;
		}
		group_join(x, leg);
		leg->announced = true;
		leg->blocks = malloc(x->n_blocks * sizeof(*leg->blocks));
		leg->n_blocks = x->n_blocks;
		leg->skip = skip_all ? x->n_blocks : x->skip;
		leg->pull = x->pull;
		leg->slice = sl;
		leg->peer_tp = (struct tp_rank){ i, n };
		leg->peer = peer_get(a, addr);
		if (!leg->blocks)
			xfer_fail(leg, PDX_ENOMEM, false, "out of memory");
		else if (!leg->peer)
			xfer_fail(leg, PDX_EPEER, false, "cannot reach %s",
				  addr);
		else
			memcpy(leg->blocks, x->blocks,
			       x->n_blocks * sizeof(*leg->blocks));
	}
	for (uint32_t i = 0; i < x->tp->joined && !x->finished; i++) {
		struct xfer *leg = group_leg(x, i);

		if (leg)
			xfers_peer_ready(a, leg->peer); /* its want */
	}
}

/* A sender's leg takes what goes beside the KV as its group has it;
 * false: it failed for want of memory. */
static bool leg_beside(struct xfer *g, struct xfer *leg)
{
	leg->first_token = g->first_token;
	if (!xfer_set_meta(leg, g->meta, g->meta_len))
		return true;
	xfer_fail(leg, PDX_ENOMEM, true, "out of memory for %zu bytes of meta",
		  g->meta_len);
	return false;
}

/* A sender's leg takes what our engine said of its group so far. */
static void leg_announce(struct xfer *g, struct xfer *leg)
{
	leg->blocks = malloc(g->n_blocks * sizeof(*leg->blocks));
	if (!leg->blocks) {
		xfer_fail(leg, PDX_ENOMEM, true, "out of memory");
		return;
	}
	memcpy(leg->blocks, g->blocks, g->n_blocks * sizeof(*leg->blocks));
	leg->n_blocks = g->n_blocks;
	leg->announced = true;
	leg->timeout_ms = g->timeout_ms;
	if (!leg_beside(g, leg))
		return;
	for (uint32_t l = 0; l < g->sm.layers; l++)
		if (g->sm.computed[l / 64] >> (l % 64) & 1)
			pdx_xfer_sm_computed(&leg->sm, l);
	xfer_begin_phase(leg);
}

/* A sender's leg that moves a slice of heads over the ipc lane: it reads
 * only its heads of our blocks, the other legs the rest. */
static bool sliced_ipc(const struct xfer *leg)
{
	return leg->slice.n && !leg->pull && leg->skip < leg->n_blocks &&
	       leg->peer && peer_known(leg->peer) && leg->peer->path == DATA_IPC;
}

#define TOGETHER_MAX 16 /* legs of one sender copied together */

static void group_push(struct xfer *g);

/* Each layer ready for every one of legs[0..n), copied for all of them
 * in one pass over our blocks (path_ipc_legs_layer), until g (their
 * group) must give the loop back (xfer_yield): true then. */
static bool push_together(struct xfer *g, struct xfer **legs, uint32_t n)
{
	/* in the order of their heads: our blocks are read in order */
	for (uint32_t i = 1; i < n; i++)
		for (uint32_t k = i; k > 0 && legs[k - 1]->slice.src_head >
						     legs[k]->slice.src_head; k--) {
			struct xfer *t = legs[k];

			legs[k] = legs[k - 1];
			legs[k - 1] = t;
		}
	for (uint32_t l = 0; l < legs[0]->sm.layers; l++) {
		pdx_status_t st;
		uint32_t i;

		for (i = 0; i < n && pdx_xfer_sm_ready(&legs[i]->sm, l); i++)
			;
		if (i < n)
			continue;
		if (xfer_yield(g, group_push))
			return true;
		for (i = 0; i < n; i++)
			pdx_xfer_sm_take_run(&legs[i]->sm, l, 1);
		st = path_ipc_legs_layer(legs, n, l);
		if (st) { /* a leg's failure fails the group, and so the rest */
			xfer_fail(legs[0], st, true, "push of layer %u with "
				  "its sibling legs: %s", l, pdx_status_str(st));
			return false;
		}
	}
	return false;
}

/* What a sender's group has ready goes to its legs. Legs that move head
 * slices over the ipc lane wait until every leg asked, then move each
 * layer together (a leg alone reads its heads of every block strided:
 * 1.3-1.6x slower here, docs/benchmarking.md); everything else (other
 * lanes, the flush and "done") each leg does alone. */
static void group_push(struct xfer *g)
{
	struct xfer *legs[TOGETHER_MAX];
	bool all = g->tp->joined == g->tp->expected &&
		   g->tp->expected > 1 && g->tp->expected <= TOGETHER_MAX;
	uint32_t n = 0;

	for (uint32_t i = 0; all && i < g->tp->joined; i++) {
		struct xfer *leg = group_leg(g, i);

		if (!leg || !leg->announced || !sliced_ipc(leg) ||
		    !push_prepare(leg))
			all = false;
		else
			legs[n++] = leg;
	}
	if (all && push_together(g, legs, n))
		return; /* the rest from the loop */
	for (uint32_t i = 0; i < g->tp->joined && !g->finished; i++) {
		struct xfer *leg = group_leg(g, i);

		if (leg && leg->announced &&
		    !(sliced_ipc(leg) && g->tp->joined < g->tp->expected))
			push_try(leg); /* the rest: alone */
	}
}

void tp_legs_want(struct agent *a, struct peer *p, const struct pdx_xfer_id *id,
		  const struct pdx_xfer_id *of, uint32_t *blocks, uint32_t n,
		  uint32_t skip, bool pull)
{
	const struct pdx_kv_layout *l = &a->reg.layout;
	struct tp_rank me = a->reg.tp;
	char why[PDX_REASON_MAX] = "";
	struct pdx_xfer_id expect;
	struct tp_slice sl;
	struct xfer *g, *leg = NULL;
	const char *ended;
	bool skip_all;

	tp_leg_id(of, me.rank, p->tp.rank, &expect);
	g = xfer_find(a, of);
	if (memcmp(expect.b, id->b, sizeof(id->b)) != 0)
		snprintf(why, sizeof(why), "want: xfer is not the leg of \"of\" "
			 "from rank %u to rank %u", me.rank, p->tp.rank);
	else if (p->tp.size == me.size)
		snprintf(why, sizeof(why), "want: \"of\" between equal TP sizes "
			 "(%u)", me.size);
	else if (!pair(l, l->kv_heads * me.size, me, p->tp, &sl, &skip_all))
		snprintf(why, sizeof(why), "want: rank %u of TP %u takes "
			 "nothing from rank %u of TP %u", p->tp.rank, p->tp.size,
			 me.rank, me.size);
	else if (tp_slice_refusal(&sl, p->path, me, p->tp, why,
				  sizeof(why)))
		;
	else if (xfer_find(a, id) ||
		 (g && (g->role != XFER_SEND || g->finished ||
			(!g->tp && (!g->announced || g->peer_addr[0])))))
		snprintf(why, sizeof(why), "transfer is not for this agent");
	else if (!g && (ended = pdx_ended_find(a->ended, of, NULL)) != NULL)
		snprintf(why, sizeof(why), "transfer ended here: %s", ended);
	else if (!g && !(g = xfer_new(a, of, XFER_SEND, "",
				      a->cfg.xfer_timeout_ms)))
		snprintf(why, sizeof(why), "sender is full");
	else if (!g->tp && !group_new(g, p->tp.size > me.size ?
					     p->tp.size / me.size : 1,
				      p->tp.size))
		snprintf(why, sizeof(why), "out of memory");
	else if (g->tp->peer_size != p->tp.size)
		snprintf(why, sizeof(why), "want: from TP %u, its other legs' "
			 "TP is %u", p->tp.size, g->tp->peer_size);
	else if (g->tp->joined == g->tp->expected)
		snprintf(why, sizeof(why), "transfer has all its %u legs",
			 g->tp->expected);
	else if (!(leg = xfer_new(a, id, XFER_SEND, p->addr, g->timeout_ms)))
		snprintf(why, sizeof(why), "sender is full");
	if (why[0]) {
		free(blocks);
		log_warn("want from %s refused: %s", p->addr, why);
		peer_send(a, p, "error", id, why);
		return;
	}
	group_join(g, leg);
	leg->peer = p;
	leg->peer_instance = p->instance;
	leg->peer_tp = p->tp;
	leg->slice = sl;
	leg->remote_blocks = blocks;
	leg->n_remote = n; /* checked against ours before any push */
	leg->skip = skip;
	leg->pull = pull;
	pdx_xfer_sm_blocks_known(&leg->sm);
	if (g->tp->joined == g->tp->expected && g->announced) {
		pdx_xfer_sm_blocks_known(&g->sm);
		xfer_begin_phase(g); /* its lease ends */
	} else if (g->tp->joined == g->tp->expected) {
		pdx_xfer_sm_blocks_known(&g->sm);
	}
	if (g->announced) {
		leg_announce(g, leg);
		group_push(g);
	}
}

bool tp_legs_holder(const struct agent *a, const struct peer *p,
		    const struct xfer *x)
{
	return a->reg.ok && p->tp.size != a->reg.tp.size && x &&
	       x->role == XFER_SEND && !x->finished && !x->peer_addr[0] &&
	       (x->tp || x->announced);
}

bool tp_legs_abort(struct agent *a, struct peer *p, const struct pdx_xfer_id *id,
		   const char *reason)
{
	const struct pdx_kv_layout *l = &a->reg.layout;
	struct tp_rank me = a->reg.tp;
	char why[PDX_REASON_MAX];
	struct pdx_xfer_id of;
	struct tp_slice sl;
	struct xfer *g = xfer_find(a, id);
	bool skip_all;

	if (!a->reg.ok || p->tp.size == me.size ||
	    !pair(l, l->kv_heads * me.size, me, p->tp, &sl, &skip_all))
		return false;
	if (g && !tp_legs_holder(a, p, g))
		return false; /* a leg of ours, or not an open send */
	if (!g) {
		tp_leg_id(id, me.rank, p->tp.rank, &of); /* its own inverse */
		g = xfer_find(a, &of);
		if (g && !tp_legs_holder(a, p, g))
			return false;
	} else {
		of = *id; /* the engines' id itself (abort_at) */
	}
	snprintf(why, sizeof(why), "aborted by %s (rank %u of TP %u) before "
		 "it asked: %s", p->addr, p->tp.rank, p->tp.size, reason);
	if (g) {
		xfer_fail(g, PDX_ECANCELED, false, "%s", why);
	} else {
		/* Unknown here: the engines' id (abort_at) or a leg's. Our
		 * engine's send of it, to come, fails at once. */
		pdx_ended_add(a->ended, id, "", why);
		pdx_ended_add(a->ended, &of, "", why);
	}
	return true;
}

void tp_legs_announced(struct xfer *x)
{
	if (x->peer_addr[0]) {
		xfer_fail(x, PDX_EINVAL, false, "send names %s, but legs of "
			  "another TP size asked for it", x->peer_addr);
		return;
	}
	if (x->tp->joined == x->tp->expected)
		xfer_begin_phase(x);
	for (uint32_t i = 0; i < x->tp->joined && !x->finished; i++) {
		struct xfer *leg = group_leg(x, i);

		if (leg && !leg->announced)
			leg_announce(x, leg);
	}
	if (!x->finished)
		group_push(x);
}

void tp_legs_layer_done(struct xfer *x, uint32_t layer)
{
	for (uint32_t i = 0; i < x->tp->joined && !x->finished; i++) {
		struct xfer *leg = group_leg(x, i);

		if (!leg || !leg->announced)
			continue;
		pdx_xfer_sm_computed(&leg->sm, layer);
		leg->progress_ns = pdx_now_ns();
	}
	if (!x->finished)
		group_push(x);
}

void tp_legs_beside(struct xfer *x)
{
	for (uint32_t i = 0; i < x->tp->joined; i++) {
		struct xfer *leg = group_leg(x, i);

		if (leg && !leg->finished)
			leg_beside(x, leg);
	}
}

void tp_legs_decided(struct xfer *x)
{
	struct xfer *g = x->group;

	if (g && g->finished)
		return;
	if (g && x->status) {
		xfer_fail(g, x->status, false, "%s rank %u of TP %u (%s): %s",
			  x->role == XFER_SEND ? "to" : "from", x->peer_tp.rank,
			  x->peer_tp.size, x->peer_addr, x->reason);
	} else if (g) {
		g->bytes += x->bytes;
		if (x->first_token >= 0)
			g->first_token = x->first_token;
		if (x->meta_len) { /* every sender's is its group's: one */
			free(g->meta);
			g->meta = x->meta;
			g->meta_len = x->meta_len;
			x->meta = NULL;
			x->meta_len = 0;
		}
		if (++g->tp->succeeded == g->tp->expected)
			xfer_succeed(g);
	} else if (x->tp && x->status) {
		for (uint32_t i = 0; i < x->tp->joined; i++) {
			struct xfer *leg = group_leg(x, i);

			if (leg)
				xfer_fail(leg, PDX_ECANCELED, true, "%s",
					  x->reason);
		}
	}
}
