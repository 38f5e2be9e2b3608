/* What the routes of every HTTP server of pdx (engine, proxy) share:
 * how a request's path names its route, and the routes both serve alike.
 *
 * One thread (the server's loop).
 */
#ifndef PDX_COMMON_HTTP_ROUTE_H
#define PDX_COMMON_HTTP_ROUTE_H

#include <event2/http.h>
#include <stddef.h>

#define PDX_HTTP_PATH_MAX 256 /* longer paths name no route of ours */

/* The path req's route is matched by: the path evhttp parsed ("/" when
 * none), with one trailing slash dropped ("/v1/models/" is /v1/models,
 * "/" stays "/"). A client that adds the slash (a base URL that ends in
 * one, joined to a route) was answered 404. The result is buf (len
 * bytes, PDX_HTTP_PATH_MAX will do) or the parsed path itself; valid
 * while req and buf are. An unknown path stays unknown: its 404 names
 * the path as the client sent it. */
const char *pdx_http_route_path(struct evhttp_request *req, char *buf,
				size_t len);

/* GET /version: {"version": VERSION}, what --version prints (vLLM's
 * API server has the route; clients and dashboards probe it). */
void pdx_http_send_version(struct evhttp_request *req);

#endif
