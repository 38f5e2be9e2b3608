/* The sequential flow (see flow.h): P to its first token, then D with
 * P's kv_transfer_params. */
#define PDX_LOG_TOPIC "sequential"
#include "proxy/flow.h"

#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proxy/call.h"

static void prefill_end(struct pdx_upstream *u, int status,
			struct evbuffer *body, int err_status, const char *why,
			void *arg)
{
	struct pdx_call *c = arg;
	json_t *resp;

	pdx_call_leg_done(c);
	if (status != 200 && pdx_flow_retry(c, u, status, why))
		return;
	if (status != 200) {
		pdx_flow_prefill_failed(c, status, body, err_status, why);
		return;
	}
	resp = json_loadb((const char *)evbuffer_pullup(body, -1),
			  evbuffer_get_length(body), 0, NULL);
	if (!json_is_object(resp)) {
		json_decref(resp);
		log_warn("%s: prefill instance answered no JSON object",
			 c->req_id);
		pdx_call_reply_error(c, 502, "upstream_error",
				     "prefill instance returned invalid JSON");
		return;
	}
	pdx_flow_send_decode(c, json_object_get(resp, "kv_transfer_params"));
	json_decref(resp);
}

void pdx_flow_sequential_prefill(struct pdx_call *c)
{
	static const struct pdx_upstream_cbs prefill = {.on_end = prefill_end};
	struct pdx_upstream_cbs cbs = prefill;
	char *body = pdx_flow_prefill_body(c, NULL);
	struct pdx_inst *p = c->prefill;

	if (!body) {
		pdx_call_reply_error(c, 500, "internal_error", "out of memory");
		return;
	}
	cbs.arg = c;
	pdx_flow_count_transfer(c, p);
	c->prefill = NULL; /* the leg's now */
	pdx_call_leg(c, p, PDX_POOL_PREFILL, c->path, body, strlen(body),
		     &cbs);
	free(body);
}

void pdx_flow_sequential(struct pdx_call *c)
{
	if (pdx_flow_pick(c))
		return;
	if (!c->prefill) {
		pdx_flow_send_decode(c, NULL);
		return;
	}
	pdx_flow_learn_peers(c, pdx_flow_sequential_prefill);
}
