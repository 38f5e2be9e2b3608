/* Active health checks (see health.h). */
#define PDX_LOG_TOPIC "health"
#include "proxy/health.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "proxy/inst_host.h"
#include "proxy/pool.h"

/* One instance's check: a reference on it, and its connection. */
struct pdx_probe {
	LIST_ENTRY(pdx_probe) link;
	struct pdx_health *h;
	struct pdx_inst *inst;
	struct evhttp_connection *conn;
	bool busy;     /* a check in flight */
	uint64_t sent_ns; /* when the last /health went */
	bool starting; /* inside evhttp_make_request() */
	bool timed_out; /* the check in flight hit --health-timeout */
};

static void probe_free(struct pdx_probe *pr)
{
	LIST_REMOVE(pr, link);
	if (pr->conn) /* frees a check in flight, without its callback */
		evhttp_connection_free(pr->conn);
	pr->inst->probe = NULL;
	pdx_pool_unref(pr->inst);
	free(pr);
}

/* Why a check failed, for the log: the status and the error JSON's
 * message (pdx-engine says why it is not ready, e.g. its agent is away). */
static void failure_reason(const struct pdx_probe *pr,
			   struct evhttp_request *req, int status, int e,
			   char *out, size_t len)
{
	struct evbuffer *b = req ? evhttp_request_get_input_buffer(req) : NULL;
	size_t n = b ? evbuffer_get_length(b) : 0;
	const char *msg = NULL;
	json_t *j = NULL;

	if (!status) {
		/* a dead instance (nothing listens: refused at once) is not
		 * a hung one; evhttp gives a failed connect no error
		 * callback, only the socket's errno */
		/* a connect still under way when the timeout cut it (SYNs
		 * dropped: a host gone from the network, a firewall) leaves
		 * EINPROGRESS: hung, not refused */
		/* a name that does not resolve leaves EAGAIN or nothing,
		 * at once: it was said "no answer in time" */
		if (!pr->timed_out && pdx_conn_failure(pr->conn, e, out, len))
			return;
		if (pr->timed_out || !e || e == ETIMEDOUT || e == EINPROGRESS ||
		    e == EALREADY || e == EAGAIN || e == EWOULDBLOCK ||
		    e == EINTR)
			snprintf(out, len, "no answer in time");
		else
			snprintf(out, len, "cannot connect: %s", strerror(e));
		return;
	}
	if (n && n < 4096)
		j = json_loadb((const char *)evbuffer_pullup(b, -1), n, 0, NULL);
	msg = json_string_value(
	    json_object_get(json_object_get(j, "error"), "message"));
	snprintf(out, len, "%d%s%.200s", status, msg ? ": " : "",
		 msg ? msg : "");
	json_decref(j);
}

/* pdx-engine's X-PDX-Agent names its agents where they are now (rank
 * order, commas). When it no longer names those /v1/pdx/info gave (an
 * agent started again on another address), the instance is asked again
 * before its next request: else the other side is sent to the dead
 * address and waits for it until its agent gives up (handshake or peer
 * timeout), and a prefill instance keeps the KV nobody claims for a
 * lease. */
static void check_agent(struct pdx_inst *i, struct evhttp_request *req)
{
	const char *now = evhttp_find_header(
	    evhttp_request_get_input_headers(req), "X-PDX-Agent");
	const char *v = now;
	unsigned n = i->tp > 1 ? i->tp : 1;

	if (!now || !i->peer_known)
		return;
	for (unsigned r = 0; r < n; r++) {
		const char *known = r ? i->peers[r] : i->peer;
		size_t len = strlen(known);

		if (strncmp(v, known, len) || (v[len] && v[len] != ','))
			goto moved;
		v += len + (v[len] == ',');
	}
	if (!*v)
		return;
moved:
	log_info("%s instance %s: its agent is at %s now (was %s): asked "
		 "again before its next request",
		 pdx_pool_role_name(i->role), i->url, now, i->peer);
	i->peer_known = false;
}

/* pdx-engine's X-PDX-Engine-Id changed: the engine was started again on
 * its address between two checks (with another --model, say), and what
 * was learnt of it is asked again: its models now, its role and agents
 * before its next request. Else a proxy kept sending a model's requests
 * to an engine that served another, and listed that model in
 * /v1/models for good; and an instance moved out of the picks for its
 * role (misplaced) stayed out once mended. */
static void check_engine_id(struct pdx_inst *i, struct evhttp_request *req)
{
	const char *id = evhttp_find_header(
	    evhttp_request_get_input_headers(req), "X-PDX-Engine-Id");

	if (!id) /* none: an engine that says none (vLLM), now or ever */
		id = "";
	/* as kept: a longer one is cut to it, and read as the same */
	if (!strncmp(id, i->engine_id, sizeof(i->engine_id) - 1))
		return;
	if (i->engine_id[0]) {
		log_info("%s instance %s: its engine started again (engine "
			 "id %s, was %s): its models, role and agents are "
			 "asked again",
			 pdx_pool_role_name(i->role), i->url,
			 id[0] ? id : "none", i->engine_id);
		i->models.known = false;
		i->peer_known = false;
		i->misplaced = false;
	}
	snprintf(i->engine_id, sizeof(i->engine_id), "%s", id);
}

static void probe_get(struct pdx_probe *pr, const char *path,
		      void (*done)(struct evhttp_request *, void *));

/* GET /v1/models answered: the names it serves. An engine without the
 * route (404, 405) takes any; no answer, or any other (401: a vLLM with
 * --api-key; a 503 while it loads) leaves them unknown, asked again
 * after the next passed check (kept as "any", an instance of another
 * model behind an API key took every request again). */
static void on_models(struct evhttp_request *req, void *arg)
{
	struct pdx_probe *pr = arg;
	struct pdx_inst *i = pr->inst;
	int status = req ? evhttp_request_get_response_code(req) : 0;
	struct evbuffer *b = req ? evhttp_request_get_input_buffer(req) : NULL;
	char list[256];
	size_t at = 0;

	pr->busy = false;
	if (status == 200)
		pdx_served_models_read(&i->models,
				       (const char *)evbuffer_pullup(b, -1),
				       evbuffer_get_length(b));
	else if (status == 404 || status == 405)
		pdx_served_models_set_any(&i->models);
	else {
		if (status && status != i->models.refused)
			log_warn("%s instance %s: GET /v1/models answered %d "
				 "(an API key it wants?): its models stay "
				 "unknown, and it may be given any model's "
				 "requests",
				 pdx_pool_role_name(i->role), i->url, status);
		i->models.refused = status;
		return;
	}
	list[0] = '\0';
	for (unsigned k = 0; k < i->models.n && at < sizeof(list); k++)
		at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%s",
				       k ? ", " : "", i->models.name[k]);
	log_info("%s instance %s serves %s", pdx_pool_role_name(i->role),
		 i->url,
		 i->models.any ? "any model it is asked for (GET /v1/models "
				 "told no list to keep)"
			       : list);
}

/* A check that could not start for want of a descriptor here says
 * nothing of its instance: not counted. Under a flood of client
 * connections the proxy judged every instance unhealthy, and answered
 * 503 for a while after the flood had passed. */
static bool out_of_descriptors(struct pdx_probe *pr, int status, int e)
{
	static uint64_t said_ns;

	if (status || !pr->starting || (e != EMFILE && e != ENFILE))
		return false;
	if (pdx_once_a_second(&said_ns))
		log_warn("health checks not counted: this proxy is out of file "
			 "descriptors (ulimit -n), not its instances");
	return true;
}

/* A check ended: req NULL or a status other than 200 is a failure. It
 * may run inside evhttp_make_request() (no socket), so it only counts.
 * A passed one asks for the instance's models while they are unknown
 * (at first, and after a failed one), on the same connection (evhttp
 * connects it again). */
static void on_done(struct evhttp_request *req, void *arg)
{
	struct pdx_probe *pr = arg;
	struct pdx_inst *i = pr->inst;
	int e = errno; /* evhttp keeps the socket's error for us */
	int status = req ? evhttp_request_get_response_code(req) : 0;
	bool ok = status == 200;
	char why[256];

	pr->busy = false;
	if (out_of_descriptors(pr, status, e))
		return;
	if (ok) {
		check_agent(i, req);
		check_engine_id(i, req);
	}
	if (!ok) { /* restarting, maybe with another model or role */
		i->models.known = false;
		i->misplaced = false;
	} else if (!i->models.known)
		probe_get(pr, "/v1/models", on_models);
	if (pdx_breaker_checked(&i->breaker, ok, pr->sent_ns, pdx_now_ns()))
		log_info("%s instance %s failed a health check and then "
			 "passed one while its circuit breaker was open: one "
			 "trial request may go now",
			 pdx_pool_role_name(i->role), i->url);
	if (!pdx_pool_health(i, ok, pr->h->down_after, pr->h->up_after))
		return;
	if (i->unhealthy) {
		failure_reason(pr, req, status, e, why, sizeof(why));
		log_warn("%s instance %s unhealthy: %u health checks failed in "
			 "a row (last: %s); it gets no new requests",
			 pdx_pool_role_name(i->role), i->url, i->health_fails,
			 why);
	} else {
		log_info("%s instance %s healthy again after %u checks; "
			 "re-admitted",
			 pdx_pool_role_name(i->role), i->url, i->health_oks);
	}
}

/* A check's request failed after its connect (evhttp calls this
 * before its done callback). */
static void on_probe_error(enum evhttp_request_error err, void *arg)
{
	struct pdx_probe *pr = arg;

	pr->timed_out = err == EVREQ_HTTP_TIMEOUT;
}

/* One GET of a check on the probe's connection, made when needed. */
static void probe_get(struct pdx_probe *pr, const char *path,
		      void (*done)(struct evhttp_request *, void *))
{
	struct pdx_inst *i = pr->inst;
	struct evhttp_request *req;
	struct timeval tv = {pr->h->timeout_ms / 1000,
			     (pr->h->timeout_ms % 1000) * 1000};
	char host[PDX_POOL_ADDR_MAX + 8];

	if (!pr->conn) {
		pr->conn = evhttp_connection_base_new(pr->h->base, NULL,
						      i->host, i->port);
		if (!pr->conn)
			return;
		/* bounds the connect and each read and write */
		evhttp_connection_set_timeout_tv(pr->conn, &tv);
	}
	req = evhttp_request_new(done, pr);
	if (!req)
		return;
	pr->timed_out = false;
	evhttp_request_set_error_cb(req, on_probe_error);
	snprintf(host, sizeof(host), "%s:%u", i->host, i->port);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Host", host);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Connection",
			  "close");
	pr->busy = pr->starting = true;
	errno = 0; /* what the socket calls leave, out_of_descriptors() */
	if (evhttp_make_request(pr->conn, req, EVHTTP_REQ_GET, path) &&
	    pr->busy)
		done(NULL, pr); /* failed without telling */
	pr->starting = false;
}

static void round_pool(struct pdx_health *h, struct pdx_pool *p)
{
	for (unsigned k = 0; k < p->n; k++) {
		struct pdx_inst *i = p->inst[k];
		struct pdx_probe *pr = i->probe;

		if (!pr) {
			pr = calloc(1, sizeof(*pr));
			if (!pr)
				continue;
			pr->h = h;
			pr->inst = i;
			pdx_pool_ref(i);
			i->probe = pr;
			LIST_INSERT_HEAD(&h->probes, pr, link);
		}
		if (pr->busy) /* still within its timeout */
			continue;
		pr->sent_ns = pdx_now_ns();
		probe_get(pr, "/health", on_done);
	}
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_health *h = arg;
	struct pdx_probe *pr, *next;

	/* instances removed from their pool: no more checks */
	for (pr = LIST_FIRST(&h->probes); pr; pr = next) {
		next = LIST_NEXT(pr, link);
		if (pr->inst->removed)
			probe_free(pr);
	}
	round_pool(h, &h->pools[0]);
	round_pool(h, &h->pools[1]);
}

int pdx_health_start(struct pdx_health *h, struct event_base *base,
		     struct pdx_pool *pools, unsigned interval_ms,
		     unsigned timeout_ms, unsigned down_after,
		     unsigned up_after)
{
	struct timeval tv = {interval_ms / 1000, (interval_ms % 1000) * 1000};

	h->base = base;
	h->pools = pools;
	h->timeout_ms = timeout_ms;
	h->down_after = down_after;
	h->up_after = up_after;
	LIST_INIT(&h->probes);
	h->tick = event_new(base, -1, EV_PERSIST, on_tick, h);
	if (!h->tick || event_add(h->tick, &tv))
		return -1;
	return 0;
}

void pdx_health_stop(struct pdx_health *h)
{
	if (!h->tick)
		return;
	while (!LIST_EMPTY(&h->probes))
		probe_free(LIST_FIRST(&h->probes));
	event_free(h->tick);
	h->tick = NULL;
}
