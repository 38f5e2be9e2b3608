/* One request's KV transfer: the decode side waits (bounded) for its
 * prompt's KV, the prefill side announces its blocks, posts its layers and
 * holds the blocks (bounded) until its agent has sent them. */
#define PDX_LOG_TOPIC "kv"
#include "engine/http_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "engine/http_post.h"
#include "engine/kv_seq.h"

/* Bounds the early callback's post (it matters only before the prefill
 * ends, and the proxy does without it). */
#define CALLBACK_TIMEOUT_S 10

struct pdx__kv {
	LIST_ENTRY(pdx__kv) link; /* api->kvs */
	struct pdx_http_api *api;
	struct pdx_kv_params p;
	uint32_t n_prompt;
	struct pdx_kv_waiter w;
	struct event *timer;	    /* bounds the wait for the event */
	struct pdx_sched_req *sreq; /* while the request lives */
	struct pdx_kv_seq *held;    /* prefill: blocks held after the end */
	struct pdx_http_post *callback; /* prefill: to the metaserver */
	bool call_gone;		    /* the request ended */
	bool abort_sent;	    /* a receive's: the request gone, or */
	bool timed_out;		    /* --kv-timeout-ms passed once */
	bool announced;		    /* to the agent (send or recv) */
	bool quarantined;	    /* held blocks wait out kv_quarantine_ms */
	pdx_status_t status;	    /* the transfer's failure, if any */
	/* it failed on the other side or between the agents, as an event
	 * or the bound on one says (not for a cause of ours) */
	bool partner_failed;
	/* neither side's alone: the agents refused to pair (layouts or
	 * protocol differ: a mismatch of the two), or a bound ran out
	 * waiting for the other side (--kv-timeout-ms here, the agent's
	 * --xfer-timeout-ms): which one was slow, or whose bound was too
	 * short, neither can tell. A proxy counts it against both, and the
	 * one that fails with every partner opens its breaker first
	 * (counted against the other side, a decode instance with a bound
	 * too short opened every good prefill instance's breaker and never
	 * its own; a chaos helper's find) */
	bool both_sides;
	int64_t first_token;	    /* decode: the prefill's, -1: unknown
				     * (first_token_take()) */
	uint64_t done_ns;	    /* when the transfer ended here */
	char reason[PDX_REASON_MAX];
};

static void kv_free(struct pdx__kv *k)
{
	/* A transfer the other side announced and this one never did (a
	 * request that left while queued): its peer frees its blocks now,
	 * not at its timeout. */
	if (!k->announced)
		pdx_kv_link_abort_at(k->api->p.link, &k->p.xfer,
				     &k->p.remote_agents);
	pdx_kv_link_cancel(k->api->p.link, &k->w);
	pdx_http_post_free(k->callback);
	LIST_REMOVE(k, link);
	pdx_kv_seq_free(k->held);
	event_free(k->timer);
	free(k);
}

static void arm_timer(struct pdx__kv *k, uint32_t ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

	evtimer_add(k->timer, &tv);
}

/* The transfer failed because our agent went away (PDX_EAGENT), but
 * that does not mean nobody touches its blocks: an agent that only hung
 * goes on when it resumes, and the peer agent may write into them
 * (shared or GPU memory mapped straight) until it notices ours is gone
 * (its --peer-timeout-ms). So they are held kv_quarantine_ms (seq: the
 * request's, now ours; NULL: already held) and only then reused.
 * False when there is no quarantine. */
static bool quarantine(struct pdx__kv *k, struct pdx_kv_seq *seq)
{
	uint32_t ms = k->api->p.kv_quarantine_ms;

	if (!ms)
		return false;
	if (seq)
		k->held = seq;
	k->quarantined = true;
	arm_timer(k, ms);
	log_info("%s: its KV blocks are held %u ms more: the agent went away, "
		 "and it or its peer may still write them",
		 k->p.xfer_hex, ms);
	return true;
}

/* The transfer's first failure, the one reported. */
static void failure(struct pdx__kv *k, pdx_status_t st, const char *reason)
{
	if (st == PDX_OK || k->status != PDX_OK)
		return;
	k->status = st;
	snprintf(k->reason, sizeof(k->reason), "KV transfer %s: %s",
		 k->p.xfer_hex, reason);
	log_warn("%s", k->reason);
}

/* The transfer is over (event, timeout or a failed start). */
static void over(struct pdx__kv *k, pdx_status_t st, const char *reason)
{
	evtimer_del(k->timer);
	k->done_ns = pdx_now_ns();
	failure(k, st, reason);
	if (k->p.role == PDX_KV_RECV && k->sreq) {
		pdx_sched_kv_ready(k->api->p.sched, k->sreq,
				   k->status != PDX_OK ? k->status : st,
				   k->first_token);
	} else if (k->call_gone) {
		if (st == PDX_EAGENT && k->held && quarantine(k, NULL))
			return;
		kv_free(k); /* its held blocks are free again */
	}
}

/* The prefill's first token as the agents carried it with the KV (-1:
 * none, e.g. from a sender engine that gives none) wins over the
 * request's: that came by way of whoever built the request (a proxy
 * copying P's answer, where the two agree, or a client), and decoding
 * from another token than the one the KV was computed for answers
 * wrongly. The request's stands in when the agents carried none. */
static void first_token_take(struct pdx__kv *k, int64_t carried)
{
	if (carried < 0)
		return;
	if (k->first_token >= 0 && k->first_token != carried)
		log_warn("%s: first token %lld in kv_transfer_params, %lld "
			 "from the prefill side's agent: decoding from %lld",
			 k->p.xfer_hex, (long long)k->first_token,
			 (long long)carried, (long long)carried);
	k->first_token = carried;
}

/* A failed event's cause: the other side, or the way to it (not ours:
 * failed_here), or a mismatch of the two. */
static void failed_why(struct pdx__kv *k, const struct pdx_engine_event *ev,
		       bool failed_here)
{
	k->partner_failed =
	    !failed_here &&
	    (ev->status == PDX_EPEER || ev->status == PDX_ETIMEDOUT ||
	     ev->status == PDX_ECANCELED || ev->status == PDX_ENOENT ||
	     ev->status == PDX_EINCOMPAT);
	k->both_sides = ev->status == PDX_EINCOMPAT ||
			ev->status == PDX_ETIMEDOUT;
}

static void on_event(void *arg, const struct pdx_engine_event *ev)
{
	struct pdx__kv *k = arg;

	log_debug("%s: event %d (%s)", k->p.xfer_hex, ev->kind, ev->reason);
	if (ev->kind == PDX_EVENT_FAILED) {
		/* the cause goes with the failure reported, the first (the
		 * event after our own bound's abort said the other side's) */
		if (k->status == PDX_OK)
			failed_why(k, ev, k->w.failed_here);
		over(k, ev->status != PDX_OK ? ev->status : PDX_EIO,
		     ev->reason[0] ? ev->reason : pdx_status_str(ev->status));
	}
	else {
		first_token_take(k, ev->first_token);
		over(k, PDX_OK, "");
	}
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct pdx__kv *k = arg;

	if (k->quarantined) {
		/* nobody writes them any more: free again */
		k->quarantined = false;
		pdx_kv_seq_free(k->held);
		k->held = NULL;
		if (k->call_gone)
			kv_free(k);
		return;
	}
	/* our agent answers (its liveness would have said): the other side
	 * did not come, or our bound is too short */
	k->partner_failed = true;
	k->both_sides = true;
	if (k->p.role == PDX_KV_RECV && k->w.active && !k->timed_out) {
		/* a receive's blocks are written until its agent's event,
		 * which comes once the sender said nothing more lands:
		 * aborted, and the event awaited (as long again at most)
		 * before they are recomputed or reused */
		k->timed_out = true;
		failure(k, PDX_ETIMEDOUT, "no event in time (--kv-timeout-ms)");
		k->abort_sent = true;
		pdx_kv_link_abort(k->api->p.link, &k->w);
		arm_timer(k, k->api->p.kv_timeout_ms);
		return;
	}
	pdx_kv_link_cancel(k->api->p.link, &k->w);
	over(k, PDX_ETIMEDOUT, "no event in time (--kv-timeout-ms)");
}

struct pdx__kv *pdx__kv_new(struct pdx_http_api *api,
			    const struct pdx_kv_params *p, uint32_t n_prompt)
{
	struct pdx__kv *k = calloc(1, sizeof(*k));

	if (!k)
		return NULL;
	k->timer = evtimer_new(api->p.base, on_timeout, k);
	if (!k->timer) {
		free(k);
		return NULL;
	}
	k->api = api;
	k->p = *p;
	k->n_prompt = n_prompt;
	k->first_token = p->first_token;
	k->w.xfer = p->xfer;
	k->w.cb = on_event;
	k->w.arg = k;
	LIST_INSERT_HEAD(&api->kvs, k, link);
	return k;
}

void pdx__kv_set_req(struct pdx__kv *k, struct pdx_sched_req *sreq)
{
	k->sreq = sreq;
	/* Queued: the prefill side keeps its KV while we wait for room. */
	if (k->p.role == PDX_KV_RECV && !k->announced)
		pdx_kv_link_hold(k->api->p.link, &k->p.xfer,
				 &k->p.remote_agents);
}

/* The decode side's kv_transfer_params (first_token < 0: left out): its
 * own agent, and in a TP instance every rank's. */
static json_t *answer(const struct pdx__kv *k, int64_t first_token)
{
	struct pdx_kv_link *l = k->api->p.link;
	json_t *o = pdx_kv_params_answer(&k->p, pdx_kv_link_peer(l),
					 first_token);
	struct pdx_kv_peers *own = malloc(sizeof(*own));

	if (own)
		pdx_kv_link_peers(l, own);
	if (o && (!own || pdx_kv_params_answer_ranks(o, own))) {
		json_decref(o);
		o = NULL;
	}
	free(own);
	return o;
}

/* Early callback: the decode side's kv_transfer_params, posted to the
 * proxy now that the prefill starts, so it dispatches the decode side. */
static void post_callback(struct pdx__kv *k)
{
	json_t *o = answer(k, -1);
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	char err[128];

	json_decref(o);
	if (s)
		k->callback = pdx_http_post_start(k->api->p.base,
						  k->p.metaserver, s,
						  CALLBACK_TIMEOUT_S, err,
						  sizeof(err));
	if (!k->callback)
		log_warn("%s: early callback to %s: %s", k->p.xfer_hex,
			 k->p.metaserver, s ? err : "out of memory");
	free(s);
}

void pdx__kv_held_event(void *arg, const struct pdx_engine_event *ev)
{
	struct pdx_http_api *api = arg;
	pdx_status_t st = ev->status != PDX_OK ? ev->status : PDX_EIO;
	struct pdx__kv *k;

	if (ev->kind != PDX_EVENT_FAILED)
		return;
	LIST_FOREACH(k, &api->kvs, link)
		if (k->p.role == PDX_KV_RECV && !k->announced && k->sreq &&
		    k->status == PDX_OK &&
		    !memcmp(&k->p.xfer, &ev->xfer, sizeof(ev->xfer)))
			break;
	if (!k)
		return;
	/* the agent said it: no link of ours was lost (that is PDX_EAGENT,
	 * made by libpdx) */
	failed_why(k, ev, ev->status == PDX_EAGENT ||
			      ev->status == PDX_ENOTREG);
	failure(k, st, ev->reason[0] ? ev->reason : pdx_status_str(st));
	k->done_ns = pdx_now_ns();
	/* last: the request may end here, and k with it */
	pdx_sched_kv_failed_queued(api->p.sched, k->sreq, st);
}

void pdx__kv_admitted(struct pdx__kv *k, struct pdx_kv_seq *seq)
{
	uint32_t bt = pdx_kv_pool_layout(seq->pool)->block_tokens;
	uint32_t n = (k->n_prompt + bt - 1) / bt;
	struct pdx_kv_link *l = k->api->p.link;
	pdx_status_t st;

	if (k->p.role == PDX_KV_RECV && k->status != PDX_OK)
		return; /* failed while queued: prefilled here (recompute) */
	k->w.tokens = seq->tokens; /* the follower ranks check their KV */
	k->w.n_tokens = k->n_prompt;
	if (k->p.role == PDX_KV_RECV)
		st = pdx_kv_link_recv(l, &k->w, &k->p.remote_agents,
				      seq->blocks, n, seq->cached);
	else /* no remote_agent: the first agent to claim it */
		st = pdx_kv_link_send(l, &k->w, &k->p.remote_agents,
				      seq->blocks, n);
	if (st != PDX_OK) {
		over(k, st,
		     st == PDX_EPEER	? "cannot reach the agent"
		     : st == PDX_EEXIST ? "a transfer of this xfer_id is in "
					  "flight here already (an xfer_id "
					  "names one request)"
					: "the agent refused it");
		return;
	}
	k->announced = true;
	arm_timer(k, k->api->p.kv_timeout_ms);
	if (k->p.metaserver[0])
		post_callback(k);
}

void pdx__kv_layer_done(struct pdx__kv *k, uint32_t layer, uint32_t slot)
{
	if (k->w.active)
		pdx_kv_link_layer_done(k->api->p.link, &k->w, layer, slot);
}

uint64_t pdx__kv_done_ns(const struct pdx__kv *k)
{
	return k->done_ns;
}

bool pdx__kv_receives(const struct pdx__kv *k)
{
	return k->p.role == PDX_KV_RECV;
}

void pdx__kv_first_token(struct pdx__kv *k, uint32_t token)
{
	if (k->w.active)
		pdx_kv_link_token(k->api->p.link, &k->w, token);
}

bool pdx__kv_hold(struct pdx__kv *k, struct pdx_kv_seq *seq)
{
	/* (one never announced, failed while queued, touched no blocks) */
	if (k->status == PDX_EAGENT && k->announced)
		return quarantine(k, seq);
	/* a send's blocks until it is sent; a receive's (its request gone
	 * while the KV came) until the agent's event: the push may land in
	 * them until then, and another request's KV would be overwritten */
	if (!k->w.active || (k->p.role == PDX_KV_RECV && !k->announced))
		return false;
	k->held = seq;
	return true;
}

json_t *pdx__kv_answer(const struct pdx__kv *k, uint32_t first_token)
{
	if (k->p.role != PDX_KV_SEND)
		return NULL;
	return answer(k, first_token);
}

pdx_status_t pdx__kv_status(const struct pdx__kv *k, const char **reason)
{
	*reason = k->reason;
	/* the decode side's failures are the scheduler's (on_failure) */
	return k->p.role == PDX_KV_SEND ? k->status : PDX_OK;
}

bool pdx__kv_partner_failed(const struct pdx__kv *k)
{
	return k->status != PDX_OK && k->partner_failed;
}

bool pdx__kv_both_sides(const struct pdx__kv *k)
{
	return k->status != PDX_OK && k->both_sides;
}

void pdx__kv_call_end(struct pdx__kv *k)
{
	k->sreq = NULL;
	k->call_gone = true;
	if (!k->held) {
		kv_free(k); /* aborts a transfer still under way */
	} else if (k->p.role == PDX_KV_RECV && !k->quarantined &&
		   !k->abort_sent) {
		/* the blocks are freed at the event (over()) */
		k->abort_sent = true;
		pdx_kv_link_abort(k->api->p.link, &k->w);
	}
}

void pdx__kv_free_all(struct pdx_http_api *api)
{
	struct pdx__kv *k;

	while ((k = LIST_FIRST(&api->kvs)))
		kv_free(k);
}
