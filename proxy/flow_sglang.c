/* The sglang flow (see flow.h): SGLang's router's shape. P and D get the
 * same request at once; an SGLang instance gets P's host, P's bootstrap
 * server port and a room added, and SGLang's transfer backend (pdx.sglang
 * or another) pairs the two by the room through P's bootstrap server.
 *
 * With one pool of kind pdx the proxy joins the two hand-offs, both
 * about the transfer pdx.sglang makes of the room (room_xfer_id): a
 * pdx-engine D gets kv_transfer_params naming it and P's agent, which
 * P's bootstrap server gives for rank 0; a pdx-engine P gets an open
 * send of it, and the SGLang D a bootstrap server this proxy runs for P
 * (sglang_boot.h), which names P's agent. Either way the room's transfer
 * counts in P's and D's load until their agents report it
 * (transfers.h). */
#define PDX_LOG_TOPIC "sglang"
#include "proxy/flow.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdx/engine.h>

#include "common/log.h"
#include "proxy/call.h"
#include "proxy/sglang_boot.h"

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

/* The transfer pdx.sglang makes of a room between rank 0 and rank 0
 * (pdx.sglang.manager.xfer_id): the room, the tensor-parallel rank and
 * the pipeline rank, big-endian, 8 + 4 + 4 bytes. */
static void room_xfer_id(json_int_t room, char hex[33])
{
	struct pdx_xfer_id x = {{0}};

	for (int k = 0; k < 8; k++)
		x.b[k] = (uint8_t)((uint64_t)room >> (56 - 8 * k));
	pdx_xfer_id_hex(&x, hex);
}

/* The client's body with bootstrap_host (an IPv6 address in brackets,
 * as SGLang's router writes it), bootstrap_port and bootstrap_room set;
 * NULL: out of memory. */
static char *sglang_body(struct pdx_call *c, const char *boot_host,
			 uint16_t boot_port, json_int_t room)
{
	char host[PDX_POOL_ADDR_MAX + 2];
	json_t *b = json_copy(c->body); /* shallow: new top-level keys */
	char *s = NULL;

	snprintf(host, sizeof(host), strchr(boot_host, ':') ? "[%s]" : "%s",
		 boot_host);
	if (b && !json_object_set_new(b, "bootstrap_host", json_string(host)) &&
	    !json_object_set_new(b, "bootstrap_port",
				 json_integer(boot_port)) &&
	    !json_object_set_new(b, "bootstrap_room", json_integer(room)))
		s = json_dumps(b, JSON_COMPACT);
	json_decref(b);
	return s;
}

/* P's body: an SGLang P's with the bootstrap fields (its own server), a
 * pdx-engine P's with kv_transfer_params for an open send of the room's
 * transfer (pdx_flow_prefill_body: an SGLang D has no agent known here,
 * its agent claims the send). */
static char *prefill_body(struct pdx_call *c, const struct pdx_inst *p,
			  json_int_t room)
{
	if (pdx_flow_sglang_pool(c, PDX_POOL_PREFILL))
		return sglang_body(c, p->host, p->bootstrap_port, room);
	return pdx_flow_prefill_body(c, NULL);
}

/* D's body: an SGLang D's with the bootstrap fields (P's bootstrap
 * server: an SGLang P's own, or the one this proxy runs for a pdx P), a
 * pdx-engine D's with kv_transfer_params for the room's transfer from
 * P's agent. */
static char *decode_body(struct pdx_call *c, const struct pdx_inst *p,
			 json_int_t room)
{
	json_t *kv, *d;
	char *s = NULL;

	if (pdx_flow_sglang_pool(c, PDX_POOL_DECODE))
		return sglang_body(c,
				   pdx_flow_sglang_pool(c, PDX_POOL_PREFILL)
				       ? p->host
				       : pdx_sglang_boot_host(c->px),
				   p->bootstrap_port, room);
	kv = pdx_flow_decode_kv(c);
	d = kv ? json_copy(c->body) : NULL;
	if (d && !json_object_set(d, "kv_transfer_params", kv))
		s = json_dumps(d, JSON_COMPACT);
	json_decref(d);
	json_decref(kv);
	return s;
}

/* A pdx P for an SGLang D: P's agent is what D's side asks this proxy's
 * bootstrap server for. false: replied. */
static bool boot_ready(struct pdx_call *c, struct pdx_inst *p)
{
	char msg[PDX_POOL_ADDR_MAX + 160];

	if (pdx_flow_sglang_pool(c, PDX_POOL_PREFILL))
		return true;
	if (!p->peer[0] || p->tp > 1) {
		snprintf(msg, sizeof(msg),
			 "prefill instance %s: %s; an SGLang decode instance "
			 "receives from one agent",
			 p->url,
			 p->peer[0] ? "tensor-parallel"
				    : "no agent (GET /v1/pdx/info)");
		pdx_call_reply_error(c, 502, "upstream_error", msg);
		return false;
	}
	if (pdx_sglang_boot_open(c->px, p, msg, sizeof(msg))) {
		pdx_call_reply_error(c, 500, "internal_error", msg);
		return false;
	}
	return true;
}

static void dispatch(struct pdx_call *c)
{
	static const struct pdx_upstream_cbs prefill = {
	    .on_end = pdx_flow_side_prefill_end};
	struct pdx_upstream_cbs cbs = prefill;
	struct pdx_inst *p = c->prefill, *d = c->decode;
	char *p_body = NULL, *d_body = NULL;
	json_int_t room;

	if (!boot_ready(c, p))
		return;
	if (!room_mint(&room)) {
		room_xfer_id(room, c->xfer_id);
		p_body = prefill_body(c, p, room);
		d_body = p_body ? decode_body(c, p, room) : NULL;
	}
	if (!d_body) {
		free(p_body);
		pdx_call_reply_error(c, 500, "internal_error",
				     "out of memory or random bytes");
		return;
	}
	log_debug("%s: room %lld, transfer %s, P's bootstrap port %u",
		  c->req_id, (long long)room, c->xfer_id, p->bootstrap_port);
	/* an SGLang D's agent is not known here, but its "received" ends
	 * the transfer on D all the same (transfers.c); a pdx D without an
	 * agent reports nothing */
	if (!pdx_flow_sglang_pool(c, PDX_POOL_DECODE) && !d->peer[0])
		d = NULL;
	pdx_transfers_start(&c->px->xfers, c->xfer_id, p, d);
	c->prefill = NULL; /* the side leg's now */
	cbs.arg = c;
	if (!pdx_call_side(c, p, c->path, p_body, strlen(p_body), &cbs))
		pdx_flow_relay_decode(c, d_body, strlen(d_body));
	free(p_body);
	free(d_body);
}

static void prepare(struct pdx_call *c);

/* A leg of prepare() ended without what it asked for: a retry on other
 * instances, or the client gets why. */
static void prepare_failed(struct pdx_call *c, struct pdx_upstream *u,
			   int status, int err_status, const char *why,
			   const char *ask, const char *want)
{
	struct pdx_inst *p = c->inst;
	char msg[PDX_POOL_ADDR_MAX + 256];

	pdx_call_leg_done(c);
	if (status != 200 && pdx_flow_retry(c, u, status, why))
		return;
	if (!status) {
		pdx_call_reply_leg_error(c, err_status, why);
		return;
	}
	snprintf(msg, sizeof(msg),
		 "prefill instance %s: %s answered %d without %s", p->url, ask,
		 status, want);
	log_warn("%s: %s", c->req_id, msg);
	pdx_call_reply_error(c, 502, "upstream_error", msg);
}

static json_t *body_json(int status, struct evbuffer *body)
{
	if (status != 200)
		return NULL;
	return json_loadb((const char *)evbuffer_pullup(body, -1),
			  evbuffer_get_length(body), 0, NULL);
}

/* P's GET /get_server_info answered: SGLang's server lists its
 * server_args there, disaggregation_bootstrap_port among them. */
static void info_end(struct pdx_upstream *u, int status, struct evbuffer *body,
		     int err_status, const char *why, void *arg)
{
	struct pdx_call *c = arg;
	struct pdx_inst *p = c->inst;
	json_t *j = body_json(status, body);
	json_int_t port = json_integer_value(
	    json_object_get(j, "disaggregation_bootstrap_port"));

	json_decref(j);
	if (port <= 0 || port > 65535) {
		prepare_failed(c, u, status, err_status, why,
			       "GET /get_server_info",
			       "a disaggregation_bootstrap_port");
		return;
	}
	p->bootstrap_port = (uint16_t)port;
	log_info("%s: prefill instance %s: bootstrap port %u", c->req_id,
		 p->url, p->bootstrap_port);
	pdx_call_leg_done(c);
	prepare(c);
}

/* An SGLang P of more than one rank (attention TP, DP attention or
 * pipeline stages) cannot feed a pdx-engine D, which receives from rank
 * 0's agent alone: refused with why, as boot_ready() refuses the other
 * way (asked again next time: the instance may be restarted as one
 * rank). false: replied. */
static bool one_rank(struct pdx_call *c, struct pdx_inst *p, json_t *reg)
{
	static const char *const sizes[] = {"attn_tp_size", "dp_size",
					    "pp_size"};
	char msg[PDX_POOL_ADDR_MAX + 192];

	for (size_t k = 0; k < sizeof(sizes) / sizeof(*sizes); k++) {
		json_int_t n =
		    json_integer_value(json_object_get(reg, sizes[k]));

		if (n <= 1)
			continue;
		snprintf(msg, sizeof(msg),
			 "prefill instance %s: SGLang %s %lld; a pdx-engine "
			 "decode instance receives from one prefill rank",
			 p->url, sizes[k], (long long)n);
		log_warn("%s: %s", c->req_id, msg);
		pdx_call_leg_done(c);
		pdx_call_reply_error(c, 502, "upstream_error", msg);
		return false;
	}
	return true;
}

/* P's bootstrap server named rank 0's registration: pdx.sglang's has the
 * rank's agent (peer_addr), which a pdx-engine D receives from. Not
 * there (503: not every rank registered yet; another backend's) is asked
 * again next time. */
static void route_end(struct pdx_upstream *u, int status, struct evbuffer *body,
		      int err_status, const char *why, void *arg)
{
	struct pdx_call *c = arg;
	struct pdx_inst *p = c->inst;
	json_t *j = body_json(status, body);
	const char *peer = json_string_value(json_object_get(j, "peer_addr"));

	if (!peer || !*peer || strlen(peer) >= sizeof(p->peer)) {
		json_decref(j);
		prepare_failed(c, u, status, err_status, why,
			       "its bootstrap server's GET /route of rank 0",
			       "a peer_addr (pdx.sglang's)");
		return;
	}
	if (!one_rank(c, p, j)) {
		json_decref(j);
		return;
	}
	strcpy(p->peer, peer);
	p->tp = 1; /* rank 0's transfer; see docs/sglang.md */
	p->peer_known = true;
	json_decref(j);
	log_info("%s: prefill instance %s: rank 0's agent %s", c->req_id,
		 p->url, p->peer);
	pdx_call_leg_done(c);
	prepare(c);
}

/* Learns, once per instance, what the call needs: an SGLang P's bootstrap
 * port, and for a pdx-engine D its agent and P's rank 0's, for a
 * pdx-engine P its agent; then dispatches. */
static void prepare(struct pdx_call *c)
{
	static const struct pdx_upstream_cbs info = {.on_end = info_end};
	static const struct pdx_upstream_cbs route = {.on_end = route_end};
	struct pdx_upstream_cbs cbs;
	struct pdx_inst *p = c->prefill;

	if (pdx_flow_sglang_pool(c, PDX_POOL_PREFILL) && !p->bootstrap_port) {
		cbs = info;
		cbs.arg = c;
		pdx_pool_hold(p);
		pdx_call_leg(c, p, PDX_POOL_PREFILL, "/get_server_info", NULL,
			     0, &cbs);
	} else if (pdx_flow_sglang_pool(c, PDX_POOL_PREFILL) &&
		   !pdx_flow_sglang_pool(c, PDX_POOL_DECODE) &&
		   !p->peer_known) {
		cbs = route;
		cbs.arg = c;
		pdx_pool_hold(p);
		pdx_call_get_at(c, p, p->bootstrap_port,
				"/route?prefill_dp_rank=0&target_tp_rank=0&"
				"target_pp_rank=0",
				&cbs);
	} else if (!pdx_flow_sglang_pool(c, PDX_POOL_PREFILL) ||
		   !pdx_flow_sglang_pool(c, PDX_POOL_DECODE)) {
		pdx_flow_learn_peers(c, dispatch); /* the pdx side's agent */
	} else {
		dispatch(c);
	}
}

void pdx_flow_sglang(struct pdx_call *c)
{
	if (pdx_flow_pick(c))
		return;
	if (!c->prefill) {
		pdx_flow_send_decode(c, NULL);
		return;
	}
	prepare(c);
}
