/* The proxy's handling of a client's completion request (proxy/server.c,
 * proxy/flow_common.c): the body parsed as the server does, instances
 * picked by the prefix-aware policy (whose key reads the prompt or the
 * chat messages), the transfer id taken from the client or minted, and
 * the prefill leg's body built from it. Whatever the client sent, that
 * body must be a JSON object asking for one token, not streamed, with
 * do_remote_decode and the call's xfer_id; a body that is not an object,
 * or that breaks vLLM's rules (common/oai_params.c), must get its 400
 * error body, the latter naming a parameter. The first byte picks the
 * prefix length and whether a metaserver URL is added; a body with
 * "messages" is taken as /v1/chat/completions'. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/oai_params.h"
#include "proxy/call.h"
#include "proxy/flow.h"
#include "proxy/opts.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct pdx_proxy *proxy(void)
{
	static struct pdx_proxy_opts o;
	static struct pdx_proxy px;
	char err[128];

	if (px.o)
		return &px;
	pdx_log_level = PDX_LOG_ERROR;
	o.flow = PDX_FLOW_SEQUENTIAL;
	o.policy_p = o.policy_d = PDX_POLICY_PREFIX_AWARE;
	px.o = &o;
	px.pool[PDX_POOL_PREFILL].role = PDX_POOL_PREFILL;
	px.pool[PDX_POOL_DECODE].role = PDX_POOL_DECODE;
	for (int r = 0; r < 2; r++) {
		px.pool[r].policy = PDX_POLICY_PREFIX_AWARE;
		if (pdx_pool_add(&px.pool[r], r ? "d1:8000" : "p1:8000", err,
				 sizeof(err)) ||
		    pdx_pool_add(&px.pool[r], r ? "d2:8000" : "p2:8000", err,
				 sizeof(err)))
			abort();
	}
	snprintf(px.pool[PDX_POOL_DECODE].inst[0]->peer, PDX_POOL_ADDR_MAX,
		 "tcp://d1:7000");
	return &px;
}

/* The prefill leg's body, read as the engine reads it. */
static void check_prefill(const char *s, const char *xfer_id)
{
	struct pdx_oai_fault f;
	json_t *p = pdx_oai_body_load(s, strlen(s), &f);
	json_t *kv = json_object_get(p, "kv_transfer_params");

	if (!json_is_object(p) || !json_is_object(kv) ||
	    json_integer_value(json_object_get(p, "max_tokens")) != 1 ||
	    !json_is_false(json_object_get(p, "stream")) ||
	    json_object_get(p, "stream_options") ||
	    !json_is_true(json_object_get(kv, "do_remote_decode")) ||
	    strcmp(json_string_value(json_object_get(kv, "xfer_id")) ?: "",
		   xfer_id))
		abort();
	json_decref(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const size_t prefix[4] = {0, 1, 16, 1024};
	struct pdx_proxy *px = proxy();
	struct pdx_call c = {0};
	struct pdx_oai_fault f;
	char *s;

	if (size < 1)
		return 0;
	((struct pdx_proxy_opts *)px->o)->prefix_len = prefix[data[0] & 3];
	c.px = px;
	c.body = pdx_oai_body_load((const char *)data + 1, size - 1, &f);
	if (!c.body) {
		/* the 400 the server answers must be there to send */
		json_t *e = pdx_http_error_obj(400, "invalid_request_error",
					       NULL, f.message);

		if (!e)
			abort();
		json_decref(e);
		return 0;
	}
	if (pdx_oai_params_check(c.body, json_object_get(c.body, "messages"),
				 &f)) {
		json_t *e = pdx_http_error_obj(400, "invalid_request_error",
					       f.param, f.message);

		if (!e || !f.param[0] ||
		    strnlen(f.param, sizeof(f.param)) == sizeof(f.param))
			abort();
		json_decref(e);
		json_decref(c.body);
		return 0;
	}
	if (pdx_flow_pick(&c) || !c.decode || !c.prefill ||
	    strlen(c.xfer_id) >= sizeof(c.xfer_id))
		abort();
	s = pdx_flow_prefill_body(&c, data[0] & 4 ? "http://proxy:1/cb" : NULL);
	if (!s)
		abort();
	check_prefill(s, c.xfer_id);
	free(s);
	pdx_pool_put(c.decode);
	pdx_pool_put(c.prefill);
	json_decref(c.body);
	return 0;
}
