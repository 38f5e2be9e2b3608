/* The proxy's HTTP server: binding, routing, and the small routes
 * (/health, /ready, /metrics, /v1/models, /version); completions go to
 * the flow, /admin/... to admin.c. */
#define PDX_LOG_TOPIC "server"
#include <errno.h>
#include <event2/buffer.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/http_error.h"
#include "common/http_listen.h"
#include "common/http_route.h"
#include "common/log.h"
#include "common/oai_params.h"
#include "proxy/call.h"
#include "proxy/cors.h"
#include "proxy/flow.h"
#include "proxy/proxy.h"

#define HTTP_MAX_HEADERS (64u << 10)
#define HTTP_CLIENT_TIMEOUT_S 600

static void reply_text(struct evhttp_request *req, int status,
		       const char *ctype, const char *body)
{
	struct evbuffer *b = evbuffer_new();

	if (!b) {
		evhttp_send_error(req, 500, "out of memory");
		return;
	}
	evbuffer_add(b, body, strlen(body));
	evhttp_add_header(evhttp_request_get_output_headers(req),
			  "Content-Type", ctype);
	evhttp_send_reply(req, status, NULL, b);
	evbuffer_free(b);
}

/* Ready: not draining, a usable decode instance, and a usable prefill
 * one unless requests are served without: an empty prefill pool (none
 * given, all removed by the admin API or DNS) runs decode-only, and
 * --on-prefill-failure local sends D a request no prefill instance
 * takes. Judged by the command line's prefill instances, /ready
 * answered 503 while every request got 200, and a readiness probe took
 * a serving proxy out of rotation. */
static void get_ready(struct pdx_proxy *px, struct evhttp_request *req)
{
	const struct pdx_pool *p = &px->pool[PDX_POOL_PREFILL];
	bool ready =
	    !px->draining &&
	    pdx_pool_has_usable(&px->pool[PDX_POOL_DECODE], NULL, NULL, true) &&
	    (!p->n || px->o->prefill_fallback ||
	     pdx_pool_has_usable(p, NULL, NULL, true));

	reply_text(req, ready ? 200 : 503, "application/json",
		   ready	   ? "{\"status\":\"ready\"}"
		   : px->draining ? "{\"status\":\"draining\"}"
				  : "{\"status\":\"not ready\"}");
}

static void get_metrics(struct pdx_proxy *px, struct evhttp_request *req)
{
	struct evbuffer *b = evbuffer_new();

	if (!b || pdx_proxy_metrics_render(px, b)) {
		if (b)
			evbuffer_free(b);
		evhttp_send_error(req, 500, "out of memory");
		return;
	}
	evhttp_add_header(evhttp_request_get_output_headers(req),
			  "Content-Type", "text/plain; version=0.0.4");
	evhttp_send_reply(req, 200, NULL, b);
	evbuffer_free(b);
}

/* Ends c with status and the JSON text s (NULL: out of memory), which
 * it frees. */
static void reply_json(struct pdx_call *c, int status, char *s)
{
	struct evbuffer *b = s ? evbuffer_new() : NULL;

	if (!b) {
		free(s);
		pdx_call_reply_error(c, 500, "internal_error", "out of memory");
		return;
	}
	evbuffer_add(b, s, strlen(s));
	free(s);
	pdx_call_reply(c, status, b);
	evbuffer_free(b);
}

/* A body vLLM would refuse (common/oai_params.h) is refused here, before
 * any engine is asked for work: 400 naming the parameter. */
static void refuse_params(struct pdx_call *c, const struct pdx_oai_fault *f)
{
	reply_json(c, 400, pdx_http_error_body(400, "invalid_request_error",
					       f->param, f->message));
}

static void post_generate(struct pdx_proxy *px, struct evhttp_request *req,
			  const char *path)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(req);
	struct pdx_call *c = pdx_call_new(px, req);
	struct pdx_oai_fault f;

	if (!c)
		return;
	snprintf(c->path, sizeof(c->path), "%s", path);
	c->body = pdx_oai_body_load((const char *)evbuffer_pullup(in, -1),
				    evbuffer_get_length(in), &f);
	if (!c->body) {
		refuse_params(c, &f);
		return;
	}
	if (pdx_oai_params_check(c->body, !strcmp(path, "/v1/chat/completions"),
				 &f) ||
	    pdx_flow_check_client_kv(c->body, &f)) {
		refuse_params(c, &f);
		return;
	}
	pdx_flow_start(c);
}

/* The decode pool's healthy instances' models as one list, each model
 * once (a pool may hold several models: pdx_pool_pick routes by model),
 * once every one of them has said its own; else one decode instance's
 * answer, relayed, as the best the proxy can give (an engine without
 * the route, or asked too recently). */
static json_t *decode_models(struct pdx_proxy *px)
{
	const struct pdx_pool *d = &px->pool[PDX_POOL_DECODE];
	json_t *list = json_array();
	unsigned merged = 0;

	for (unsigned k = 0; list && k < d->n; k++) {
		if (d->inst[k]->unhealthy)
			continue;
		if (!pdx_served_models_merge(&d->inst[k]->models, list)) {
			json_decref(list);
			return NULL;
		}
		merged++;
	}
	if (!merged) {
		json_decref(list);
		return NULL;
	}
	return json_pack("{s:s, s:o}", "object", "list", "data", list);
}

static void get_models(struct pdx_proxy *px, struct evhttp_request *req)
{
	struct pdx_call *c = pdx_call_new(px, req);
	json_t *models;

	if (!c)
		return;
	models = decode_models(px);
	if (!models) {
		pdx_call_relay(c, NULL, PDX_POOL_DECODE, EVHTTP_REQ_GET,
			       "/v1/models", NULL, 0);
		return;
	}
	reply_json(c, 200, json_dumps(models, JSON_COMPACT));
	json_decref(models);
}

/* The methods path's route takes (its Allow); NULL: no route. */
static const char *route_allow(const char *path)
{
	if (!strcmp(path, "/v1/completions") ||
	    !strcmp(path, "/v1/chat/completions") ||
	    !strcmp(path, "/v1/metaserver"))
		return "POST";
	if (!strncmp(path, "/admin/", 7))
		return "GET, POST, DELETE";
	if (!strcmp(path, "/health") || !strcmp(path, "/ready") ||
	    !strcmp(path, "/metrics") || !strcmp(path, "/v1/models") ||
	    !strcmp(path, "/version"))
		return "GET";
	return NULL;
}

static void route(struct evhttp_request *req, void *arg)
{
	struct pdx_proxy *px = arg;
	char buf[PDX_HTTP_PATH_MAX];
	const char *path = pdx_http_route_path(req, buf, sizeof(buf));
	enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
	bool get = cmd == EVHTTP_REQ_GET, post = cmd == EVHTTP_REQ_POST;
	const char *allow;

	allow = route_allow(path);
	/* first: the 413 below is an answer a page must read too */
	if (pdx_cors_handle(px->o->allowed_origins, req, allow))
		return;
	if (pdx_http_body_refused(req, px->o->max_body)) {
		pdx_proxy_metrics_request(&px->metrics, 413, 0);
		return;
	}
	if (!strcmp(path, "/v1/completions") ||
	    !strcmp(path, "/v1/chat/completions")) {
		if (post)
			post_generate(px, req, path);
		else
			goto bad_method;
	} else if (!strcmp(path, "/v1/metaserver")) {
		if (post)
			pdx_flow_metaserver(px, req);
		else
			goto bad_method;
	} else if (!strcmp(path, "/health")) {
		if (get)
			reply_text(req, 200, "application/json",
				   "{\"status\":\"ok\"}");
		else
			goto bad_method;
	} else if (!strcmp(path, "/ready")) {
		if (get)
			get_ready(px, req);
		else
			goto bad_method;
	} else if (!strcmp(path, "/metrics")) {
		if (get)
			get_metrics(px, req);
		else
			goto bad_method;
	} else if (!strcmp(path, "/v1/models")) {
		if (get)
			get_models(px, req);
		else
			goto bad_method;
	} else if (!strcmp(path, "/version")) {
		if (get)
			pdx_http_send_version(req);
		else
			goto bad_method;
	} else if (!strncmp(path, "/admin/", 7)) {
		pdx_admin_handle(px, req, path);
	} else {
		pdx_http_send_404(req);
	}
	return;
bad_method:
	pdx_http_send_405(req, allow);
}

int pdx_proxy_listen(struct pdx_proxy *px, char *err, size_t errlen)
{
	struct evhttp_bound_socket *bs;

	px->http = evhttp_new(px->base);
	if (!px->http) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	pdx_http_body_limit(px->http, px->o->max_body);
	evhttp_set_max_headers_size(px->http, HTTP_MAX_HEADERS);
	evhttp_set_timeout(px->http, HTTP_CLIENT_TIMEOUT_S);
	/* every method reaches route(): a 405 with Allow, not evhttp's 501 */
	evhttp_set_allowed_methods(px->http, 0xffff);
	evhttp_set_gencb(px->http, route, px);
	bs = pdx_http_bind(px->http, px->o->host, px->o->port, "--port", err,
			   errlen);
	if (!bs) {
		evhttp_free(px->http);
		px->http = NULL;
		return -1;
	}
	pdx_http_listen_tune(bs);
	px->port = pdx_http_bound_port(bs);
	/* at once: the proxy has nothing to wait for (its instances may
	 * come later; /ready says when it can serve) */
	return pdx_http_listen_start(bs, "--port", err, errlen);
}

void pdx_proxy_shut(struct pdx_proxy *px, const char *why)
{
	px->draining = true;
	if (!px->ncalls) /* else the last call's free ends the loop */
		event_base_loopexit(px->base, NULL);
	while (!LIST_EMPTY(&px->calls))
		pdx_call_shut(LIST_FIRST(&px->calls), why);
}

void pdx_proxy_close(struct pdx_proxy *px)
{
	while (!LIST_EMPTY(&px->calls))
		pdx_call_abort(LIST_FIRST(&px->calls));
	if (px->http)
		evhttp_free(px->http);
	px->http = NULL;
}
