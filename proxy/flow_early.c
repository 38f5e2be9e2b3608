/* The early-callback flow (see flow.h): D is dispatched when P's engine
 * posts to /v1/metaserver that its prefill started. */
#define PDX_LOG_TOPIC "early"
#include "proxy/flow.h"

#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proxy/call.h"

/* P answered. Still no callback: P's answer is D's request, as in the
 * sequential flow. Else as in the concurrent flow: only a failure before
 * D said anything matters. A failure starts the request over when
 * --retries allows (flow.h). */
static void prefill_end(struct pdx_upstream *u, int status,
			struct evbuffer *body, int err_status, const char *why,
			void *arg)
{
	struct pdx_call *c = arg;
	json_t *resp, *kv;

	if (c->awaiting_callback) {
		c->awaiting_callback = false;
		if (status != 200 && pdx_flow_retry(c, u, status, why))
			return;
		if (status != 200) {
			pdx_flow_prefill_failed(c, status, body, err_status,
						why);
			return;
		}
		log_info("%s: prefill answered before its callback; "
			 "sequential", c->req_id);
		resp = json_loadb((const char *)evbuffer_pullup(body, -1),
				  evbuffer_get_length(body), 0, NULL);
		kv = json_object_get(resp, "kv_transfer_params");
		/* D's policy as the callback would have said it (it was
		 * left out: --on-transfer-failure ignored whenever P
		 * answered first) */
		if (json_is_object(kv) && pdx_flow_failure_policy(c, kv)) {
			json_decref(resp);
			pdx_call_reply_error(c, 500, "internal_error",
					     "out of memory");
			return;
		}
		pdx_flow_send_decode(c, kv);
		json_decref(resp);
		return;
	}
	if (status == 200 || c->replying || pdx_flow_retry(c, u, status, why))
		return;
	pdx_pool_put(c->decode);
	c->decode = pdx_call_leg_cancel(c);
	pdx_flow_prefill_failed(c, status, body, err_status, why);
}

static void send_prefill(struct pdx_call *c)
{
	static const struct pdx_upstream_cbs prefill = {.on_end = prefill_end};
	struct pdx_upstream_cbs cbs = prefill;
	char *body = pdx_flow_prefill_body(c, c->px->metaserver_url);
	struct pdx_inst *p = c->prefill;

	if (!body) {
		pdx_call_reply_error(c, 500, "internal_error", "out of memory");
		return;
	}
	pdx_flow_count_transfer(c, p);
	c->prefill = NULL; /* the side leg's now */
	cbs.arg = c;
	c->awaiting_callback = true;
	pdx_call_side(c, p, c->path, body, strlen(body), &cbs);
	free(body);
}

void pdx_flow_early_callback(struct pdx_call *c)
{
	if (pdx_flow_pick(c))
		return;
	if (!c->prefill) {
		pdx_flow_send_decode(c, NULL);
		return;
	}
	pdx_flow_learn_peers(c, send_prefill);
}

/* The call of this transfer, or NULL. The xfer_id (128 random bits,
 * known only to the proxy and the two engines) is what matches a post
 * to its call. */
static struct pdx_call *transfer_call(struct pdx_proxy *px, const char *xfer)
{
	struct pdx_call *c;

	LIST_FOREACH(c, &px->calls, link)
		if (c->xfer_id[0] && !strcmp(c->xfer_id, xfer))
			return c;
	return NULL;
}

void pdx_flow_metaserver(struct pdx_proxy *px, struct evhttp_request *req)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(req);
	json_t *kv = json_loadb((const char *)evbuffer_pullup(in, -1),
				evbuffer_get_length(in), 0, NULL);
	const char *xfer = json_string_value(json_object_get(kv, "xfer_id"));
	struct pdx_call *c;

	if (!json_is_object(kv) || !xfer) {
		json_decref(kv);
		pdx_http_send_error(req, 400, "invalid_request_error",
				     "want a JSON object with an xfer_id");
		return;
	}
	c = transfer_call(px, xfer);
	if (c && !c->awaiting_callback) {
		/* P answered first and D has it: nothing to do, and
		 * nothing for P to warn of (a 404 made it warn at every
		 * request that went so) */
		json_decref(kv);
		pdx_http_send_json(req, 200, json_pack("{s:s}", "status",
						       "already dispatched"));
		return;
	}
	if (!c) {
		json_decref(kv);
		pdx_http_send_error(req, 404, "not_found_error",
				     "no request waits for this transfer");
		return;
	}
	log_debug("%s: prefill started; decode dispatched", c->req_id);
	c->awaiting_callback = false;
	json_object_del(kv, "request_id"); /* vllm-ascend's; not D's */
	pdx_flow_failure_policy(c, kv);
	pdx_http_send_json(req, 200, json_pack("{s:s}", "status", "ok"));
	pdx_flow_send_decode(c, kv);
	json_decref(kv);
}
