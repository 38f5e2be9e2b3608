/* CORS for pdx-proxy (cors.h). */
#include <ctype.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <string.h>

#include "common/http_error.h"
#include "proxy/cors.h"

/* A preflight's answer is kept by the browser this long (seconds). */
#define PREFLIGHT_MAX_AGE "600"

/* One origin of the list: scheme://host[:port], nothing after. */
static bool origin_ok(const char *o, size_t len)
{
	size_t scheme = !strncmp(o, "http://", 7)    ? 7
			: !strncmp(o, "https://", 8) ? 8
						     : 0;

	if (!scheme || len <= scheme)
		return false;
	for (size_t i = scheme; i < len; i++)
		if (!isalnum((unsigned char)o[i]) && !strchr(".-:[]", o[i]))
			return false;
	return true;
}

int pdx_cors_origins_check(const char *list, char *err, size_t errlen)
{
	const char *p = list;

	if (!strcmp(list, "*"))
		return 0;
	for (;;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);

		if (!origin_ok(p, len)) {
			snprintf(err, errlen,
				 "--allowed-origins: '%.*s' is no origin: want "
				 "\"*\" or http(s)://HOST[:PORT], comma-separated",
				 (int)len, p);
			return -1;
		}
		if (!end)
			return 0;
		p = end + 1;
	}
}

/* Origins compare exactly (RFC 6454: the browser sends it serialised). */
static bool allowed(const char *list, const char *origin)
{
	size_t n = strlen(origin);

	if (!strcmp(list, "*"))
		return true;
	for (const char *p = list;;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);

		if (len == n && !strncmp(p, origin, n))
			return true;
		if (!end)
			return false;
		p = end + 1;
	}
}

/* The headers a preflight asks for are allowed as asked when each is a
 * token: "Access-Control-Allow-Headers: *" would not cover
 * Authorization, which clients with an API key send. */
static bool header_list_ok(const char *h)
{
	for (; *h; h++)
		if (!isalnum((unsigned char)*h) && !strchr("-_ ,", *h))
			return false;
	return true;
}

bool pdx_cors_handle(const char *list, struct evhttp_request *req,
		     const char *allow)
{
	struct evkeyvalq *in = evhttp_request_get_input_headers(req);
	struct evkeyvalq *out = evhttp_request_get_output_headers(req);
	const char *origin = evhttp_find_header(in, "Origin");
	const char *asked = evhttp_find_header(in, "Access-Control-Request-Headers");
	bool preflight =
	    evhttp_request_get_command(req) == EVHTTP_REQ_OPTIONS &&
	    evhttp_find_header(in, "Access-Control-Request-Method") && allow;
	char msg[256];

	if (!list || !origin)
		return false;
	if (!allowed(list, origin)) {
		if (!preflight)
			return false; /* served, and the browser hides it */
		snprintf(msg, sizeof(msg),
			 "origin %.128s is not in the proxy's --allowed-origins",
			 origin);
		pdx_http_send_error(req, 403, "forbidden", msg);
		return true;
	}
	evhttp_add_header(out, "Access-Control-Allow-Origin",
			  strcmp(list, "*") ? origin : "*");
	evhttp_add_header(out, "Vary", "Origin");
	if (!preflight)
		return false;
	evhttp_add_header(out, "Access-Control-Allow-Methods", allow);
	if (asked && header_list_ok(asked))
		evhttp_add_header(out, "Access-Control-Allow-Headers", asked);
	evhttp_add_header(out, "Access-Control-Max-Age", PREFLIGHT_MAX_AGE);
	evhttp_send_reply(req, 204, "No Content", NULL);
	return true;
}
