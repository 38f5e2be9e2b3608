/* The concurrent flow (see flow.h): P and D at once, the KV pushed layer
 * by layer from P's agent to D's while P computes. */
#define PDX_LOG_TOPIC "concurrent"
#include "proxy/flow.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "common/log.h"
#include "proxy/call.h"

/* How long D may take to answer once P failed on D's account. */
#define DECODE_GRACE_MS 1000

/* P failed, and D has said nothing yet: D is waiting for KV that will not
 * come. The request starts over on other instances with a new transfer
 * (--retries), or D is cancelled (its engine aborts the transfer and
 * frees its blocks) and the failure policy applies. */
static void prefill_failed(struct pdx_call *c, struct pdx_inst *failed,
			   int status, struct evbuffer *body, int err_status,
			   const char *why)
{
	if (pdx_flow_retry_inst(c, failed, status, why))
		return;
	pdx_pool_put(c->decode);
	c->decode = pdx_call_leg_cancel(c);
	pdx_flow_prefill_failed(c, status, body, err_status, why);
}

static void grace_over(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_call *c = arg;
	struct pdx_call_grace *g = c->grace;

	c->grace = NULL; /* the call may end below */
	if (c->replying) { /* D answers after all (it prefilled itself) */
		pdx_call_grace_free(g);
		return;
	}
	log_info("%s: decode said nothing %u ms after prefill failed on its "
		 "account", c->req_id, DECODE_GRACE_MS);
	prefill_failed(c, g->failed, g->status, g->body, g->err_status,
		       g->why[0] ? g->why : NULL);
	pdx_call_grace_free(g);
}

/* P's failure blamed on D (pdx-engine's 502 "failed on the other side":
 * D's engine refused the request and aborted the transfer, say) races
 * D's own answer, which says why (a 400: the prompt passes its context)
 * and is the one to relay: D is given DECODE_GRACE_MS to answer, and P's
 * failure is dealt with after only if it did not. false: out of memory. */
static bool await_decode(struct pdx_call *c, struct pdx_upstream *u,
			 int status, struct evbuffer *body, int err_status,
			 const char *why)
{
	struct pdx_call_grace *g = calloc(1, sizeof(*g));
	struct timeval tv = { DECODE_GRACE_MS / 1000,
			      DECODE_GRACE_MS % 1000 * 1000 };

	if (!g || !(g->ev = evtimer_new(c->px->base, grace_over, c)) ||
	    !(g->body = evbuffer_new()) ||
	    (body && evbuffer_add(g->body, evbuffer_pullup(body, -1),
				  evbuffer_get_length(body)))) {
		pdx_call_grace_free(g);
		return false;
	}
	g->failed = pdx_call_blamed(c, u);
	pdx_pool_ref(g->failed);
	g->status = status;
	g->err_status = err_status;
	snprintf(g->why, sizeof(g->why), "%s", why ? why : "");
	c->grace = g;
	evtimer_add(g->ev, &tv);
	log_debug("%s: prefill failed on decode's account (%d): decode's own "
		  "answer is awaited", c->req_id, status ? status : err_status);
	return true;
}

/* P's answer is only looked at when P failed (above). Once D streams, its
 * KV has arrived, and P's late trouble does not matter. */
void pdx_flow_side_prefill_end(struct pdx_upstream *u, int status,
			       struct evbuffer *body, int err_status,
			       const char *why, void *arg)
{
	struct pdx_call *c = arg;

	if (status == 200)
		return;
	if (c->replying) {
		log_info("%s: prefill leg ended with %d after decode started",
			 c->req_id, status ? status : err_status);
		return;
	}
	if (c->leg && !c->grace &&
	    pdx_call_blamed(c, u) != pdx_upstream_inst(u) &&
	    await_decode(c, u, status, body, err_status, why))
		return;
	prefill_failed(c, pdx_call_blamed(c, u), status, body, err_status,
		       why);
}

static void dispatch(struct pdx_call *c)
{
	static const struct pdx_upstream_cbs prefill = {
	    .on_end = pdx_flow_side_prefill_end};
	struct pdx_upstream_cbs cbs = prefill;
	struct pdx_inst *p = c->prefill;
	char *body;
	json_t *kv;

	if (!c->decode->peer[0] || !p->peer[0]) {
		log_debug("%s: %s has no agent; sequential", c->req_id,
			  p->peer[0] ? c->decode->url : p->url);
		pdx_flow_sequential_prefill(c);
		return;
	}
	kv = pdx_flow_decode_kv(c);
	body = pdx_flow_prefill_body(c, NULL);
	if (!kv || !body) {
		json_decref(kv);
		free(body);
		pdx_call_reply_error(c, 500, "internal_error", "out of memory");
		return;
	}
	pdx_flow_count_transfer(c, p);
	c->prefill = NULL; /* the side leg's now */
	cbs.arg = c;
	if (!pdx_call_side(c, p, c->path, body, strlen(body), &cbs))
		pdx_flow_send_decode(c, kv);
	json_decref(kv);
	free(body);
}

void pdx_flow_concurrent(struct pdx_call *c)
{
	if (pdx_flow_pick(c))
		return;
	if (!c->prefill) {
		pdx_flow_send_decode(c, NULL);
		return;
	}
	pdx_flow_learn_peers(c, dispatch);
}
