/* One HTTP leg to an engine (see upstream.h).
 *
 * Connections are kept alive (docs/proxy.md, "Connections"). A leg takes
 * its instance's youngest idle connection, or makes a new one. A leg
 * whose response ended completely (any status, its end known from its
 * length or its chunks, and no "Connection: close") gives its connection
 * back to the instance's idle list, at most keepalive of them. Every
 * other end (cancelled, timed out, failed) frees the connection, which
 * closes the socket, so the engine sees its client leave and aborts. An
 * idle connection is closed keepalive_ms after it went idle (one timer
 * per instance), and one that old is never taken, so the proxy rarely
 * writes into a connection the engine is closing at that moment. A
 * request that fails is never sent again (a prefill would run twice).
 *
 * evhttp (2.1) has one timeout for every read and write; it is used as
 * the idle timeout between reads. The connect and first-byte deadlines
 * are one timer of ours: at the connect deadline the socket must have a
 * peer, at the first-byte deadline the response head must have come.
 *
 * A leg's connection is freed (or given back) by us, never by evhttp: at
 * once when the leg is cancelled (but below) or times out (no request
 * callback runs then), and from the timer, right after the loop has left
 * evhttp's callbacks, when the response ended. evhttp fails a request
 * inside evhttp_make_request() when it cannot even make a socket (out of
 * file descriptors); that failure is told from the timer too.
 *
 * A hand_off leg cancelled before its request is all written (evhttp
 * writes it once connected, on a later turn of the loop) is handed off:
 * it writes the request, then closes from the timer, its callbacks
 * ignored, within --connect-timeout of the cancel. So its engine sees
 * the request and its client leave, as for any cancelled leg. Dropped,
 * the engine never learnt of it: a decode leg of a transfer whose
 * prefill had answered (the sequential flow, its client gone a moment
 * after P's answer) left P's KV held until its lease ran out. At most
 * HAND_OFF_MAX at once (each keeps a socket): past them, dropped. */
#define PDX_LOG_TOPIC "upstream"
#include "proxy/upstream.h"

#include <errno.h>
#include <event2/bufferevent.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/nodelay.h"
#include "proxy/inst_host.h"
#include "proxy/pool.h"

enum { HAND_OFF_MAX = 64 };

struct pdx_upstream {
	LIST_ENTRY(pdx_upstream) link;
	struct pdx_upstream_cbs cbs;
	struct pdx_inst *inst;
	struct pdx_inst *partner; /* its params' (referenced) */
	bool peer_failed; /* a 502 that says so (X-PDX-Failed-Side: peer) */
	bool both_failed; /* X-PDX-Failed-Side: both (the agents refused to
			   * pair: layouts differ) */
	bool probe;	  /* its params' */
	struct evhttp_connection *conn;
	struct evhttp_request *req;
	struct event *timer;
	unsigned first_byte_left_ms; /* after the connect deadline */
	int err_status;		     /* 502 or 504, from the error callback */
	char why[256];
	unsigned keepalive;
	uint64_t keepalive_ns;
	bool connect_phase;
	bool starting;	   /* inside evhttp_make_request() */
	bool failed_early; /* failed in there: the timer tells */
	bool no_fds;	   /* for want of a descriptor here: not counted */
	bool ended;	   /* the timer now frees the leg */
	bool reuse;	   /* the response ended completely */
	struct pdx_upstreams *set;
	/* on the connection's output of a hand_off leg: is the request
	 * written? */
	struct evbuffer_cb_entry *out_watch;
	bool queued;	 /* evhttp put the request there (once connected) */
	bool handed_off; /* cancelled, and writes it before it closes */
	unsigned connect_timeout_ms;
};

static void tv_ms(struct timeval *tv, unsigned ms)
{
	tv->tv_sec = ms / 1000;
	tv->tv_usec = (ms % 1000) * 1000;
}

static struct evbuffer *conn_output(struct evhttp_connection *conn)
{
	return bufferevent_get_output(evhttp_connection_get_bufferevent(conn));
}

static evutil_socket_t conn_fd(struct evhttp_connection *conn)
{
	struct bufferevent *bev = evhttp_connection_get_bufferevent(conn);

	return bev ? bufferevent_getfd(bev) : -1;
}

static void idle_timer_arm(struct pdx_inst *i, uint64_t now)
{
	uint64_t due = i->idle[0].expires_ns;
	uint64_t left = due > now ? due - now : 0;
	struct timeval tv;

	left += 1000000; /* 1 ms late rather than early */
	tv.tv_sec = left / 1000000000;
	tv.tv_usec = (left % 1000000000) / 1000;
	evtimer_add(i->idle_timer, &tv);
}

/* Closes the instance's idle connections that expired (the oldest come
 * first) and waits for the next one. */
static void on_idle_timer(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_inst *i = arg;
	uint64_t now = pdx_now_ns();
	unsigned n = 0;

	while (n < i->n_idle && i->idle[n].expires_ns <= now)
		evhttp_connection_free(i->idle[n++].conn);
	if (n) {
		i->n_idle -= n;
		memmove(i->idle, i->idle + n, i->n_idle * sizeof(i->idle[0]));
	}
	if (i->n_idle)
		idle_timer_arm(i, now);
}

/* The instance's youngest idle connection that is still open and has
 * not expired, or NULL; the ones passed over are closed. */
static struct evhttp_connection *idle_take(struct pdx_inst *i)
{
	uint64_t now = pdx_now_ns();

	while (i->n_idle) {
		i->n_idle--;
		if (i->idle[i->n_idle].expires_ns > now &&
		    conn_fd(i->idle[i->n_idle].conn) >= 0)
			return i->idle[i->n_idle].conn;
		evhttp_connection_free(i->idle[i->n_idle].conn);
	}
	return NULL;
}

/* Gives a connection whose response ended completely to its instance;
 * false when it is not kept (the caller frees it): keep-alive off, the
 * instance removed, its list full, or the engine closed it (it asked to,
 * or evhttp saw it close). */
static bool idle_put(struct pdx_upstream *u)
{
	struct pdx_inst *i = u->inst;
	uint64_t now;

	if (i->removed || i->n_idle >= u->keepalive || conn_fd(u->conn) < 0)
		return false;
	if (!i->idle_timer) {
		i->idle_timer =
		    evtimer_new(event_get_base(u->timer), on_idle_timer, i);
		if (!i->idle_timer)
			return false;
	}
	now = pdx_now_ns();
	i->idle[i->n_idle].conn = u->conn;
	i->idle[i->n_idle++].expires_ns = now + u->keepalive_ns;
	/* a timer still set is due no later than this one's expiry */
	if (!evtimer_pending(i->idle_timer, NULL))
		idle_timer_arm(i, now);
	return true;
}

/* Frees the leg. Its connection goes back to the instance when the
 * response ended completely, else it is freed (closing the socket, and
 * freeing a request still on it without callbacks). */
static void leg_free(struct pdx_upstream *u)
{
	if (u->out_watch)
		evbuffer_remove_cb_entry(conn_output(u->conn), u->out_watch);
	if (u->handed_off)
		u->set->handed_off--;
	if (u->conn && !(u->reuse && idle_put(u)))
		evhttp_connection_free(u->conn);
	if (u->timer)
		event_free(u->timer);
	LIST_REMOVE(u, link);
	pdx_pool_unref(u->inst);
	if (u->partner)
		pdx_pool_unref(u->partner);
	free(u);
}

/* The response ended inside evhttp's callbacks: free soon, outside. */
static void leg_end_later(struct pdx_upstream *u)
{
	struct timeval now = {0, 0};

	u->ended = true;
	evtimer_add(u->timer, &now);
}

/* A result goes to an instance's failure count and breaker. */
static void inst_result(struct pdx_inst *i, bool ok)
{
	if (!pdx_pool_result(i, ok))
		return;
	if (i->breaker.state == PDX_BREAKER_OPEN)
		log_warn("%s instance %s: circuit breaker open, no requests for "
			 "%llu ms",
			 pdx_pool_role_name(i->role), i->url,
			 (unsigned long long)(i->breaker.open_ns / 1000000));
	else
		log_info("%s instance %s: circuit breaker closed, a request "
			 "succeeded",
			 pdx_pool_role_name(i->role), i->url);
}

/* The leg's result: no answer, a timeout or a 5xx is its instance's
 * failure, but 503 (see below), and pdx-engine's 502 "my KV transfer
 * failed on the other side or between the agents" (X-PDX-Failed-Side:
 * peer), which is the partner's: a prefill instance that pushed to
 * nowhere opened every decode instance's breaker in turn; and its 502
 * "the agents refused to pair" (X-PDX-Failed-Side: both), which is
 * both's. A good answer counts for its instance, but not a probe's (an
 * instance that answers about itself and fails every request must not
 * look well)
 * nor the prefill leg's of a pair: it says nothing of the KV transfer,
 * which the decode leg's 2xx vouches for, for both. Counted at
 * once, P's answer reset its failures between each two of D's 502s, and
 * a prefill instance whose every transfer failed kept its breaker shut. */
static void leg_result(struct pdx_upstream *u, int status)
{
	bool ok = status && status < 500;

	if (status == 503)
		return;
	if (u->both_failed && u->partner) {
		/* which of the two is misconfigured, neither can tell: the
		 * one that fails with every partner opens first */
		inst_result(u->inst, false);
		inst_result(u->partner, false);
		return;
	}
	if (u->peer_failed && u->partner) {
		inst_result(u->partner, false);
		return;
	}
	if (ok && (u->probe ||
		   (u->partner && u->inst->role == PDX_POOL_PREFILL)))
		return;
	inst_result(u->inst, ok);
	if (status >= 200 && status < 300 && u->partner)
		inst_result(u->partner, true);
}

static void leg_fail(struct pdx_upstream *u, int err_status, const char *why)
{
	u->cbs.on_end(u, 0, NULL, err_status, why, u->cbs.arg);
	leg_free(u);
}

static bool leg_connected(struct pdx_upstream *u)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	evutil_socket_t fd = conn_fd(u->conn);

	return fd >= 0 && getpeername(fd, (struct sockaddr *)&ss, &len) == 0;
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_upstream *u = arg;
	struct timeval tv;
	char why[160];

	if (u->ended || u->handed_off) { /* or written, or its bound */
		leg_free(u);
		return;
	}
	if (u->failed_early) {
		static uint64_t said_ns;

		if (!u->no_fds)
			leg_result(u, 0);
		if (!u->no_fds || pdx_once_a_second(&said_ns))
			log_warn("%s", u->why);
		leg_fail(u, u->err_status, u->why);
		return;
	}
	if (u->connect_phase && u->first_byte_left_ms && leg_connected(u)) {
		u->connect_phase = false;
		tv_ms(&tv, u->first_byte_left_ms);
		evtimer_add(u->timer, &tv);
		return;
	}
	snprintf(why, sizeof(why), "%s instance %s: %s timed out",
		 pdx_pool_role_name(u->inst->role), u->inst->url,
		 u->connect_phase && !leg_connected(u) ? "connect"
						       : "first byte");
	leg_result(u, 0);
	log_warn("%s", why);
	leg_fail(u, 504, why);
}

static int on_header(struct evhttp_request *req, void *arg)
{
	struct pdx_upstream *u = arg;
	const char *side = evhttp_find_header(
	    evhttp_request_get_input_headers(req), "X-PDX-Failed-Side");

	if (u->handed_off)
		return 0;
	evtimer_del(u->timer);
	u->peer_failed = evhttp_request_get_response_code(req) == 502 &&
			 side && !strcmp(side, "peer");
	u->both_failed = evhttp_request_get_response_code(req) == 502 &&
			 side && !strcmp(side, "both");
	if (u->cbs.on_head)
		u->cbs.on_head(u, evhttp_request_get_response_code(req),
			       evhttp_request_get_input_headers(req),
			       u->cbs.arg);
	return 0;
}

static void on_chunk(struct evhttp_request *req, void *arg)
{
	struct pdx_upstream *u = arg;

	if (!u->handed_off)
		u->cbs.on_chunk(u, evhttp_request_get_input_buffer(req),
				u->cbs.arg);
}

static void on_error(enum evhttp_request_error err, void *arg)
{
	struct pdx_upstream *u = arg;
	const char *what = "connection failed";
	int e = errno; /* evhttp keeps the socket's error for us */

	if (u->handed_off) /* on_done follows */
		return;
	u->err_status = 502;
	/* no socket for want of a descriptor here: this proxy's overload,
	 * which says nothing of the instance (counted, a burst of clients
	 * opened the breaker of a healthy one, and every client got 503
	 * "no usable instance" for seconds after it had passed) */
	if (u->starting && (e == EMFILE || e == ENFILE)) {
		u->no_fds = true;
		u->err_status = 503;
		snprintf(u->why, sizeof(u->why),
			 "this proxy is out of file descriptors (ulimit -n): "
			 "no socket for %s instance %s",
			 pdx_pool_role_name(u->inst->role), u->inst->url);
		return;
	}
	if (u->starting) { /* no socket, or no connect (evhttp says EOF) */
		char how[200];

		/* evhttp resolves the name in its connect: no errno, or
		 * EAGAIN, when it does not resolve */
		if (pdx_conn_failure(u->conn, e, how, sizeof(how)))
			snprintf(u->why, sizeof(u->why), "%s instance %s: %s",
				 pdx_pool_role_name(u->inst->role),
				 u->inst->url, how);
		else
			snprintf(u->why, sizeof(u->why),
				 "%s instance %s: cannot connect%s%s",
				 pdx_pool_role_name(u->inst->role),
				 u->inst->url, e ? ": " : "",
				 e ? strerror(e) : "");
		return;
	}
	switch (err) {
	case EVREQ_HTTP_TIMEOUT:
		u->err_status = 504;
		what = "idle timeout";
		break;
	case EVREQ_HTTP_EOF:
		what = "connection closed early";
		break;
	case EVREQ_HTTP_INVALID_HEADER:
		what = "invalid response";
		break;
	case EVREQ_HTTP_DATA_TOO_LONG:
		what = "response too large";
		break;
	default:
		break;
	}
	snprintf(u->why, sizeof(u->why), "%s instance %s: %s",
		 pdx_pool_role_name(u->inst->role), u->inst->url, what);
}

/* The response's end was known from its head (a length, or chunks), not
 * from the engine closing the connection. */
static bool framed(struct evhttp_request *req)
{
	struct evkeyvalq *h = evhttp_request_get_input_headers(req);

	return evhttp_find_header(h, "Content-Length") ||
	       evhttp_find_header(h, "Transfer-Encoding");
}

static void on_done(struct evhttp_request *req, void *arg)
{
	struct pdx_upstream *u = arg;
	int status = req ? evhttp_request_get_response_code(req) : 0;
	int e = errno; /* evhttp keeps the socket's error for us */

	evtimer_del(u->timer);
	if (u->handed_off) { /* nobody hears of it */
		leg_end_later(u);
		return;
	}
	if (u->starting) {
		u->failed_early = true;
		if (!u->err_status) {
			u->err_status = 502;
			snprintf(u->why, sizeof(u->why),
				 "%s instance %s: cannot connect",
				 pdx_pool_role_name(u->inst->role),
				 u->inst->url);
		}
		return;
	}
	if (status == 0) {
		if (!u->err_status) {
			char how[200] = "no response";

			u->err_status = 502;
			/* a connect that failed (refused, no route) was said
			 * "no response" */
			pdx_conn_failure(u->conn, e, how, sizeof(how));
			snprintf(u->why, sizeof(u->why), "%s instance %s: %s",
				 pdx_pool_role_name(u->inst->role),
				 u->inst->url, how);
		}
		leg_result(u, 0);
		log_warn("%s", u->why);
		u->cbs.on_end(u, 0, NULL, u->err_status, u->why, u->cbs.arg);
	} else {
		u->reuse = u->keepalive && framed(req);
		/* 503 is the instance saying "not now" (its queue is full, its
		 * agent is away): retries and health checks deal with it, and
		 * it is no sign of a broken instance, which the breaker is for
		 * (it would keep a restarted agent's engine out for
		 * --breaker-open-ms after it is ready again) */
		leg_result(u, status);
		u->cbs.on_end(u, status, evhttp_request_get_input_buffer(req),
			      0, NULL, u->cbs.arg);
	}
	leg_end_later(u);
}

/* Whether evhttp put the request on the connection and the socket took
 * all of it (or a failed connection dropped it). */
static bool request_written(struct pdx_upstream *u)
{
	return u->queued && !evbuffer_get_length(conn_output(u->conn));
}

/* The connection's output changed: evhttp put the request there, or the
 * socket took some. A handed-off leg whose request is all written closes
 * now (from the timer: this runs inside the connection's write). */
static void on_output(struct evbuffer *buf, const struct evbuffer_cb_info *info,
		      void *arg)
{
	struct pdx_upstream *u = arg;
	struct timeval now = {0, 0};

	(void)buf;
	if (info->n_added)
		u->queued = true;
	if (u->handed_off && request_written(u))
		evtimer_add(u->timer, &now);
}

int pdx_upstream_start(const struct pdx_upstream_params *p,
		       const struct pdx_upstream_cbs *cbs,
		       struct pdx_upstream **out)
{
	struct pdx_upstream *u = calloc(1, sizeof(*u));
	uint16_t port = p->port ? p->port : p->inst->port;
	struct evkeyvalq *h;
	struct timeval tv;
	unsigned first;
	bool fresh = false;
	int rc;
	char hostport[PDX_POOL_ADDR_MAX + 8];

	if (!u)
		return -1;
	LIST_INSERT_HEAD(&p->set->legs, u, link);
	u->set = p->set;
	u->cbs = *cbs;
	u->inst = p->inst;
	pdx_pool_ref(u->inst);
	u->partner = p->partner;
	u->probe = p->probe;
	if (u->partner)
		pdx_pool_ref(u->partner);
	u->keepalive = p->port ? 0 : p->keepalive;
	u->keepalive_ns = (uint64_t)p->keepalive_ms * 1000000;
	u->timer = evtimer_new(p->base, on_timer, u);
	if (!u->timer)
		goto fail;
	u->conn = p->port ? NULL : idle_take(p->inst);
	if (!u->conn) {
		fresh = true;
		u->conn = evhttp_connection_base_new(p->base, NULL,
						     p->inst->host, port);
		if (!u->conn)
			goto fail;
	}
	u->connect_timeout_ms = p->connect_timeout_ms;
	if (p->hand_off &&
	    !(u->out_watch = evbuffer_add_cb(conn_output(u->conn), on_output,
					     u)))
		goto fail;
	/* a reused connection still has the last leg's settings */
	evhttp_connection_set_timeout(u->conn, (int)p->idle_timeout_s);
	/* evhttp counts a streamed body too: bound only what is collected */
	evhttp_connection_set_max_body_size(
	    u->conn, p->stream_body ? -1 : (ev_ssize_t)p->max_body);
	u->req = evhttp_request_new(on_done, u);
	if (!u->req)
		goto fail;
	evhttp_request_set_header_cb(u->req, on_header);
	evhttp_request_set_error_cb(u->req, on_error);
	if (p->stream_body)
		evhttp_request_set_chunked_cb(u->req, on_chunk);
	h = evhttp_request_get_output_headers(u->req);
	snprintf(hostport, sizeof(hostport), "%s:%u", p->inst->host, port);
	evhttp_add_header(h, "Host", hostport);
	if (p->request_id)
		evhttp_add_header(h, "X-Request-Id", p->request_id);
	if (p->authorization) /* engines started with an API key want it */
		evhttp_add_header(h, "Authorization", p->authorization);
	if (p->body) {
		evhttp_add_header(h, "Content-Type", "application/json");
		evbuffer_add(evhttp_request_get_output_buffer(u->req), p->body,
			     p->body_len);
	}
	/* from here the connection owns the request */
	u->starting = true;
	errno = 0; /* what the socket calls leave, on_error() */
	rc = evhttp_make_request(u->conn, u->req, p->method, p->path);
	u->starting = false;
	if (rc)
		goto fail;
	if (u->failed_early) {
		tv_ms(&tv, 0);
		evtimer_add(u->timer, &tv);
		*out = u;
		return 0;
	}
	if (fresh) /* the socket is made: once per connection */
		pdx_evhttp_nodelay(u->conn);
	first = p->first_byte_timeout_ms;
	u->connect_phase = true;
	if (p->connect_timeout_ms < first) {
		u->first_byte_left_ms = first - p->connect_timeout_ms;
		first = p->connect_timeout_ms;
	}
	tv_ms(&tv, first);
	evtimer_add(u->timer, &tv);
	*out = u;
	return 0;
fail:
	leg_free(u);
	return -1;
}

struct pdx_inst *pdx_upstream_failed(const struct pdx_upstream *u)
{
	return u->peer_failed && u->partner ? u->partner : u->inst;
}

bool pdx_upstream_out_of_fds(const struct pdx_upstream *u)
{
	return u->no_fds;
}

struct pdx_inst *pdx_upstream_both(const struct pdx_upstream *u)
{
	return u->both_failed ? u->partner : NULL;
}

struct pdx_inst *pdx_upstream_inst(const struct pdx_upstream *u)
{
	return u->inst;
}

void pdx_upstream_cancel(struct pdx_upstream *u)
{
	struct timeval tv;

	if (!u)
		return;
	if (!u->out_watch || u->ended || u->failed_early ||
	    request_written(u) || u->set->handed_off >= HAND_OFF_MAX) {
		leg_free(u);
		return;
	}
	log_debug("%s instance %s: a leg cancelled before its request was "
		  "written writes it, then closes",
		  pdx_pool_role_name(u->inst->role), u->inst->url);
	u->handed_off = true;
	u->set->handed_off++;
	u->reuse = false;
	tv_ms(&tv, u->connect_timeout_ms);
	evtimer_add(u->timer, &tv);
}

void pdx_upstreams_clear(struct pdx_upstreams *set)
{
	while (!LIST_EMPTY(&set->legs)) {
		struct pdx_upstream *u = LIST_FIRST(&set->legs);

		u->reuse = false; /* exiting */
		leg_free(u);
	}
}
