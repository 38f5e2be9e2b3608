/* The evhttp server: binding, routing, and the routes that only
 * read state (/v1/models, /health, /live, /metrics, /v1/pdx/info,
 * /version). */
#define PDX_LOG_TOPIC "http"
#include "engine/http_internal.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errbuf.h"
#include "common/http_error.h"
#include "common/http_listen.h"
#include "common/http_route.h"
#include "common/log.h"
#include "common/mix64.h"
#include "engine/openai.h"

/* An idle or silent connection is closed after this long. */
#define HTTP_TIMEOUT_S 600
#define HTTP_MAX_HEADERS (64u << 10)

static void reply(struct evhttp_request *req, int status, const char *ctype,
		  struct evbuffer *body)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);

	evhttp_add_header(h, "Content-Type", ctype);
	evhttp_send_reply(req, status, NULL, body);
}

static void reply_json(struct evhttp_request *req, int status, char *json)
{
	struct evbuffer *b = evbuffer_new();

	if (!b || !json) {
		evhttp_send_error(req, 500, "out of memory");
	} else {
		evbuffer_add(b, json, strlen(json));
		reply(req, status, "application/json", b);
	}
	evbuffer_free(b);
	free(json);
}

static void get_models(struct pdx_http_api *api, struct evhttp_request *req)
{
	json_t *o =
	    json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:I}]}", "object", "list",
		      "data", "id", api->p.model->name, "object", "model",
		      "created", (json_int_t)api->started, "owned_by", "pdx",
		      "max_model_len", (json_int_t)api->p.max_model_len);

	reply_json(req, 200, o ? json_dumps(o, JSON_COMPACT) : NULL);
	json_decref(o);
}

static void get_metrics(struct pdx_http_api *api, struct evhttp_request *req)
{
	struct pdx_metrics_gauges g = {.model = api->p.model->name};
	struct evbuffer *b = evbuffer_new();
	struct pdx_sched_stats ss;
	struct pdx_block_stats bs;

	pdx_sched_stats(api->p.sched, &ss);
	pdx_block_alloc_stats(pdx_kv_pool_blocks(api->p.pool), &bs);
	g.running = ss.running;
	g.waiting = ss.waiting;
	g.kv_total = bs.total;
	g.kv_free = pdx_kv_pool_free_blocks(api->p.pool);
	if (pdx_kv_pool_cache(api->p.pool)) {
		const struct pdx_kv_layout *lay =
		    pdx_kv_pool_layout(api->p.pool);
		struct pdx_prefix_cache_stats cs;

		pdx_prefix_cache_stats(pdx_kv_pool_cache(api->p.pool), &cs);
		g.prefix_blocks = cs.cached;
		g.prefix_query_tokens = cs.query_tokens;
		g.prefix_hit_tokens = cs.hit_tokens;
		/* hits are whole blocks */
		g.prefix_hit_bytes = cs.hit_tokens / lay->block_tokens *
				     pdx_kv_layout_block_bytes_all(lay);
	}
	g.has_agent = api->p.link != NULL;
	g.agent_up = g.has_agent &&
		     pdx_kv_link_status(api->p.link, NULL, 0) == PDX_OK;
	if (!b || pdx_metrics_render(api->p.metrics, &g, b)) {
		evhttp_send_error(req, 500, "out of memory");
	} else {
		reply(req, 200, "text/plain; version=0.0.4; charset=utf-8", b);
	}
	evbuffer_free(b);
}

/* The engine's place in a disaggregated pair: what a proxy or a test
 * needs to pair it (docs/engine.md). */
static void get_info(struct pdx_http_api *api, struct evhttp_request *req)
{
	struct pdx_kv_link *l = api->p.link;
	json_t *o =
	    json_pack("{s:s, s:s, s:s?, s:s?}", "role", api->p.role, "model",
		      api->p.model->name, "agent", api->p.agent, "peer_addr",
		      l ? pdx_kv_link_peer(l) : NULL);

	struct pdx_kv_peers *own = l ? malloc(sizeof(*own)) : NULL;

	/* a TP instance: every rank's agent, rank order */
	if (own) {
		pdx_kv_link_peers(l, own);
		if (o && own->n > 1 &&
		    (json_object_set_new(o, "peer_addrs",
					 pdx_kv_peers_json(own)) ||
		     json_object_set_new(o, "tp_size", json_integer(own->n)))) {
			json_decref(o);
			o = NULL;
		}
		free(own);
	}
	reply_json(req, 200, o ? json_dumps(o, JSON_COMPACT) : NULL);
	json_decref(o);
}

/* X-PDX-Agent: where this engine's agents are now (/v1/pdx/info's
 * peer_addr, or its peer_addrs joined by commas): an agent started
 * again on another address is then seen by the proxy's next health
 * check, which asks /v1/pdx/info again instead of sending the other
 * side to the dead address (docs/proxy.md, "Health checks"). */
static void add_agent_header(const struct pdx_kv_link *l,
			     struct evhttp_request *req)
{
	struct pdx_kv_peers *own = malloc(sizeof(*own));
	char *v = malloc(PDX_KV_PEERS_JOIN_MAX);

	if (!own || !v)
		goto out;
	pdx_kv_link_peers(l, own);
	pdx_kv_peers_join(own, v, PDX_KV_PEERS_JOIN_MAX);
	if (v[0])
		evhttp_add_header(evhttp_request_get_output_headers(req),
				  "X-PDX-Agent", v);
out:
	free(v);
	free(own);
}

/* X-PDX-Engine-Id: this process's, drawn at its start. An engine
 * started again on the same port (with another --model or --role, and
 * quicker than two of a proxy's health checks) keeps its address and
 * its agent's: the proxy's next check sees this change, and asks what
 * it serves and what it is again (docs/proxy.md, "Health checks"). */
static void add_engine_id_header(const struct pdx_http_api *api,
				 struct evhttp_request *req)
{
	char v[17];

	snprintf(v, sizeof(v), "%016llx",
		 (unsigned long long)api->engine_id);
	evhttp_add_header(evhttp_request_get_output_headers(req),
			  "X-PDX-Engine-Id", v);
}

/* Ready to serve: with an agent, only while the agent is there (a
 * proxy's health checks then route around this engine). /live is the
 * process alone. */
static void get_health(struct pdx_http_api *api, struct evhttp_request *req)
{
	char why[PDX_REASON_MAX + 32];

	if (api->p.link &&
	    pdx_kv_link_status(api->p.link, why, sizeof(why)) != PDX_OK) {
		pdx_http_send_error(req, 503, "service_unavailable", why);
		return;
	}
	if (api->p.link)
		add_agent_header(api->p.link, req);
	add_engine_id_header(api, req);
	reply(req, 200, "text/plain", NULL);
}

/* The methods a known path takes (its Allow), NULL for an unknown one. */
static const char *route_allow(const char *path)
{
	static const char *const posts[] = {"/v1/completions",
					    "/v1/chat/completions"};
	static const char *const gets[] = {"/v1/models", "/health", "/live",
					   "/v1/pdx/info", "/metrics",
					   "/version"};

	for (size_t i = 0; i < sizeof(posts) / sizeof(*posts); i++)
		if (!strcmp(path, posts[i]))
			return "POST";
	for (size_t i = 0; i < sizeof(gets) / sizeof(*gets); i++)
		if (!strcmp(path, gets[i]))
			return "GET";
	return NULL;
}

static void route(struct evhttp_request *req, void *arg)
{
	struct pdx_http_api *api = arg;
	char buf[PDX_HTTP_PATH_MAX];
	const char *path = pdx_http_route_path(req, buf, sizeof(buf));
	enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
	bool post = cmd == EVHTTP_REQ_POST, get = cmd == EVHTTP_REQ_GET;
	const char *allow;

	if (pdx_http_body_refused(req, PDX_HTTP_MAX_BODY + PDX_HTTP_BODY_HEADROOM))
		api->p.metrics->req_rejected++;
	else if (post && strcmp(path, "/v1/completions") == 0)
		pdx__gen_handle(api, req, false);
	else if (post && strcmp(path, "/v1/chat/completions") == 0)
		pdx__gen_handle(api, req, true);
	else if (get && strcmp(path, "/v1/models") == 0)
		get_models(api, req);
	else if (get && strcmp(path, "/health") == 0)
		get_health(api, req);
	else if (get && strcmp(path, "/live") == 0)
		reply(req, 200, "text/plain", NULL);
	else if (get && strcmp(path, "/v1/pdx/info") == 0)
		get_info(api, req);
	else if (get && strcmp(path, "/metrics") == 0)
		get_metrics(api, req);
	else if (get && strcmp(path, "/version") == 0)
		pdx_http_send_version(req);
	else if ((allow = route_allow(path))) {
		api->p.metrics->req_rejected++;
		pdx_http_send_405(req, allow);
	} else {
		api->p.metrics->req_rejected++;
		pdx_http_send_404(req);
	}
}

pdx_status_t pdx_http_api_new(const struct pdx_http_api_params *p,
			      struct pdx_http_api **out, char *err,
			      size_t errlen)
{
	struct evhttp_bound_socket *bs;
	struct pdx_http_api *api;

	api = calloc(1, sizeof(*api));
	if (!api)
		return PDX_ENOMEM;
	api->p = *p;
	api->started = (long long)time(NULL);
	api->id_seed = pdx_now_ns() ^ ((uint64_t)getpid() << 32);
	if (getrandom(&api->engine_id, sizeof(api->engine_id), 0) !=
	    sizeof(api->engine_id))
		api->engine_id = pdx_mix64(api->id_seed + 1);
	LIST_INIT(&api->calls);
	LIST_INIT(&api->kvs);
	api->http = evhttp_new(p->base);
	if (!api->http) {
		free(api);
		return PDX_ENOMEM;
	}
	pdx_http_body_limit(api->http,
			    PDX_HTTP_MAX_BODY + PDX_HTTP_BODY_HEADROOM);
	evhttp_set_max_headers_size(api->http, HTTP_MAX_HEADERS);
	evhttp_set_timeout(api->http, HTTP_TIMEOUT_S);
	/* every method reaches route(): a 405 with Allow, not evhttp's 501 */
	evhttp_set_allowed_methods(api->http, 0xffff);
	evhttp_set_gencb(api->http, route, api);
	bs = pdx_http_bind(api->http, p->host, p->port, "--port", err,
			   errlen);
	if (!bs) {
		evhttp_free(api->http);
		free(api);
		return PDX_EIO;
	}
	pdx_http_listen_tune(bs);
	api->bound = bs;
	api->port = pdx_http_bound_port(bs);
	*out = api;
	return PDX_OK;
}

pdx_status_t pdx_http_api_serve(struct pdx_http_api *api, char *err,
				size_t errlen)
{
	return pdx_http_listen_start(api->bound, "--port", err, errlen)
		   ? PDX_EIO
		   : PDX_OK;
}

uint16_t pdx_http_api_port(const struct pdx_http_api *api)
{
	return api->port;
}

void pdx_http_api_set_link(struct pdx_http_api *api, struct pdx_kv_link *link)
{
	api->p.link = link;
	if (link)
		pdx_kv_link_on_held(link, pdx__kv_held_event, api);
}

void pdx_http_api_free(struct pdx_http_api *api)
{
	if (!api)
		return;
	pdx__gen_abort_all(api);
	evhttp_free(api->http);
	free(api);
}
