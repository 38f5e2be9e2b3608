/* The sequential flow (see flow_sequential.h). */
#define PDX_LOG_TOPIC "sequential"
#include "proxy/flow_sequential.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdx/engine.h>

#include "common/log.h"
#include "proxy/call.h"

/* The client's body bytes, as they came. */
static const char *client_body(struct pdx_call *c, size_t *len)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(c->req);

	*len = evbuffer_get_length(in);
	return (const char *)evbuffer_pullup(in, -1);
}

/* The decode instance chosen up front, handed to its leg. */
static struct pdx_inst *decode_take(struct pdx_call *c)
{
	struct pdx_inst *d = c->decode;

	c->decode = NULL;
	return d;
}

/* D's request: the client's, with P's kv_transfer_params when P sent
 * some. */
static void send_decode(struct pdx_call *c, json_t *kv)
{
	const char *raw;
	size_t len;
	json_t *d;
	char *s;

	if (!json_is_object(kv)) {
		raw = client_body(c, &len);
		pdx_call_relay(c, decode_take(c), PDX_POOL_DECODE,
			       EVHTTP_REQ_POST, c->path, raw, len);
		return;
	}
	d = json_deep_copy(c->body);
	if (!d || json_object_set(d, "kv_transfer_params", kv)) {
		json_decref(d);
		pdx_call_reply_error(c, 500, "internal_error", "out of memory");
		return;
	}
	s = json_dumps(d, JSON_COMPACT);
	json_decref(d);
	if (!s) {
		pdx_call_reply_error(c, 500, "internal_error", "out of memory");
		return;
	}
	pdx_call_relay(c, decode_take(c), PDX_POOL_DECODE, EVHTTP_REQ_POST,
		       c->path, s, strlen(s));
	free(s);
}

static void prefill_end(struct pdx_upstream *u, int status,
			struct evbuffer *body, int err_status, const char *why,
			void *arg)
{
	struct pdx_call *c = arg;
	json_error_t jerr;
	json_t *resp;

	pdx_call_leg_done(c);
	if (status != 200 && c->px->o->prefill_fallback) {
		log_debug("%s: prefill failed (%d%s%s); decode prefills itself",
			  c->req_id, status ? status : err_status,
			  why ? ": " : "", why ? why : "");
		send_decode(c, NULL);
		return;
	}
	if (!status) {
		pdx_call_reply_error(c, err_status, "upstream_error", why);
		return;
	}
	if (status != 200) { /* the engine's own error, e.g. a bad prompt */
		pdx_call_reply(c, status, body);
		return;
	}
	resp = json_loadb((const char *)evbuffer_pullup(body, -1),
			  evbuffer_get_length(body), 0, &jerr);
	if (!json_is_object(resp)) {
		json_decref(resp);
		log_warn("%s: prefill instance answered no JSON object",
			 c->req_id);
		pdx_call_reply_error(c, 502, "upstream_error",
				     "prefill instance returned invalid JSON");
		return;
	}
	send_decode(c, json_object_get(resp, "kv_transfer_params"));
	json_decref(resp);
}

/* P's request: the client's, with max_tokens 1, no streaming, and
 * do_remote_decode, an xfer_id and D's agent (when D has one) merged into
 * whatever kv_transfer_params it had. */
static char *prefill_body(json_t *client, const char *d_peer)
{
	json_t *p = json_deep_copy(client), *kv;
	char *s = NULL;

	if (!p)
		return NULL;
	kv = json_object_get(p, "kv_transfer_params");
	if (!json_is_object(kv)) {
		kv = json_object();
		if (json_object_set_new(p, "kv_transfer_params", kv))
			goto out;
	}
	if (!json_is_string(json_object_get(kv, "xfer_id"))) {
		struct pdx_xfer_id x;
		char hex[33];

		if (pdx_xfer_id_random(&x) != PDX_OK)
			goto out;
		pdx_xfer_id_hex(&x, hex);
		if (json_object_set_new(kv, "xfer_id", json_string(hex)))
			goto out;
	}
	if (*d_peer && !json_object_get(kv, "remote_agent") &&
	    json_object_set_new(kv, "remote_agent", json_string(d_peer)))
		goto out;
	if (json_object_set_new(kv, "do_remote_decode", json_true()) ||
	    json_object_set_new(p, "max_tokens", json_integer(1)) ||
	    json_object_set_new(p, "stream", json_false()))
		goto out;
	if (json_object_get(p, "max_completion_tokens"))
		json_object_set_new(p, "max_completion_tokens",
				    json_integer(1));
	json_object_del(p, "stream_options");
	s = json_dumps(p, JSON_COMPACT);
out:
	json_decref(p);
	return s;
}

static void send_prefill(struct pdx_call *c)
{
	static const struct pdx_upstream_cbs prefill = {.on_end = prefill_end};
	struct pdx_upstream_cbs cbs = prefill;
	char *body = prefill_body(c->body, c->decode->peer);

	if (!body) {
		pdx_call_reply_error(c, 500, "internal_error", "out of memory");
		return;
	}
	cbs.arg = c;
	pdx_call_leg(c, NULL, PDX_POOL_PREFILL, c->path, body, strlen(body),
		     &cbs);
	free(body);
}

/* D's /v1/pdx/info answered: its agent's peer address, if it has one.
 * An engine without the route (404) has none; an unreachable one is
 * asked again next time (and D's own leg will say what is wrong). */
static void info_end(struct pdx_upstream *u, int status, struct evbuffer *body,
		     int err_status, const char *why, void *arg)
{
	struct pdx_call *c = arg;
	struct pdx_inst *d = c->decode;
	json_t *j;

	if (status == 200) {
		const char *peer;

		j = json_loadb((const char *)evbuffer_pullup(body, -1),
			       evbuffer_get_length(body), 0, NULL);
		peer = json_string_value(json_object_get(j, "peer_addr"));
		snprintf(d->peer, sizeof(d->peer), "%s", peer ? peer : "");
		json_decref(j);
	}
	if (status)
		d->peer_known = true;
	log_debug("%s: decode instance %s: agent %s", c->req_id, d->url,
		  d->peer[0] ? d->peer : "none");
	pdx_call_leg_done(c);
	send_prefill(c);
}

void pdx_flow_sequential(struct pdx_call *c)
{
	static const struct pdx_upstream_cbs info = {.on_end = info_end};
	struct pdx_upstream_cbs cbs = info;

	/* D first: P must know where D's agent is to push the KV there */
	c->decode = pdx_pool_pick(&c->px->pool[PDX_POOL_DECODE]);
	if (!c->decode) {
		pdx_call_reply_error(c, 503, "service_unavailable",
				     "no decode instance available");
		return;
	}
	if (!c->px->pool[PDX_POOL_PREFILL].n) {
		send_decode(c, NULL);
		return;
	}
	if (c->decode->peer_known) {
		send_prefill(c);
		return;
	}
	cbs.arg = c;
	pdx_pool_hold(c->decode);
	pdx_call_leg(c, c->decode, PDX_POOL_DECODE, "/v1/pdx/info", NULL, 0,
		     &cbs);
}
