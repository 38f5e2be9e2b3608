/* Pools of engine instances (one for prefill, one for decode) and the
 * policies that pick one per request:
 *   round-robin;
 *   least-loaded: the smallest load, where an instance's load is this
 *     proxy's requests in flight on it plus the transfers it set up there
 *     that the agents have not reported finished (transfers.h): a prefill
 *     instance still holds a finished request's KV until it is sent;
 *   prefix-aware: each prompt prefix has its own order of the instances
 *     (rendezvous hashing of the prefix key and the instance's URL), and
 *     gets the first one in that order whose load is at most the least
 *     load plus PDX_POOL_PREFIX_SLACK, so the requests that share a prefix
 *     meet its KV in one engine's prefix cache while no instance is
 *     swamped; adding or removing an instance moves only its share.
 *
 * Every policy picks among the usable instances only (pdx_pool_usable):
 * those that pass their health checks (health.c), are in the pool of
 * their engine's role (misplaced), and whose circuit breaker lets a
 * request through (breaker.h); where none is, among the healthy ones
 * whose breaker's trial is under way too.
 *
 * One thread (the proxy's loop). An instance is reference counted: a
 * request holds the instance it picked until pdx_pool_put(), and an
 * engine leg holds its instance until the leg is freed, so removing an
 * instance (admin API) never frees one still in use.
 *
 * An instance also owns its idle keep-alive connections (filled and
 * emptied by upstream.c): they are closed when it is removed from its
 * pool and when it is freed.
 */
#ifndef PDX_PROXY_POOL_H
#define PDX_PROXY_POOL_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/queue.h>

#include "proxy/breaker.h"
#include "proxy/served_models.h"

#define PDX_POOL_ADDR_MAX 128
#define PDX_POOL_MAX 256     /* instances per pool */
#define PDX_POOL_IDLE_MAX 64 /* idle connections kept per instance */
/* how much more loaded than the least loaded instance a prefix's own
 * instance may be and still get it */
#define PDX_POOL_PREFIX_SLACK 4
/* tensor-parallel ranks of one instance the proxy knows the agents of
 * (pdx-engine's PDX_TP_MAX) */
#define PDX_POOL_TP_MAX 16

struct event;
struct pdx_probe;
struct evhttp;
struct evhttp_connection;

enum pdx_pool_role { PDX_POOL_PREFILL, PDX_POOL_DECODE };
enum pdx_pool_policy {
	PDX_POLICY_ROUND_ROBIN,
	PDX_POLICY_LEAST_LOADED,
	PDX_POLICY_PREFIX_AWARE,
};

struct pdx_inst {
	char host[PDX_POOL_ADDR_MAX];
	uint16_t port;
	char url[PDX_POOL_ADDR_MAX + 16]; /* "http://host:port" */
	enum pdx_pool_role role;
	uint64_t url_hash; /* its place in each prefix's order */
	unsigned inflight; /* requests of this proxy on it now */
	unsigned xfers;	   /* transfers set up and not reported finished */
	uint64_t requests; /* requests sent to it (picks: no probes) */
	uint64_t failures; /* of those: no answer, a timeout or a 5xx */
	struct pdx_breaker breaker;
	/* health checks (health.c): failed or passed ones in a row, and
	 * the verdict; a new instance counts as healthy */
	unsigned health_fails, health_oks;
	bool unhealthy;
	struct pdx_probe *probe; /* health.c's, while it checks this one */
	unsigned refs;
	bool removed;
	/* removed while requests still held it: on its pool's gone list
	 * until freed, so adding its address back takes it back with its
	 * requests in flight (a fresh one counted none: least-loaded
	 * over-picked an instance a DNS record dropped and brought back) */
	struct pdx_pool *gone_from;
	LIST_ENTRY(pdx_inst) gone_link;
	/* the engine's agent peer address from GET /v1/pdx/info ("" if it
	 * has none); asked when first needed. A tensor-parallel
	 * instance is one instance here (the proxy talks to rank 0's HTTP
	 * only) with one agent per rank: peers[r] is rank r's, peers[0] is
	 * peer; tp is 1 otherwise. Asked again after a failure
	 * (pdx_pool_relearn) */
	bool peer_known;
	char peer[PDX_POOL_ADDR_MAX];
	/* the same answer's "role" (prefill, decode, both) and whether it
	 * named its agent as none ("agent": null: a colocated pdx-engine);
	 * "" and false where it did not say (vLLM has no such route) */
	char engine_role[12];
	bool no_agent;
	/* that answer put it in the wrong pool (the other role, or no
	 * agent): no pick takes it until its engine is seen started again
	 * (engine_id) or a health check fails (it may come back mended) */
	bool misplaced;
	/* pdx-engine's X-PDX-Engine-Id at the last passed check, "" until
	 * one said it: a new one is an engine started again on the address,
	 * maybe with another model or role, too quickly for a check to fail */
	char engine_id[24];
	unsigned tp;
	char peers[PDX_POOL_TP_MAX][PDX_POOL_ADDR_MAX];
	/* a prefill instance's bootstrap server port for SGLang decode
	 * instances (flow_sglang.c): an SGLang instance's own, from its GET
	 * /get_server_info; a pdx one's the one this proxy serves for it,
	 * boot (sglang_boot.h); 0 until known */
	uint16_t bootstrap_port;
	struct evhttp *boot;
	/* the models it serves (health.c asks, again after a failed check,
	 * and when it is added back) */
	struct pdx_served_models models;
	/* idle keep-alive connections, oldest first, and the timer that
	 * closes them when they expire (upstream.c) */
	struct {
		struct evhttp_connection *conn;
		uint64_t expires_ns; /* pdx_now_ns() */
	} idle[PDX_POOL_IDLE_MAX];
	unsigned n_idle;
	struct event *idle_timer;
};

struct pdx_pool {
	enum pdx_pool_role role;
	enum pdx_pool_policy policy;
	unsigned n, rr;
	struct pdx_inst *inst[PDX_POOL_MAX];
	LIST_HEAD(, pdx_inst) gone; /* removed, still held (zero: empty) */
	/* new instances' breaker settings: failures in a row that open it
	 * (0: never), and for how long */
	unsigned breaker_failures;
	uint64_t breaker_open_ns;
	/* no pick joins a breaker's trial: a request with no usable
	 * instance has somewhere better to go (prefill: D prefills it under
	 * --on-prefill-failure local, at once, where a suspect instance
	 * made each wait for its leg to fail first) */
	bool no_trial_joining;
};

/* Parses "host:port", "http://host:port" or "[v6]:port" into host and
 * port; -1 with the reason in err. A host is a name or an address: ASCII
 * letters, digits, '.', '-', '_' (and ':', '%' in brackets), nothing a
 * header, a log line or a /metrics label would take for more. Pure. */
int pdx_pool_addr_parse(const char *s, char *host, size_t hostlen,
			uint16_t *port, char *err, size_t errlen);

/* Adds an instance; -1 with the reason in err (bad address, duplicate,
 * pool full). One removed from this pool that requests still hold comes
 * back as it is, their requests counted, checked healthy, breaker
 * closed, its agents asked again. */
int pdx_pool_add(struct pdx_pool *p, const char *addr, char *err,
		 size_t errlen);

/* Whether an instance with this address ("h:p" or "http://h:p") is in
 * the pool. */
bool pdx_pool_has(const struct pdx_pool *p, const char *addr);

/* Removes the instance with this address ("h:p" or "http://h:p"); 0, or
 * -1 if there is none. Requests holding it finish normally. */
int pdx_pool_remove(struct pdx_pool *p, const char *addr);

/* Picks a usable instance other than avoid (NULL: none to avoid) by the
 * pool's policy, and takes a reference and an in-flight slot; NULL when
 * there is none. key: the request's prompt prefix key
 * (pdx_pool_prefix_key), read by prefix-aware only. model: the model the
 * request names (NULL: none); instances known to serve other models only
 * (served_models.h) are passed over while a usable one, avoid too, may
 * serve it; when none may, or_any says whether any usable instance may
 * be picked (its engine then answers: 404) or none. A breaker past its
 * open time lets this pick through as its trial. */
struct pdx_inst *pdx_pool_pick(struct pdx_pool *p, uint64_t key,
			       const struct pdx_inst *avoid,
			       const char *model, bool or_any);

/* May a request go to i now: healthy, in the right pool, and its breaker
 * not open? */
bool pdx_pool_usable(const struct pdx_inst *i, uint64_t now);

/* Would a pick for model (NULL: any) with or_any find a usable instance
 * in p other than avoid? */
bool pdx_pool_has_usable(const struct pdx_pool *p,
			 const struct pdx_inst *avoid, const char *model,
			 bool or_any);

/* A transfer between p and d failed, or a request to them did (either
 * NULL-safe): their agents are asked again (GET /v1/pdx/info) before
 * the next request that needs them. An agent restarted at another
 * address (--advertise changed, --listen port 0) left the one learned
 * first stale, and every transfer with it failed. */
void pdx_pool_relearn(struct pdx_inst *p, struct pdx_inst *d);

/* A request to i ended: ok, or failed (no answer, a timeout, a 5xx).
 * Counts the failure and feeds the breaker; returns whether the
 * breaker's state changed (the caller logs it). */
bool pdx_pool_result(struct pdx_inst *i, bool ok);

/* A health check of i passed or failed. After down_after failures in a
 * row i is unhealthy, after up_after passes in a row healthy again;
 * returns whether that verdict changed. */
bool pdx_pool_health(struct pdx_inst *i, bool ok, unsigned down_after,
		     unsigned up_after);

/* An instance's load: in-flight requests plus unfinished transfers. */
unsigned pdx_pool_load(const struct pdx_inst *i);

/* Takes a reference and an in-flight slot on an instance already held
 * (a second leg to the same instance: a probe such as /v1/pdx/info, not
 * counted in its requests). */
void pdx_pool_hold(struct pdx_inst *i);

/* Gives back what pdx_pool_pick() or pdx_pool_hold() took; NULL-safe. */
void pdx_pool_put(struct pdx_inst *i);

/* A reference only, no in-flight slot (an engine leg's, so the instance
 * and its idle list outlive the leg); pdx_pool_unref() gives it back. */
void pdx_pool_ref(struct pdx_inst *i);
void pdx_pool_unref(struct pdx_inst *i);

/* Closes the instance's idle connections (removed, or freed). */
void pdx_pool_idle_close(struct pdx_inst *i);

/* Drops every instance (at exit, after all requests are gone). */
void pdx_pool_clear(struct pdx_pool *p);

const char *pdx_pool_role_name(enum pdx_pool_role r);
const char *pdx_pool_policy_name(enum pdx_pool_policy p);
int pdx_pool_policy_parse(const char *s, enum pdx_pool_policy *out);

#endif
