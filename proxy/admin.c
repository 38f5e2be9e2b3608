/* The admin API: list, add and remove engine instances at run time.
 *   GET    /admin/instances                  the pools
 *   POST   /admin/instances {"role": "prefill"|"decode", "url": "http://h:p"}
 *   DELETE /admin/instances?url=http://h:p[&role=prefill|decode]
 * Every call needs "Authorization: Bearer TOKEN" (--admin-token): 401
 * without it; 403 for all when no token was configured. */
#define PDX_LOG_TOPIC "admin"
#include <event2/buffer.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proxy/proxy.h"

/* Compares in time independent of where the strings differ. */
static bool token_equal(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	unsigned char d = la != lb;

	for (size_t i = 0; i < la; i++)
		d |= (unsigned char)a[i] ^ (unsigned char)b[i % (lb ? lb : 1)];
	return d == 0;
}

static bool authorized(struct pdx_proxy *px, struct evhttp_request *req)
{
	const char *h = evhttp_find_header(
	    evhttp_request_get_input_headers(req), "Authorization");

	if (!px->o->admin_token) {
		pdx_http_send_error(req, 403, "permission_denied",
				     "the admin API is off: start pdx-proxy "
				     "with --admin-token");
		return false;
	}
	if (!h || strncmp(h, "Bearer ", 7) ||
	    !token_equal(h + 7, px->o->admin_token)) {
		evhttp_add_header(evhttp_request_get_output_headers(req),
				  "WWW-Authenticate", "Bearer");
		pdx_http_send_error(req, 401, "authentication_error",
				     "missing or wrong bearer token");
		return false;
	}
	return true;
}

/* The instance's TP size once GET /v1/pdx/info told it (its agents'
 * transfers count until every rank reported them), else null. */
static json_t *tp_known(const struct pdx_inst *i)
{
	return i->peer_known && i->peer[0] ? json_integer(i->tp ? i->tp : 1)
					   : json_null();
}

/* The models the instance serves once GET /v1/models told them (an
 * array), null while unknown or when it takes any. */
static json_t *models_known(const struct pdx_inst *i)
{
	json_t *a;

	if (!i->models.known || i->models.any || !(a = json_array()))
		return json_null();
	for (unsigned k = 0; k < i->models.n; k++)
		json_array_append_new(a, json_string(i->models.name[k]));
	return a;
}

static void list(struct pdx_proxy *px, struct evhttp_request *req)
{
	json_t *arr = json_array();

	for (int r = 0; r < 2 && arr; r++) {
		const struct pdx_pool *p = &px->pool[r];

		for (unsigned i = 0; i < p->n; i++)
			json_array_append_new(
			    arr,
			    json_pack("{s:s, s:s, s:o, s:o, s:i, s:i, s:I, s:I, "
				      "s:b, s:b, s:s}",
				      "role", pdx_pool_role_name(p->role),
				      "url", p->inst[i]->url, "tp",
				      tp_known(p->inst[i]), "models",
				      models_known(p->inst[i]), "inflight",
				      (int)p->inst[i]->inflight, "transfers",
				      (int)p->inst[i]->xfers, "requests",
				      (json_int_t)p->inst[i]->requests,
				      "failures",
				      (json_int_t)p->inst[i]->failures,
				      "healthy", !p->inst[i]->unhealthy,
				      "misplaced", p->inst[i]->misplaced,
				      "breaker",
				      pdx_breaker_state_name(
					  p->inst[i]->breaker.state)));
	}
	pdx_http_send_json(req, 200,
		   json_pack("{s:o, s:s, s:s}", "instances", arr, "policy_p",
			     pdx_pool_policy_name(px->pool[0].policy),
			     "policy_d",
			     pdx_pool_policy_name(px->pool[1].policy)));
}

static int role_parse(const char *s, enum pdx_pool_role *r)
{
	if (s && !strcmp(s, "prefill"))
		*r = PDX_POOL_PREFILL;
	else if (s && !strcmp(s, "decode"))
		*r = PDX_POOL_DECODE;
	else
		return -1;
	return 0;
}

static void add(struct pdx_proxy *px, struct evhttp_request *req)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(req);
	json_t *j = json_loadb((const char *)evbuffer_pullup(in, -1),
			       evbuffer_get_length(in), 0, NULL);
	const char *role = json_string_value(json_object_get(j, "role"));
	const char *url = json_string_value(json_object_get(j, "url"));
	enum pdx_pool_role r, other;
	char err[192];

	if (!url || role_parse(role, &r)) {
		pdx_http_send_error(req, 400, "invalid_request_error",
				     "want {\"role\": \"prefill\"|\"decode\", "
				     "\"url\": \"http://host:port\"}");
		goto out;
	}
	/* as the command line refuses it: each request's pair would share
	 * one engine */
	other = r == PDX_POOL_PREFILL ? PDX_POOL_DECODE : PDX_POOL_PREFILL;
	if (pdx_pool_has(&px->pool[other], url)) {
		snprintf(err, sizeof(err), "%s is in the %s pool: an engine is "
			 "one or the other", url, pdx_pool_role_name(other));
		pdx_http_send_error(req, 409, "invalid_request_error", err);
		goto out;
	}
	if (pdx_pool_add(&px->pool[r], url, err, sizeof(err))) {
		pdx_http_send_error(req, strstr(err, "already") ? 409 : 400,
				     "invalid_request_error", err);
		goto out;
	}
	log_info("added %s instance %s", role,
		 px->pool[r].inst[px->pool[r].n - 1]->url);
	pdx_http_send_json(req, 201,
		   json_pack("{s:s, s:s}", "role", role, "url",
			     px->pool[r].inst[px->pool[r].n - 1]->url));
out:
	json_decref(j);
}

static void del(struct pdx_proxy *px, struct evhttp_request *req)
{
	const char *q =
	    evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
	struct evkeyvalq args;
	const char *url, *role;
	enum pdx_pool_role r;
	int removed = 0;

	TAILQ_INIT(&args);
	if (!q || evhttp_parse_query_str(q, &args) ||
	    !(url = evhttp_find_header(&args, "url"))) {
		pdx_http_send_error(req, 400, "invalid_request_error",
				     "want ?url=http://host:port");
		goto out;
	}
	role = evhttp_find_header(&args, "role");
	if (role && role_parse(role, &r)) {
		pdx_http_send_error(req, 400, "invalid_request_error",
				     "role: prefill or decode");
		goto out;
	}
	for (int i = 0; i < 2; i++)
		if ((!role || (int)r == i) &&
		    !pdx_pool_remove(&px->pool[i], url))
			removed++;
	if (!removed) {
		pdx_http_send_error(req, 404, "not_found_error", "no such instance");
		goto out;
	}
	log_info("removed instance %s", url);
	pdx_http_send_json(req, 200,
		   json_pack("{s:s, s:i}", "url", url, "removed", removed));
out:
	evhttp_clear_headers(&args);
}

void pdx_admin_handle(struct pdx_proxy *px, struct evhttp_request *req,
		      const char *path)
{
	if (!authorized(px, req))
		return;
	if (strcmp(path, "/admin/instances")) {
		pdx_http_send_error(req, 404, "not_found_error", "no such route");
		return;
	}
	switch (evhttp_request_get_command(req)) {
	case EVHTTP_REQ_GET:
		list(px, req);
		break;
	case EVHTTP_REQ_POST:
		add(px, req);
		break;
	case EVHTTP_REQ_DELETE:
		del(px, req);
		break;
	default:
		pdx_http_send_405(req, "GET, POST, DELETE");
	}
}
