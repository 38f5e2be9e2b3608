/* The concurrent flow (see flow.h): P and D at once, the KV pushed layer
 * by layer from P's agent to D's while P computes. */
#define PDX_LOG_TOPIC "concurrent"
#include "proxy/flow.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proxy/call.h"

/* P's answer is only looked at when P failed. If D has said nothing yet
 * it is waiting for KV that will not come: the request starts over on
 * another P with a new transfer (--retries), or D is cancelled (its
 * engine aborts the transfer and frees its blocks) and the failure policy
 * applies. Once D streams, its KV has arrived, and P's late trouble does
 * not matter. */
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
	if (pdx_flow_retry(c, u, status, why))
		return;
	pdx_pool_put(c->decode);
	c->decode = pdx_call_leg_cancel(c);
	pdx_flow_prefill_failed(c, status, body, err_status, why);
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
