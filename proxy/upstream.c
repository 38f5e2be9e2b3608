/* One HTTP leg to an engine (see upstream.h). Each leg has its own
 * connection, freed by evhttp when the leg ends (free_on_completion), so
 * cancelling a leg closes its socket and the engine aborts the request.
 *
 * evhttp (2.1) has one timeout for every read and write; it is used as
 * the idle timeout between reads. The connect and first-byte deadlines
 * are one timer of ours: at the connect deadline the socket must have a
 * peer, at the first-byte deadline the response head must have come.
 *
 * A leg's connection is freed by us, never by evhttp: at once when the
 * leg is cancelled or times out (no request callback runs then), and from
 * the timer, right after the loop has left evhttp's callbacks, when the
 * response ended. */
#define PDX_LOG_TOPIC "upstream"
#include "proxy/upstream.h"

#include <errno.h>
#include <event2/bufferevent.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/nodelay.h"
#include "proxy/pool.h"

struct pdx_upstream {
	LIST_ENTRY(pdx_upstream) link;
	struct pdx_upstream_cbs cbs;
	struct pdx_inst *inst;
	struct evhttp_connection *conn;
	struct evhttp_request *req;
	struct event *timer;
	unsigned first_byte_left_ms; /* after the connect deadline */
	int err_status;		     /* 502 or 504, from the error callback */
	char why[96];
	bool connect_phase;
	bool ended; /* the timer now frees the leg */
};

static void tv_ms(struct timeval *tv, unsigned ms)
{
	tv->tv_sec = ms / 1000;
	tv->tv_usec = (ms % 1000) * 1000;
}

/* Frees the connection (and a request still on it, without callbacks). */
static void leg_free(struct pdx_upstream *u)
{
	if (u->conn)
		evhttp_connection_free(u->conn);
	if (u->timer)
		event_free(u->timer);
	LIST_REMOVE(u, link);
	free(u);
}

/* The response ended inside evhttp's callbacks: free soon, outside. */
static void leg_end_later(struct pdx_upstream *u)
{
	struct timeval now = {0, 0};

	u->ended = true;
	evtimer_add(u->timer, &now);
}

static void leg_fail(struct pdx_upstream *u, int err_status, const char *why)
{
	u->cbs.on_end(u, 0, NULL, err_status, why, u->cbs.arg);
	leg_free(u);
}

static bool leg_connected(struct pdx_upstream *u)
{
	struct bufferevent *bev = evhttp_connection_get_bufferevent(u->conn);
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;

	return fd >= 0 && getpeername(fd, (struct sockaddr *)&ss, &len) == 0;
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_upstream *u = arg;
	struct timeval tv;
	char why[96];

	if (u->ended) {
		leg_free(u);
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
	u->inst->failures++;
	log_warn("%s", why);
	leg_fail(u, 504, why);
}

static int on_header(struct evhttp_request *req, void *arg)
{
	struct pdx_upstream *u = arg;

	evtimer_del(u->timer);
	if (u->cbs.on_head)
		u->cbs.on_head(u, evhttp_request_get_response_code(req),
			       evhttp_request_get_input_headers(req),
			       u->cbs.arg);
	return 0;
}

static void on_chunk(struct evhttp_request *req, void *arg)
{
	struct pdx_upstream *u = arg;

	u->cbs.on_chunk(u, evhttp_request_get_input_buffer(req), u->cbs.arg);
}

static void on_error(enum evhttp_request_error err, void *arg)
{
	struct pdx_upstream *u = arg;
	const char *what = "connection failed";

	u->err_status = 502;
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

static void on_done(struct evhttp_request *req, void *arg)
{
	struct pdx_upstream *u = arg;
	int status = req ? evhttp_request_get_response_code(req) : 0;

	evtimer_del(u->timer);
	if (status == 0) {
		if (!u->err_status) {
			u->err_status = 502;
			snprintf(u->why, sizeof(u->why),
				 "%s instance %s: no response",
				 pdx_pool_role_name(u->inst->role),
				 u->inst->url);
		}
		u->inst->failures++;
		log_warn("%s", u->why);
		u->cbs.on_end(u, 0, NULL, u->err_status, u->why, u->cbs.arg);
	} else {
		u->cbs.on_end(u, status, evhttp_request_get_input_buffer(req),
			      0, NULL, u->cbs.arg);
	}
	leg_end_later(u);
}

int pdx_upstream_start(const struct pdx_upstream_params *p,
		       const struct pdx_upstream_cbs *cbs,
		       struct pdx_upstream **out)
{
	struct pdx_upstream *u = calloc(1, sizeof(*u));
	struct evkeyvalq *h;
	struct timeval tv;
	unsigned first;
	char hostport[PDX_POOL_ADDR_MAX + 8];

	if (!u)
		return -1;
	LIST_INSERT_HEAD(&p->set->legs, u, link);
	u->cbs = *cbs;
	u->inst = p->inst;
	u->timer = evtimer_new(p->base, on_timer, u);
	u->conn = evhttp_connection_base_new(p->base, NULL, p->inst->host,
					     p->inst->port);
	if (!u->timer || !u->conn)
		goto fail;
	evhttp_connection_set_timeout(u->conn, (int)p->idle_timeout_s);
	/* evhttp counts a streamed body too: bound only what is collected */
	if (!p->stream_body)
		evhttp_connection_set_max_body_size(u->conn,
						    (ev_ssize_t)p->max_body);
	u->req = evhttp_request_new(on_done, u);
	if (!u->req)
		goto fail;
	evhttp_request_set_header_cb(u->req, on_header);
	evhttp_request_set_error_cb(u->req, on_error);
	if (p->stream_body)
		evhttp_request_set_chunked_cb(u->req, on_chunk);
	h = evhttp_request_get_output_headers(u->req);
	snprintf(hostport, sizeof(hostport), "%s:%u", p->inst->host,
		 p->inst->port);
	evhttp_add_header(h, "Host", hostport);
	if (p->request_id)
		evhttp_add_header(h, "X-Request-Id", p->request_id);
	if (p->body) {
		evhttp_add_header(h, "Content-Type", "application/json");
		evbuffer_add(evhttp_request_get_output_buffer(u->req), p->body,
			     p->body_len);
	}
	/* from here the connection owns the request */
	if (evhttp_make_request(u->conn, u->req, p->method, p->path))
		goto fail;
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

void pdx_upstream_cancel(struct pdx_upstream *u)
{
	if (u)
		leg_free(u);
}

void pdx_upstreams_clear(struct pdx_upstreams *set)
{
	while (!LIST_EMPTY(&set->legs))
		leg_free(LIST_FIRST(&set->legs));
}
