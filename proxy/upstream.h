/* One HTTP request from the proxy to an engine instance (a "leg"), with a
 * connect and a first-byte deadline, on a keep-alive connection of the
 * instance's (reused, or made for it). Only a leg whose response ended
 * completely gives its connection back for reuse; a cancelled, failed or
 * timed-out one closes it.
 *
 * One thread (the proxy's loop). Callbacks fire from that loop, never
 * from inside pdx_upstream_start() or pdx_upstream_cancel():
 *   on_head  once, when the response's status line and headers arrived;
 *   on_chunk zero or more times with body bytes as they arrive (only when
 *            stream_body is set; otherwise the body collects in the leg);
 *   on_end   exactly once, unless the leg was cancelled: status 0 means
 *            the leg failed (err_status says 502 or 504 and why).
 * Each leg that ends (not a cancelled one) counts for or against its
 * instance's circuit breaker (pdx_pool_result): no answer, a timeout or
 * a 5xx against it; a good answer for it, but a probe's and the prefill
 * leg's of a pair (see leg_result in upstream.c).
 * After on_end (or pdx_upstream_cancel) the leg is freed: do not touch it.
 */
#ifndef PDX_PROXY_UPSTREAM_H
#define PDX_PROXY_UPSTREAM_H

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <stdbool.h>
#include <stdint.h>

#include <sys/queue.h>

struct pdx_inst;
struct pdx_upstream;

/* The legs of one loop, so that the ones still closing can be freed at
 * exit. Zero-initialised (LIST_INIT) before use. */
struct pdx_upstreams {
	LIST_HEAD(, pdx_upstream) legs;
	unsigned handed_off; /* cancelled legs writing their request */
};

/* Frees every leg left (at exit, after the calls are gone). */
void pdx_upstreams_clear(struct pdx_upstreams *set);

struct pdx_upstream_cbs {
	void (*on_head)(struct pdx_upstream *u, int status,
			struct evkeyvalq *headers, void *arg);
	void (*on_chunk)(struct pdx_upstream *u, struct evbuffer *data,
			 void *arg);
	/* status: the engine's, or 0 on failure; body: the whole body when
	 * not streamed (else empty); why: on failure */
	void (*on_end)(struct pdx_upstream *u, int status,
		       struct evbuffer *body, int err_status, const char *why,
		       void *arg);
	void *arg;
};

struct pdx_upstream_params {
	struct event_base *base;
	struct pdx_upstreams *set;
	struct pdx_inst *inst; /* the leg takes a reference of its own */
	/* the other instance of its request's KV transfer (NULL: none),
	 * referenced too: an engine's 502 says the transfer failed on that
	 * side or between them, which counts there, not against inst */
	struct pdx_inst *partner;
	/* the leg asks the instance about itself (/v1/pdx/info, SGLang's
	 * /get_server_info and bootstrap): no request of a client's, so only
	 * its failure counts */
	bool probe;
	/* 0: the instance's port; else another server on its host (an
	 * SGLang prefill instance's bootstrap server), on a connection of
	 * the leg's own, not kept for reuse */
	uint16_t port;
	enum evhttp_cmd_type method;
	const char *path;	/* "/v1/completions?x" */
	const char *request_id; /* sent as X-Request-Id */
	const char *authorization; /* the client's, passed on (or NULL) */
	const void *body;	/* may be NULL */
	size_t body_len;
	bool stream_body; /* on_chunk instead of collecting */
	/* cancelled before its request is all written, the leg writes it
	 * and then closes, so its engine sees it and its client leave (a
	 * decode leg of a transfer: only its engine's abort frees the KV
	 * its prefill instance holds for it); else it is dropped */
	bool hand_off;
	unsigned connect_timeout_ms, first_byte_timeout_ms, idle_timeout_s;
	size_t max_body;       /* of a collected response */
	unsigned keepalive;    /* idle connections kept per instance; 0: none */
	unsigned keepalive_ms; /* an idle connection is closed after this */
};

/* Starts the leg; -1 if it could not even start (out of memory). */
int pdx_upstream_start(const struct pdx_upstream_params *p,
		       const struct pdx_upstream_cbs *cbs,
		       struct pdx_upstream **out);

/* The instance the leg goes to (the leg holds a reference until it is
 * freed, so it is valid inside the leg's callbacks). */
struct pdx_inst *pdx_upstream_inst(const struct pdx_upstream *u);
/* The instance its failure counts against: its own, or its partner's for
 * pdx-engine's 502 that says the other side failed. */
struct pdx_inst *pdx_upstream_failed(const struct pdx_upstream *u);
/* The leg failed for want of a file descriptor here (503: this proxy's
 * overload, counted against no instance, not retried). */
bool pdx_upstream_out_of_fds(const struct pdx_upstream *u);
/* The partner, when the engine's 502 says the agents refused to pair
 * (X-PDX-Failed-Side: both); else NULL. */
struct pdx_inst *pdx_upstream_both(const struct pdx_upstream *u);

/* Abandons the leg and closes its connection, so the engine sees its
 * client leave; no callback fires. A hand_off leg whose request is not
 * yet all written writes it first (--connect-timeout from now at most),
 * so its engine sees the request and then its client leave. NULL-safe.
 * Not from inside the leg's own callbacks. */
void pdx_upstream_cancel(struct pdx_upstream *u);

#endif
