/* The proxy's shared state, as the request handlers see it: options, the
 * two pools, metrics and the calls in flight. Internal to proxy/.
 *
 * One thread: everything here lives on the proxy's one event loop.
 */
#ifndef PDX_PROXY_PROXY_H
#define PDX_PROXY_PROXY_H

#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>
#include <sys/queue.h>

#include "common/http_error.h"
#include "proxy/discovery.h"
#include "proxy/health.h"
#include "proxy/metrics.h"
#include "proxy/opts.h"
#include "proxy/pool.h"
#include "proxy/transfers.h"
#include "proxy/upstream.h"

struct pdx_call;

struct pdx_proxy {
	const struct pdx_proxy_opts *o;
	struct event_base *base;
	struct evhttp *http;
	uint16_t port;		 /* the bound one */
	char metaserver_url[PDX_PROXY_URL_MAX]; /* for the early callback */
	struct pdx_pool pool[2]; /* [PDX_POOL_PREFILL], [PDX_POOL_DECODE] */
	struct pdx_proxy_metrics metrics;
	struct pdx_transfers xfers;  /* the agents' notifications */
	struct pdx_upstreams legs;   /* every engine leg */
	struct pdx_health health;    /* the instances' health checks */
	struct pdx_discovery discovery; /* --prefill-dns, --decode-dns */
	LIST_HEAD(, pdx_call) calls; /* client requests in flight */
	unsigned ncalls;
	/* SIGTERM: new requests get 503, /ready 503; the loop ends when the
	 * last call is freed (main.c) */
	bool draining;
};

/* Starts the HTTP server on o->host:o->port; -1 with the reason in err. */
int pdx_proxy_listen(struct pdx_proxy *px, char *err, size_t errlen);

/* Ends every call in flight, saying why (pdx_call_shut), and drains:
 * the loop ends once their last bytes are written. */
void pdx_proxy_shut(struct pdx_proxy *px, const char *why);

/* Aborts every call in flight and closes the server (the loop is over). */
void pdx_proxy_close(struct pdx_proxy *px);

/* The admin API: /admin/instances (admin.c); path the route's
 * (pdx_http_route_path()). */
void pdx_admin_handle(struct pdx_proxy *px, struct evhttp_request *req,
		      const char *path);

#endif
