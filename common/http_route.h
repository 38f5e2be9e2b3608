/* What the routes of every HTTP server of pdx (engine, proxy) share:
 * the routes both serve alike.
 *
 * One thread (the server's loop).
 */
#ifndef PDX_COMMON_HTTP_ROUTE_H
#define PDX_COMMON_HTTP_ROUTE_H

#include <event2/http.h>

/* GET /version: {"version": VERSION}, what --version prints (vLLM's
 * API server has the route; clients and dashboards probe it). */
void pdx_http_send_version(struct evhttp_request *req);

#endif
