/* The bootstrap server for a pdx-engine prefill instance (see
 * sglang_boot.h). */
#define PDX_LOG_TOPIC "sglang"
#include "proxy/sglang_boot.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/http_error.h"
#include "common/http_listen.h"
#include "common/log.h"
#include "proxy/proxy.h"

static void reply(struct evhttp_request *req, int code, const char *type,
		  const char *body)
{
	struct evbuffer *b = evbuffer_new();

	if (b)
		evbuffer_add(b, body, strlen(body));
	evhttp_add_header(evhttp_request_get_output_headers(req),
			  "Content-Type", type);
	evhttp_send_reply(req, code, NULL, b);
	if (b)
		evbuffer_free(b);
}

/* The rank a GET /route asks for: 0 (rank 0), 1 (the sizes), -1 (a
 * rank this server does not have, or a malformed ask). */
static int route_rank(const char *query)
{
	static const char *const keys[] = {"prefill_dp_rank", "target_tp_rank",
					   "target_pp_rank"};
	struct evkeyvalq q;
	int zeros = 0, all = 0;

	if (!query || evhttp_parse_query_str(query, &q))
		return -1;
	for (size_t k = 0; k < sizeof(keys) / sizeof(*keys); k++) {
		const char *v = evhttp_find_header(&q, keys[k]);

		zeros += v && !strcmp(v, "0");
		all += v && !strcmp(v, "-1");
	}
	evhttp_clear_headers(&q);
	return zeros == 3 ? 0 : all == 3 ? 1 : -1;
}

static void on_request(struct evhttp_request *req, void *arg)
{
	struct pdx_inst *p = arg;
	const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
	const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
	int rank;

	if (evhttp_request_get_command(req) != EVHTTP_REQ_GET || !path) {
		pdx_http_send_405(req, "GET");
		return;
	}
	if (!strcmp(path, "/health")) {
		reply(req, 200, "text/plain", "OK");
		return;
	}
	if (strcmp(path, "/route")) {
		reply(req, 404, "text/plain", "no such route");
		return;
	}
	rank = route_rank(evhttp_uri_get_query(uri));
	if (rank < 0) {
		reply(req, 404, "text/plain",
		      "this prefill instance has rank 0 (dp, tp, pp) only");
		return;
	}
	if (!p->peer[0]) { /* its agent went unknown: not now */
		reply(req, 503, "text/plain", "prefill agent not known yet");
		return;
	}
	if (rank == 1)
		pdx_http_send_json(req, 200,
				   json_pack("{s:i, s:i, s:i, s:b}",
					     "attn_tp_size", 1, "pp_size", 1,
					     "dp_size", 1,
					     "follow_bootstrap_room", 1));
	else
		pdx_http_send_json(
		    req, 200,
		    json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:s, "
			      "s:n}",
			      "attn_tp_size", 1, "attn_tp_rank", 0, "pp_size",
			      1, "pp_rank", 0, "dp_size", 1, "dp_rank", 0,
			      "peer_addr", p->peer, "shape"));
}

const char *pdx_sglang_boot_host(const struct pdx_proxy *px)
{
	const char *h =
	    px->o->bootstrap_host ? px->o->bootstrap_host : px->o->host;

	if (!strcmp(h, "0.0.0.0") || !strcmp(h, "::") || !*h)
		return "127.0.0.1";
	return h;
}

int pdx_sglang_boot_open(struct pdx_proxy *px, struct pdx_inst *p, char *err,
			 size_t errlen)
{
	struct evhttp_bound_socket *bs;

	if (p->boot)
		return 0;
	p->boot = evhttp_new(px->base);
	if (!p->boot) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	evhttp_set_allowed_methods(p->boot, 0xffff);
	evhttp_set_gencb(p->boot, on_request, p);
	bs = evhttp_bind_socket_with_handle(p->boot, px->o->host, 0);
	p->bootstrap_port = bs ? pdx_http_bound_port(bs) : 0;
	if (!p->bootstrap_port) {
		snprintf(err, errlen,
			 "cannot listen on %s for prefill instance %s's "
			 "bootstrap server",
			 px->o->host, p->url);
		evhttp_free(p->boot);
		p->boot = NULL;
		return -1;
	}
	log_info("prefill instance %s: its bootstrap server at %s:%u (for "
		 "SGLang decode instances)",
		 p->url, pdx_sglang_boot_host(px), p->bootstrap_port);
	return 0;
}
