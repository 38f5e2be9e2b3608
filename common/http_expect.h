/* A request that waits for "100 Continue" before sending a body over the
 * server's limit is refused at once, 413 and the connection closed,
 * instead of being left without an answer.
 *
 * libevent 2.1's evhttp reads the head, then (Expect: 100-continue,
 * HTTP/1.1) answers "100 Continue" when the declared Content-Length is
 * within its own limit, or, over it and with EVHTTP_SERVER_LINGERING_CLOSE
 * (which pdx sets, common/http_error.h), waits to read the whole body
 * before its 413: a client that waits for the 100 (as it should) gets
 * nothing until it gives up and sends the body anyway (curl after 1 s,
 * others never). Nor is there a hook between head and body in 2.1 (2.2
 * has evhttp_set_newreqcb). So the connection's input is looked at as it
 * arrives, before evhttp parses it: a buffer that holds exactly one
 * request head (the client sent it and waits) asking for 100-continue
 * with one Content-Length over the limit has that length rewritten to 0
 * and its connection marked; evhttp then hands the request, bodiless, to
 * the route at once, where pdx_http_body_refused() (http_error.h) finds
 * the mark and answers 413 with "Connection: close". Everything else
 * (a head in pieces, a body sent along, chunked) goes as before.
 *
 * One thread (the server's loop), one server per process.
 */
#ifndef PDX_COMMON_HTTP_EXPECT_H
#define PDX_COMMON_HTTP_EXPECT_H

#include <event2/http.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where a request head's one Content-Length value sits, and what it
 * declares. */
struct pdx_http_expect {
	size_t value_off, value_len;
	uint64_t declared; /* UINT64_MAX: more than 19 digits */
};

/* Pure: head (len bytes, the request line to the empty line, CRLF line
 * ends) asks for 100-continue at HTTP/1.1 or later with one
 * Content-Length over limit, no Transfer-Encoding and no folded line:
 * true and *out. */
bool pdx_http_expect_over(const char *head, size_t len, uint64_t limit,
			  struct pdx_http_expect *out);

/* Looks at every connection's input of http from now on (its bufferevent
 * callback); bodies over limit are refused. */
void pdx_http_expect_watch(struct evhttp *http, uint64_t limit);

/* req's connection was marked (see above): true and the length it
 * declared, and the mark is gone. */
bool pdx_http_expect_refused(struct evhttp_request *req, uint64_t *declared);

#endif
