/* Active health checks: every --health-interval the proxy sends GET
 * /health to each instance of both pools, bounded by --health-timeout.
 * After --unhealthy-after failed checks in a row (no connection, a
 * timeout, any status but 200) the instance gets no new requests; after
 * --healthy-after passed checks in a row it gets them again
 * (pdx_pool_health, pdx_pool_usable). Requests already on an instance
 * are not touched.
 *
 * A check has its own connection per instance, closed after each answer
 * ("Connection: close"), so it never takes or leaves a kept-alive
 * connection of the requests' and engines see at most one check from
 * this proxy at a time. An instance removed from its pool loses its
 * check at the next round.
 *
 * One thread (the proxy's loop). A zero-initialised struct is off;
 * pdx_health_stop() is NULL-safe on one never started.
 */
#ifndef PDX_PROXY_HEALTH_H
#define PDX_PROXY_HEALTH_H

#include <sys/queue.h>

struct event;
struct event_base;
struct pdx_pool;
struct pdx_probe;

struct pdx_health {
	struct event_base *base;
	struct pdx_pool *pools; /* [2] */
	unsigned timeout_ms, down_after, up_after;
	struct event *tick;
	LIST_HEAD(, pdx_probe) probes;
};

/* Starts the rounds over pools[0] and pools[1], the first after one
 * interval (instances count as healthy until checked). -1: out of
 * memory. */
int pdx_health_start(struct pdx_health *h, struct event_base *base,
		     struct pdx_pool *pools, unsigned interval_ms,
		     unsigned timeout_ms, unsigned down_after,
		     unsigned up_after);

/* Stops the rounds and drops every check (a check in flight is closed,
 * its callback never runs). */
void pdx_health_stop(struct pdx_health *h);

#endif
