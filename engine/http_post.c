/* Fire-and-forget POSTs (see http_post.h). */
#define PDX_LOG_TOPIC "post"
#include "engine/http_post.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/nodelay.h"

struct pdx_http_post {
	struct evhttp_connection *conn; /* NULL once answered */
	struct evhttp_uri *uri;
	char url[256];
};

/* The answer, or the failure (req NULL or code 0). The connection is
 * left for pdx_http_post_free(): evhttp must not free it from inside its
 * own callback. */
static void on_done(struct evhttp_request *req, void *arg)
{
	struct pdx_http_post *p = arg;
	int code = req ? evhttp_request_get_response_code(req) : 0;

	if (code == 200)
		log_debug("%s: 200", p->url);
	else if (code)
		log_warn("%s answered %d", p->url, code);
	else
		log_warn("%s: no answer (unreachable or timed out)", p->url);
}

struct pdx_http_post *pdx_http_post_start(struct event_base *base,
					  const char *url, const char *body,
					  unsigned timeout_s, char *err,
					  size_t errlen)
{
	struct pdx_http_post *p = calloc(1, sizeof(*p));
	struct evhttp_request *req = NULL;
	const char *host, *path, *scheme;
	int port;

	if (!p)
		goto nomem;
	snprintf(p->url, sizeof(p->url), "%s", url);
	p->uri = evhttp_uri_parse(url);
	host = p->uri ? evhttp_uri_get_host(p->uri) : NULL;
	scheme = p->uri ? evhttp_uri_get_scheme(p->uri) : NULL;
	if (!host || !scheme || strcmp(scheme, "http")) {
		snprintf(err, errlen, "%s: want http://host[:port]/path", url);
		pdx_http_post_free(p);
		return NULL;
	}
	port = evhttp_uri_get_port(p->uri);
	path = evhttp_uri_get_path(p->uri);
	p->conn = evhttp_connection_base_new(base, NULL, host,
					     port > 0 ? port : 80);
	req = evhttp_request_new(on_done, p);
	if (!p->conn || !req)
		goto nomem;
	evhttp_connection_set_timeout(p->conn, (int)timeout_s);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Host",
			  host);
	evhttp_add_header(evhttp_request_get_output_headers(req),
			  "Content-Type", "application/json");
	if (evbuffer_add(evhttp_request_get_output_buffer(req), body,
			 strlen(body)) ||
	    evhttp_make_request(p->conn, req, EVHTTP_REQ_POST,
				path && *path ? path : "/"))
		goto nomem; /* make_request frees req on failure */
	pdx_evhttp_nodelay(p->conn);
	return p;
nomem:
	if (req && p && !p->conn)
		evhttp_request_free(req);
	snprintf(err, errlen, "out of memory");
	pdx_http_post_free(p);
	return NULL;
}

void pdx_http_post_free(struct pdx_http_post *p)
{
	if (!p)
		return;
	if (p->conn)
		evhttp_connection_free(p->conn);
	if (p->uri)
		evhttp_uri_free(p->uri);
	free(p);
}
