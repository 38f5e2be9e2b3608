/* How every HTTP server of pdx (engine, proxy) refuses a request: one
 * error body, OpenAI's, for every error status (413 and 405 included),
 * and one limit on request bodies.
 *
 *   {"error": {"message": str, "type": str, "param": str|null,
 *              "code": status}}
 *
 * Body limits. A client's body may be PDX_HTTP_MAX_BODY bytes at an
 * engine and at pdx-proxy (its --max-body default). An engine takes
 * PDX_HTTP_BODY_HEADROOM more: the fields a proxy adds to a request
 * (kv_transfer_params) always fit, so a body the proxy took is never
 * refused by the engine behind it. libevent answers a body over its own
 * limit with an HTML 413 that no hook can change, so its limit is set
 * to twice ours (pdx_http_body_limit): everything between is refused by
 * pdx_http_body_refused(), in JSON, and so is a body over ours that a
 * client waits to send until "100 Continue", before it is sent
 * (common/http_expect.h).
 *
 * One thread (the server's loop); the body builders are pure.
 */
#ifndef PDX_COMMON_HTTP_ERROR_H
#define PDX_COMMON_HTTP_ERROR_H

#include <event2/http.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define PDX_HTTP_MAX_BODY (8u << 20)
#define PDX_HTTP_BODY_HEADROOM (64u << 10)

/* The error object; param NULL or "": null. Bytes of msg that are not UTF-8
 * (a client's, quoted) become '?'. NULL when out of memory. */
json_t *pdx_http_error_obj(int status, const char *type, const char *param,
			   const char *msg);

/* The same as compact JSON text (free() it), e.g. for an SSE event. */
char *pdx_http_error_body(int status, const char *type, const char *param,
			  const char *msg);

/* Replies with j as the JSON body (j is consumed; NULL gives a 500);
 * an answer to HEAD has none. */
void pdx_http_send_json(struct evhttp_request *req, int status, json_t *j);

/* evhttp_send_reply_start() for a body of unknown length (a stream, a
 * relayed answer): HTTP/1.1 chunked, HTTP/1.0 until the connection
 * closes. libevent answered an HTTP/1.0 client that asked for keep-alive
 * "Content-Length: 0" and sent the body after it anyway. */
void pdx_http_reply_start(struct evhttp_request *req, int status,
			  const char *reason);

/* Replies with the error object. */
void pdx_http_send_error(struct evhttp_request *req, int status,
			 const char *type, const char *msg);

/* 405, with the methods the route takes in Allow ("GET, POST"). */
void pdx_http_send_405(struct evhttp_request *req, const char *allow);

/* 404 for a path no route serves, naming it as the client sent it (its
 * query left out): the path evhttp parsed may not be the one asked for
 * ("//v1/models" is parsed as host "v1" and path "/models"). */
void pdx_http_send_404(struct evhttp_request *req);

/* Sets libevent's own bound on request bodies (twice max_body, see
 * above) and has it read an oversized body to its end before answering,
 * so a client that is still sending sees the 413 instead of a reset;
 * one that waits for "100 Continue" is refused at once
 * (pdx_http_expect_watch()). */
void pdx_http_body_limit(struct evhttp *http, size_t max_body);

/* A request body over max_body (413; declared and waiting for "100
 * Continue": 413 and the connection closed), or framed by two
 * Content-Length headers that differ (400): replies and returns true. */
bool pdx_http_body_refused(struct evhttp_request *req, size_t max_body);

#endif
