/* Error replies and body limits of pdx's HTTP servers (see http_error.h). */
#include "common/http_error.h"

#include <sys/queue.h> /* TAILQ_FOREACH, before libevent's own TAILQ */

#include <event2/buffer.h>
#include <event2/http_struct.h>
#include <event2/keyvalq_struct.h>
#include <event2/util.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/http_expect.h"
#include "common/utf8.h"

json_t *pdx_http_error_obj(int status, const char *type, const char *param,
			   const char *msg)
{
	char clean[512];

	/* param "" is null too */
	return json_pack("{s:{s:s, s:s, s:s?, s:i}}", "error", "message",
			 pdx_utf8_clean(msg, clean, sizeof(clean)), "type",
			 type, "param", param && *param ? param : NULL, "code",
			 status);
}

char *pdx_http_error_body(int status, const char *type, const char *param,
			  const char *msg)
{
	json_t *o = pdx_http_error_obj(status, type, param, msg);
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

	json_decref(o);
	return s;
}

void pdx_http_send_json(struct evhttp_request *req, int status, json_t *j)
{
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	struct evbuffer *b = evbuffer_new();

	json_decref(j);
	if (!s || !b) {
		free(s);
		if (b)
			evbuffer_free(b);
		evhttp_send_error(req, 500, "out of memory");
		return;
	}
	evbuffer_add(b, s, strlen(s));
	free(s);
	evhttp_add_header(evhttp_request_get_output_headers(req),
			  "Content-Type", "application/json");
	/* no content in an answer to HEAD (RFC 9110): libevent leaves out
	 * its Content-Length but sent the body, which a client read as the
	 * start of its next answer */
	evhttp_send_reply(req, status, NULL,
			  evhttp_request_get_command(req) == EVHTTP_REQ_HEAD
			      ? NULL
			      : b);
	evbuffer_free(b);
}

/* The request's version: libevent 2.1 says it only in its struct */
static bool http_1_0(const struct evhttp_request *req)
{
	return req->major == 1 && req->minor == 0;
}

void pdx_http_reply_start(struct evhttp_request *req, int status,
			  const char *reason)
{
	/* an HTTP/1.0 body of unknown length ends where the connection
	 * does: its keep-alive dropped, libevent closes it after the reply */
	if (evhttp_request_get_command(req) != EVHTTP_REQ_HEAD &&
	    !evhttp_find_header(evhttp_request_get_output_headers(req),
				"Content-Length") &&
	    http_1_0(req))
		while (evhttp_remove_header(
			   evhttp_request_get_input_headers(req),
			   "Connection") == 0)
			; /* each of them */
	evhttp_send_reply_start(req, status, reason);
}

void pdx_http_send_error(struct evhttp_request *req, int status,
			 const char *type, const char *msg)
{
	pdx_http_send_json(req, status,
			   pdx_http_error_obj(status, type, NULL, msg));
}

void pdx_http_send_405(struct evhttp_request *req, const char *allow)
{
	char msg[96];

	snprintf(msg, sizeof(msg),
		 "method not allowed on this route; it takes %s", allow);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Allow",
			  allow);
	pdx_http_send_error(req, 405, "invalid_request_error", msg);
}

void pdx_http_send_404(struct evhttp_request *req)
{
	const char *uri = evhttp_request_get_uri(req);
	size_t n = uri ? strcspn(uri, "?") : 0;
	char msg[128];

	snprintf(msg, sizeof(msg), "no route %.*s", (int)(n < 100 ? n : 100),
		 uri ? uri : "");
	pdx_http_send_error(req, 404, "not_found_error", msg);
}

void pdx_http_body_limit(struct evhttp *http, size_t max_body)
{
	evhttp_set_max_body_size(http, (ev_ssize_t)(2 * (ev_uint64_t)max_body));
	evhttp_set_flags(http, EVHTTP_SERVER_LINGERING_CLOSE);
	pdx_http_expect_watch(http, max_body);
}

/* Two Content-Length headers that differ: which one framed the body is
 * the server's guess (libevent took the first), and a proxy in front
 * that took the other reads another request in the same bytes (request
 * smuggling; RFC 9112 says refuse it). */
static bool lengths_differ(struct evhttp_request *req)
{
	const struct evkeyvalq *h = evhttp_request_get_input_headers(req);
	const struct evkeyval *kv;
	const char *first = NULL;

	TAILQ_FOREACH(kv, h, next) {
		if (evutil_ascii_strcasecmp(kv->key, "Content-Length"))
			continue;
		if (first && strcmp(first, kv->value))
			return true;
		first = kv->value;
	}
	return false;
}

bool pdx_http_body_refused(struct evhttp_request *req, size_t max_body)
{
	size_t len = evbuffer_get_length(evhttp_request_get_input_buffer(req));
	uint64_t declared;
	char msg[128];

	if (pdx_http_expect_refused(req, &declared)) {
		/* its body never comes: nothing to read after the answer */
		evhttp_add_header(evhttp_request_get_output_headers(req),
				  "Connection", "close");
		snprintf(msg, sizeof(msg),
			 "the request body would be %llu bytes, over the limit "
			 "of %zu",
			 (unsigned long long)declared, max_body);
		pdx_http_send_error(req, 413, "invalid_request_error", msg);
		return true;
	}
	if (lengths_differ(req)) {
		pdx_http_send_error(req, 400, "invalid_request_error",
				    "two Content-Length headers that differ");
		return true;
	}
	if (len <= max_body)
		return false;
	snprintf(msg, sizeof(msg),
		 "the request body is %zu bytes, over the limit of %zu", len,
		 max_body);
	pdx_http_send_error(req, 413, "invalid_request_error", msg);
	return true;
}
