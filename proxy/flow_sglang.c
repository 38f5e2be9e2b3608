/* The sglang flow (see flow.h): SGLang's router's shape. P and D get the
 * same request at once, with P's host, P's bootstrap server port and a
 * room added; SGLang's transfer backend (pdx.sglang or another) pairs the
 * two by the room through P's bootstrap server, so the proxy names no
 * agent and no xfer_id. */
#define PDX_LOG_TOPIC "sglang"
#include "proxy/flow.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdx/engine.h>

#include "common/log.h"
#include "proxy/call.h"

/* SGLang's router draws a room in [0, 2^63): 63 random bits, so engines
 * that keep it in an int64 take it. */
static int room_mint(json_int_t *room)
{
	struct pdx_xfer_id x;
	uint64_t v;

	if (pdx_xfer_id_random(&x) != PDX_OK)
		return -1;
	memcpy(&v, x.b, sizeof(v));
	*room = (json_int_t)(v >> 1);
	return 0;
}

/* The client's body with bootstrap_host (an IPv6 address in brackets,
 * as SGLang's router writes it), bootstrap_port and bootstrap_room set;
 * NULL: out of memory or no random bytes. */
static char *sglang_body(struct pdx_call *c, const struct pdx_inst *p)
{
	char host[PDX_POOL_ADDR_MAX + 2];
	json_t *b = json_copy(c->body); /* shallow: new top-level keys */
	json_int_t room;
	char *s = NULL;

	snprintf(host, sizeof(host), strchr(p->host, ':') ? "[%s]" : "%s",
		 p->host);
	if (b && !room_mint(&room) &&
	    !json_object_set_new(b, "bootstrap_host", json_string(host)) &&
	    !json_object_set_new(b, "bootstrap_port",
				 json_integer(p->bootstrap_port)) &&
	    !json_object_set_new(b, "bootstrap_room", json_integer(room))) {
		s = json_dumps(b, JSON_COMPACT);
		log_debug("%s: room %lld, bootstrap %s:%u", c->req_id,
			  (long long)room, host, p->bootstrap_port);
	}
	json_decref(b);
	return s;
}

static void dispatch(struct pdx_call *c)
{
	static const struct pdx_upstream_cbs prefill = {
	    .on_end = pdx_flow_side_prefill_end};
	struct pdx_upstream_cbs cbs = prefill;
	struct pdx_inst *p = c->prefill;
	char *body = sglang_body(c, p);

	if (!body) {
		pdx_call_reply_error(c, 500, "internal_error",
				     "out of memory or random bytes");
		return;
	}
	c->prefill = NULL; /* the side leg's now */
	cbs.arg = c;
	if (!pdx_call_side(c, p, c->path, body, strlen(body), &cbs))
		pdx_flow_relay_decode(c, body, strlen(body));
	free(body);
}

/* P's GET /get_server_info answered: SGLang's server lists its
 * server_args there, disaggregation_bootstrap_port among them. */
static void info_end(struct pdx_upstream *u, int status, struct evbuffer *body,
		     int err_status, const char *why, void *arg)
{
	struct pdx_call *c = arg;
	struct pdx_inst *p = c->inst;
	json_int_t port = 0;
	char msg[PDX_POOL_ADDR_MAX + 128];

	if (status == 200) {
		json_t *j = json_loadb((const char *)evbuffer_pullup(body, -1),
				       evbuffer_get_length(body), 0, NULL);

		port = json_integer_value(
		    json_object_get(j, "disaggregation_bootstrap_port"));
		json_decref(j);
	}
	if (port > 0 && port <= 65535)
		p->bootstrap_port = (uint16_t)port;
	pdx_call_leg_done(c);
	if (p->bootstrap_port) {
		log_info("%s: prefill instance %s: bootstrap port %u",
			 c->req_id, p->url, p->bootstrap_port);
		dispatch(c);
		return;
	}
	if (status != 200 && pdx_flow_retry(c, u, status, why))
		return;
	if (!status) {
		pdx_call_reply_error(c, err_status, "upstream_error", why);
		return;
	}
	snprintf(msg, sizeof(msg),
		 "prefill instance %s: GET /get_server_info answered %d "
		 "without a disaggregation_bootstrap_port",
		 p->url, status);
	log_warn("%s: %s", c->req_id, msg);
	pdx_call_reply_error(c, 502, "upstream_error", msg);
}

void pdx_flow_sglang(struct pdx_call *c)
{
	static const struct pdx_upstream_cbs info = {.on_end = info_end};
	struct pdx_upstream_cbs cbs = info;

	if (pdx_flow_pick(c))
		return;
	if (!c->prefill) {
		pdx_flow_send_decode(c, NULL);
		return;
	}
	if (c->prefill->bootstrap_port) {
		dispatch(c);
		return;
	}
	cbs.arg = c;
	pdx_pool_hold(c->prefill);
	pdx_call_leg(c, c->prefill, PDX_POOL_PREFILL, "/get_server_info", NULL,
		     0, &cbs);
}
