/* Browsers' cross-origin requests (CORS): a web page served from another
 * origin may call the proxy only if the proxy says so. vLLM's server
 * lets every origin by default; pdx-proxy lets none until
 * --allowed-origins names them (or "*"), since a page that may read the
 * answers of a proxy on a private network can use it from any browser
 * that can reach it.
 *
 * Pure apart from the request it answers; one thread.
 */
#ifndef PDX_PROXY_CORS_H
#define PDX_PROXY_CORS_H

#include <event2/http.h>
#include <stdbool.h>
#include <stddef.h>

/* Checks --allowed-origins: "*", or origins (scheme://host[:port], http
 * or https, no path) separated by commas. 0, or -1 with why in err. */
int pdx_cors_origins_check(const char *list, char *err, size_t errlen);

/* Called for every request before its route, with the methods its route
 * takes (allow, "GET" or "POST"...; NULL: no route). With a list (NULL:
 * off) and an Origin it allows, the answer will carry
 * Access-Control-Allow-Origin. A preflight (OPTIONS with
 * Access-Control-Request-Method) is answered here: 204 with the route's
 * methods and the headers it asked for, or 403 for an origin the list
 * lacks. true: answered, the route must not run. */
bool pdx_cors_handle(const char *list, struct evhttp_request *req,
		     const char *allow);

#endif
