/* Client calls and the relay of an engine's response (see call.h). */
#define PDX_LOG_TOPIC "call"
#include "proxy/call.h"

#include <event2/buffer.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/http_listen.h"
#include "common/log.h"

/* After draining, how long the loop runs on for the last replies. */
#define DRAIN_FLUSH_MS 100

/* Response headers of the engine's that the client gets too. */
static const char *const relay_headers[] = {"Content-Type", "Content-Length",
					    "Cache-Control"};

/* The reply is over: counted once, when it ends (a side leg that
 * finishes later does not stretch the request's duration). */
static void call_count(struct pdx_call *c)
{
	if (c->over)
		return;
	c->over = true;
	if (c->status >= 500)
		pdx_pool_relearn(c->pair[PDX_POOL_PREFILL],
				 c->pair[PDX_POOL_DECODE]);
	pdx_proxy_metrics_request(&c->px->metrics, c->status,
				  (double)(pdx_now_ns() - c->t0_ns) / 1e9);
}

const char *pdx_call_model(const struct pdx_call *c)
{
	const char *m = json_string_value(json_object_get(c->body, "model"));

	/* "" names none, as vLLM reads it: any instance serves it */
	return m && *m ? m : NULL;
}

void pdx_call_unpair(struct pdx_call *c, enum pdx_pool_role r)
{
	if (c->pair[r])
		pdx_pool_unref(c->pair[r]);
	c->pair[r] = NULL;
}

static void pair_drop(struct pdx_call *c)
{
	pdx_call_unpair(c, PDX_POOL_PREFILL);
	pdx_call_unpair(c, PDX_POOL_DECODE);
}

void pdx_call_grace_free(struct pdx_call_grace *g)
{
	if (!g)
		return;
	if (g->ev)
		event_free(g->ev);
	if (g->failed)
		pdx_pool_unref(g->failed);
	if (g->body)
		evbuffer_free(g->body);
	free(g);
}

static void call_free(struct pdx_call *c)
{
	struct pdx_proxy *px = c->px;

	call_count(c);
	LIST_REMOVE(c, link);
	px->ncalls--;
	pdx_client_watch_free(c->watch);
	json_decref(c->body);
	pdx_upstream_cancel(c->leg);
	pdx_upstream_cancel(c->side);
	pdx_call_grace_free(c->grace);
	pdx_pool_put(c->inst);
	pdx_pool_put(c->side_inst);
	pdx_pool_put(c->decode);
	pdx_pool_put(c->prefill);
	pair_drop(c);
	for (int r = 0; r < 2; r++)
		if (c->avoid[r])
			pdx_pool_unref(c->avoid[r]);
	for (size_t i = 0; i < sizeof(c->head) / sizeof(*c->head); i++)
		free(c->head[i]);
	free(c->d_timing);
	free(c->p_timing);
	free(c);
	/* draining (SIGTERM): the last request is done. evhttp writes its
	 * reply's last bytes on a later loop turn, so the loop ends a moment
	 * after, not at once (which would cut them off). */
	if (px->draining && !px->ncalls)
		event_base_loopexit(px->base,
				    &(struct timeval){0, DRAIN_FLUSH_MS * 1000});
}

void pdx_call_reset(struct pdx_call *c)
{
	pdx_upstream_cancel(c->leg);
	pdx_upstream_cancel(c->side);
	c->leg = c->side = NULL;
	pdx_call_grace_free(c->grace);
	c->grace = NULL;
	pdx_pool_put(c->inst);
	pdx_pool_put(c->side_inst);
	pdx_pool_put(c->decode);
	pdx_pool_put(c->prefill);
	c->inst = c->side_inst = c->decode = c->prefill = NULL;
	pair_drop(c);
	for (size_t i = 0; i < sizeof(c->head) / sizeof(*c->head); i++) {
		free(c->head[i]);
		c->head[i] = NULL;
	}
	free(c->d_timing);
	free(c->p_timing);
	c->d_timing = c->p_timing = NULL;
	c->head_status = 0;
	c->awaiting_callback = false;
	c->discard = false;
}

struct pdx_inst *pdx_call_blamed(const struct pdx_call *c,
				 const struct pdx_upstream *u)
{
	struct pdx_inst *f = pdx_upstream_failed(u);
	struct pdx_inst *other = pdx_upstream_both(u);
	const char *model = pdx_call_model(c);

	if (other &&
	    !pdx_pool_has_usable(&c->px->pool[f->role], f, model, true) &&
	    pdx_pool_has_usable(&c->px->pool[other->role], other, model,
				true))
		return other;
	return f;
}

bool pdx_call_may_retry(const struct pdx_call *c,
			const struct pdx_inst *failed, int status)
{
	return c->retry && (!status || status >= 500) && !c->replying &&
	       c->retries < c->px->o->retries &&
	       pdx_pool_has_usable(&c->px->pool[failed->role], failed,
				   pdx_call_model(c), true);
}

/* Lets go of the connection before the last reply, which may close it
 * (and would then call on_close for a call already over). */
static void call_detach(struct pdx_call *c)
{
	evhttp_connection_set_closecb(c->conn, NULL, NULL);
	pdx_client_watch_free(c->watch);
	c->watch = NULL;
}

/* The client's connection is being freed: the client left (or the proxy
 * is shutting down). When evhttp found the client gone while writing a
 * stream it has already let go of the request, which is then ours.
 * Its legs are cancelled, so its transfer stops counting in any load
 * now, as a cancelled prefill leg's does (side_cancel()): an engine that
 * got its leg aborts it, and one the leg never reached (the client left
 * while it was being sent) never announces it, so no agent would report
 * it and it counted in both instances until --transfer-timeout. */
static void on_close(struct evhttp_connection *conn, void *arg)
{
	struct pdx_call *c = arg;

	log_info("%s: client left, cancelling", c->req_id);
	if (!evhttp_request_get_connection(c->req))
		evhttp_request_free(c->req);
	c->px->metrics.aborted++;
	c->status = 499; /* nginx's "client closed request" */
	pdx_transfers_forget(&c->px->xfers, c->xfer_id);
	call_free(c);
}

static void req_id_mint(char *out)
{
	static uint64_t seq, pid;
	uint64_t a;

	if (!pid)
		pid = (uint64_t)getpid();
	a = pdx_now_ns() ^ (pid << 40);

	snprintf(out, PDX_REQ_ID_MAX + 1, "%016llx%016llx",
		 (unsigned long long)a, (unsigned long long)++seq);
}

struct pdx_call *pdx_call_new(struct pdx_proxy *px, struct evhttp_request *req)
{
	const char *id = evhttp_find_header(
	    evhttp_request_get_input_headers(req), "X-Request-Id");
	struct pdx_call *c;

	/* 503: this proxy will not serve it (look for another); 429: it
	 * is full now (try again soon) */
	if (px->draining) {
		pdx_proxy_metrics_request(&px->metrics, 503, 0);
		evhttp_add_header(evhttp_request_get_output_headers(req),
				  "Connection", "close");
		pdx_http_send_error(req, 503, "service_unavailable",
				     "the proxy is shutting down");
		return NULL;
	}
	if (px->ncalls >= px->o->max_inflight) {
		pdx_proxy_metrics_request(&px->metrics, 429, 0);
		evhttp_add_header(evhttp_request_get_output_headers(req),
				  "Retry-After", "1");
		pdx_http_send_error(req, 429, "server_busy",
				     "too many requests in flight");
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		evhttp_send_error(req, 500, "out of memory");
		return NULL;
	}
	c->px = px;
	c->req = req;
	c->conn = evhttp_request_get_connection(req);
	c->t0_ns = pdx_now_ns();
	if (id && pdx_req_id_usable(id))
		snprintf(c->req_id, sizeof(c->req_id), "%s", id);
	else
		req_id_mint(c->req_id);
	LIST_INSERT_HEAD(&px->calls, c, link);
	px->ncalls++;
	log_debug("%s: arrived", c->req_id);
	evhttp_add_header(evhttp_request_get_output_headers(req),
			  "X-Request-Id", c->req_id);
	c->watch = pdx_client_watch_new(px->base, c->conn);
	if (!c->watch) {
		c->status = 500;
		evhttp_send_error(req, 500, "out of memory");
		call_free(c);
		return NULL;
	}
	evhttp_connection_set_closecb(c->conn, on_close, c);
	return c;
}

/* A request answered 5xx is said at warn, at most once a second, with
 * how many more since: in a deployment whose every request failed (an
 * agent's data ports firewalled, a handshake unanswered) the proxy's
 * log, where an operator looks first, said nothing (a new user's find). */
void pdx_call_say_failed(const struct pdx_call *c, int status,
			 const char *what, const char *url)
{
	static struct pdx_said said;
	unsigned unsaid;

	if (status < 500 || !pdx_said_now(&said, &unsaid))
		return;
	if (unsaid)
		log_warn("%s: answered %d: %s%s (and %u more failed since the "
			 "last said)",
			 c->req_id, status, what, url, unsaid);
	else
		log_warn("%s: answered %d: %s%s", c->req_id, status, what, url);
}

void pdx_call_reply_error(struct pdx_call *c, int status, const char *type,
			  const char *msg)
{
	pdx_call_say_failed(c, status, msg, "");
	c->status = status;
	call_detach(c);
	pdx_http_send_error(c->req, status, type, msg);
	call_free(c);
}

void pdx_call_reply_leg_error(struct pdx_call *c, int err_status,
			      const char *why)
{
	pdx_call_reply_error(c, err_status,
			     err_status == 503 ? "service_unavailable"
					       : "upstream_error",
			     why);
}

void pdx_call_reply_no_instance(struct pdx_call *c, enum pdx_pool_role role)
{
	const struct pdx_pool *p = &c->px->pool[role];
	const char *model = pdx_call_model(c);
	unsigned misplaced = 0;
	char msg[320];

	for (unsigned k = 0; k < p->n; k++)
		misplaced += p->inst[k]->misplaced;
	if (model && pdx_pool_has_usable(p, c->avoid[role], NULL, true) &&
	    !pdx_pool_has_usable(p, c->avoid[role], model, false))
		snprintf(msg, sizeof(msg),
			 "no usable %s instance serves model %.100s (those "
			 "usable serve others: GET /admin/instances)",
			 pdx_pool_role_name(role), model);
	else if (misplaced)
		/* the 502 that said what to fix came once: say it on */
		snprintf(msg, sizeof(msg),
			 "no usable %s instance: of all %u, %u in the wrong "
			 "pool by their /v1/pdx/info (another role, or no "
			 "agent: are --prefill and --decode swapped? GET "
			 "/admin/instances says \"misplaced\"), the others "
			 "unhealthy or with their circuit breaker open",
			 pdx_pool_role_name(role), p->n, misplaced);
	else if (p->n)
		snprintf(msg, sizeof(msg),
			 "no usable %s instance: all %u unhealthy or with "
			 "their circuit breaker open",
			 pdx_pool_role_name(role), p->n);
	else
		snprintf(msg, sizeof(msg), "no %s instance in the pool",
			 pdx_pool_role_name(role));
	pdx_call_reply_error(c, 503, "service_unavailable", msg);
}

void pdx_call_reply(struct pdx_call *c, int status, struct evbuffer *body)
{
	c->status = status;
	call_detach(c);
	evhttp_add_header(evhttp_request_get_output_headers(c->req),
			  "Content-Type", "application/json");
	evhttp_send_reply(c->req, status, NULL, body);
	call_free(c);
}

/* Cancels the side leg: its engine sees its client go, aborts, and
 * frees the request's KV (its transfer no longer counts in any load). */
static void side_cancel(struct pdx_call *c)
{
	pdx_upstream_cancel(c->side);
	c->side = NULL;
	pdx_pool_put(c->side_inst);
	c->side_inst = NULL;
	pdx_transfers_forget(&c->px->xfers, c->xfer_id);
}

static void relay_head(struct pdx_upstream *u, int status, struct evkeyvalq *in,
		       void *arg)
{
	struct pdx_call *c = arg;
	const char *v;

	/* a 502 that blames the other side (X-PDX-Failed-Side: peer, or
	 * both with no other decode instance) is retried as relay_end will
	 * retry it: in the blamed one's pool, which is P's, not D's */
	if (status >= 500 &&
	    pdx_call_may_retry(c, pdx_call_blamed(c, u), status)) {
		c->discard = true; /* its body is dropped; relay_end retries */
		c->head_status = status;
		return;
	}
	/* D refused the request (a client's mistake, or no room): the
	 * prefill beside it serves nothing, and would hold its KV for a
	 * transfer nobody takes until a lease ran out. Its transfer stops
	 * counting now, also when the prefill leg had answered already
	 * (D's agent never hears of it: it counted until it expired). */
	if (status >= 400 && c->side) {
		log_info("%s: decode instance answered %d; prefill leg "
			 "cancelled",
			 c->req_id, status);
		side_cancel(c);
	} else if (status >= 400) {
		pdx_transfers_forget(&c->px->xfers, c->xfer_id);
	}
	for (size_t i = 0; i < sizeof(relay_headers) / sizeof(*relay_headers);
	     i++) {
		v = evhttp_find_header(in, relay_headers[i]);

		free(c->head[i]);
		c->head[i] = v ? strdup(v) : NULL;
	}
	c->head_status = status;
	v = evhttp_find_header(in, "Server-Timing");
	if (status == 200 && v && !c->d_timing) {
		c->d_timing = strdup(v);
		pdx_proxy_metrics_timing(&c->px->metrics, v, false);
	}
}

/* A prefill leg's head: its engine's Server-Timing. */
static void prefill_head(struct pdx_upstream *u, int status,
			 struct evkeyvalq *in, void *arg)
{
	struct pdx_call *c = arg;
	const char *v = evhttp_find_header(in, "Server-Timing");

	if (status != 200 || !v || c->p_timing)
		return;
	c->p_timing = strdup(v);
	pdx_proxy_metrics_timing(&c->px->metrics, v, true);
}

/* The client's Server-Timing: D's entries, P's as p_NAME, and the
 * proxy's own first byte (proxy;dur=MS from the request's arrival). */
static void timing_header(struct pdx_call *c, struct evkeyvalq *out)
{
	double ms = (pdx_now_ns() - c->t0_ns) / 1e6;
	struct evbuffer *b = evbuffer_new();
	const char *p = c->p_timing;

	pdx_proxy_metrics_phase(&c->px->metrics, PDX_PHASE_FIRST_TOKEN,
				ms / 1e3);
	if (!b)
		return;
	if (c->d_timing)
		evbuffer_add_printf(b, "%s, ", c->d_timing);
	while (p && *p) { /* "a;dur=1, b;dur=2" -> "p_a;dur=1, p_b;dur=2" */
		size_t n;

		p += strspn(p, " ,");
		n = strcspn(p, ",");
		if (n)
			evbuffer_add_printf(b, "p_%.*s, ", (int)n, p);
		p += n;
	}
	evbuffer_add_printf(b, "proxy;dur=%.3f", ms);
	evbuffer_add(b, "", 1);
	evhttp_add_header(out, "Server-Timing",
			  (const char *)evbuffer_pullup(b, -1));
	evbuffer_free(b);
}

/* The relayed response's head goes out with its first body bytes. */
static void relay_start(struct pdx_call *c)
{
	struct evkeyvalq *out = evhttp_request_get_output_headers(c->req);

	for (size_t i = 0; i < sizeof(relay_headers) / sizeof(*relay_headers);
	     i++)
		if (c->head[i])
			evhttp_add_header(out, relay_headers[i], c->head[i]);
	timing_header(c, out);
	log_debug("%s: relaying from %s", c->req_id, c->inst->url);
	pdx_call_say_failed(c, c->head_status,
		   c->inst->role == PDX_POOL_PREFILL
		       ? "relayed from prefill instance "
		       : "relayed from decode instance ",
		   c->inst->url);
	c->status = c->head_status;
	c->replying = true;
	pdx_http_reply_start(c->req, c->head_status, NULL);
}

static void relay_chunk(struct pdx_upstream *u, struct evbuffer *data,
			void *arg)
{
	struct pdx_call *c = arg;

	if (c->discard) {
		evbuffer_drain(data, evbuffer_get_length(data));
		return;
	}
	if (!c->replying)
		relay_start(c);
	evhttp_send_reply_chunk(c->req, data);
}

/* A relayed SSE stream that breaks off (the engine died, an idle
 * timeout) ends with an error event, OpenAI's error object, and no
 * "[DONE]": a client sees why it stopped, not a clean end that looks
 * complete. A body of another type just ends (its length tells). */
static void sse_error(struct pdx_call *c, const char *why, const char *type,
		      int code)
{
	struct evbuffer *b;
	json_t *o;
	char *s;

	if (!c->head[0] || strncmp(c->head[0], "text/event-stream", 17) != 0)
		return;
	o = json_pack("{s:{s:s+, s:s, s:n, s:i}}", "error", "message",
		      why ? why : "the engine's stream broke off",
		      "; stream cut short", "type", type, "param", "code",
		      code);
	s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	b = s ? evbuffer_new() : NULL;
	if (b) {
		evbuffer_add_printf(b, "data: %s\n\n", s);
		evhttp_send_reply_chunk(c->req, b);
		evbuffer_free(b);
	}
	free(s);
	json_decref(o);
}

static void relay_end(struct pdx_upstream *u, int status, struct evbuffer *body,
		      int err_status, const char *why, void *arg)
{
	struct pdx_call *c = arg;
	char msg[160];

	c->leg = NULL;
	if (c->discard || (!status && !c->replying)) {
		if (c->retry &&
		    c->retry(c, u, c->discard ? c->head_status : 0, why))
			return;
		if (c->discard) { /* no other instance left since its head */
			snprintf(msg, sizeof(msg), "%s instance %s answered %d",
				 pdx_pool_role_name(c->inst->role),
				 c->inst->url, c->head_status);
			why = msg;
			err_status = 502;
		}
		pdx_call_reply_leg_error(c, err_status, why);
		return;
	}
	if (!status) {
		log_warn("%s: %s; stream cut short", c->req_id, why);
		side_cancel(c);
		sse_error(c, why, "upstream_error", 502);
	}
	if (!c->replying)
		relay_start(c);
	call_detach(c);
	evhttp_send_reply_end(c->req);
	call_count(c);
	if (!c->side)
		call_free(c);
}

/* The other instance of the pair c picked, when inst is one of it. */
static struct pdx_inst *partner_of(const struct pdx_call *c,
				   const struct pdx_inst *inst)
{
	if (!inst)
		return NULL;
	return inst == c->pair[PDX_POOL_PREFILL]  ? c->pair[PDX_POOL_DECODE]
	       : inst == c->pair[PDX_POOL_DECODE] ? c->pair[PDX_POOL_PREFILL]
						  : NULL;
}

/* A leg of c with the proxy's timeouts and limits, its request id and
 * the client's Authorization. */
static struct pdx_upstream_params
leg_params(struct pdx_call *c, struct pdx_inst *inst,
	   enum evhttp_cmd_type method, const char *path, const void *body,
	   size_t len, bool stream)
{
	const struct pdx_proxy_opts *o = c->px->o;

	return (struct pdx_upstream_params){
	    .base = c->px->base,
	    .set = &c->px->legs,
	    .inst = inst,
	    .partner = partner_of(c, inst),
	    .method = method,
	    .path = path,
	    .request_id = c->req_id,
	    .authorization = evhttp_find_header(
		evhttp_request_get_input_headers(c->req), "Authorization"),
	    .body = body,
	    .body_len = len,
	    .stream_body = stream,
	    .connect_timeout_ms = o->connect_timeout_ms,
	    .first_byte_timeout_ms = o->first_byte_timeout_ms,
	    .idle_timeout_s = o->idle_timeout_s,
	    .max_body = o->max_body,
	    .keepalive = o->keepalive,
	    .keepalive_ms = o->keepalive_ms,
	};
}

/* A leg's body, the client's with the proxy's fields added (and written
 * anew by jansson), must stay within what the engines take
 * (common/http_error.h): else the client gets a 413 now, rather than an
 * engine refusing it or dropping the connection. false: replied. */
static bool body_fits(struct pdx_call *c, size_t len)
{
	size_t max = c->px->o->max_body + PDX_HTTP_BODY_HEADROOM;
	char msg[160];

	if (len <= max)
		return true;
	pdx_transfers_forget(&c->px->xfers, c->xfer_id);
	snprintf(msg, sizeof(msg),
		 "the request is %zu bytes once the proxy's fields are added, "
		 "over the engines' limit of %zu",
		 len, max);
	pdx_call_reply_error(c, 413, "invalid_request_error", msg);
	return false;
}

static int call_start(struct pdx_call *c, struct pdx_inst *inst,
		      enum pdx_pool_role role, uint16_t port,
		      enum evhttp_cmd_type method, const char *path,
		      const void *body, size_t len, bool stream, bool probe,
		      const struct pdx_upstream_cbs *cbs)
{
	struct pdx_upstream_cbs mine;
	struct pdx_upstream_params p =
	    leg_params(c, NULL, method, path, body, len, stream);

	if (!body_fits(c, len)) {
		pdx_pool_put(inst);
		return -1;
	}
	c->inst = inst ? inst
		       : pdx_pool_pick(&c->px->pool[role], 0, c->avoid[role],
				       pdx_call_model(c), true);
	if (!c->inst) {
		pdx_call_reply_no_instance(c, role);
		return -1;
	}
	p.inst = c->inst;
	p.partner = partner_of(c, c->inst);
	/* a decode leg of a transfer (see upstream.h) */
	p.hand_off = role == PDX_POOL_DECODE && p.partner && !probe;
	p.port = port;
	p.probe = probe;
	log_debug("%s: %s %s to %s", c->req_id, pdx_pool_role_name(role), path,
		  c->inst->url);
	mine = *cbs;
	if (!stream && role == PDX_POOL_PREFILL && !mine.on_head)
		mine.on_head = prefill_head; /* every flow's arg is the call */
	if (pdx_upstream_start(&p, &mine, &c->leg)) {
		pdx_call_reply_error(c, 500, "internal_error", "out of memory");
		return -1;
	}
	return 0;
}

void pdx_call_relay(struct pdx_call *c, struct pdx_inst *inst,
		    enum pdx_pool_role role, enum evhttp_cmd_type method,
		    const char *path, const void *body, size_t len)
{
	static const struct pdx_upstream_cbs relay = {.on_head = relay_head,
						      .on_chunk = relay_chunk,
						      .on_end = relay_end};
	struct pdx_upstream_cbs cbs = relay;

	cbs.arg = c;
	call_start(c, inst, role, 0, method, path, body, len, true, false,
		   &cbs);
}

int pdx_call_leg(struct pdx_call *c, struct pdx_inst *inst,
		 enum pdx_pool_role role, const char *path, const void *body,
		 size_t len, const struct pdx_upstream_cbs *cbs)
{
	return call_start(c, inst, role, 0,
			  body ? EVHTTP_REQ_POST : EVHTTP_REQ_GET, path, body,
			  len, false, !body, cbs);
}

int pdx_call_get_at(struct pdx_call *c, struct pdx_inst *inst, uint16_t port,
		    const char *path, const struct pdx_upstream_cbs *cbs)
{
	return call_start(c, inst, inst->role, port, EVHTTP_REQ_GET, path,
			  NULL, 0, false, true, cbs);
}

void pdx_call_leg_done(struct pdx_call *c)
{
	c->leg = NULL;
	pdx_pool_put(c->inst);
	c->inst = NULL;
}

struct pdx_inst *pdx_call_leg_cancel(struct pdx_call *c)
{
	struct pdx_inst *i = c->inst;

	pdx_upstream_cancel(c->leg);
	c->leg = NULL;
	c->inst = NULL;
	return i;
}

static void side_end(struct pdx_upstream *u, int status, struct evbuffer *body,
		     int err_status, const char *why, void *arg)
{
	struct pdx_call *c = arg;

	c->side = NULL;
	pdx_pool_put(c->side_inst);
	c->side_inst = NULL;
	if (c->over) /* the reply ended before this leg */
		call_free(c);
	else
		c->side_cbs.on_end(u, status, body, err_status, why,
				   c->side_cbs.arg);
}

int pdx_call_side(struct pdx_call *c, struct pdx_inst *inst, const char *path,
		  const void *body, size_t len,
		  const struct pdx_upstream_cbs *cbs)
{
	struct pdx_upstream_params p =
	    leg_params(c, inst, EVHTTP_REQ_POST, path, body, len, false);
	static const struct pdx_upstream_cbs side = {.on_head = prefill_head,
						     .on_end = side_end};
	struct pdx_upstream_cbs mine = side;

	if (!body_fits(c, len)) {
		pdx_pool_put(inst);
		return -1;
	}
	c->side_cbs = *cbs;
	mine.arg = c;
	log_debug("%s: prefill %s to %s (beside)", c->req_id, path, inst->url);
	if (pdx_upstream_start(&p, &mine, &c->side)) {
		pdx_pool_put(inst);
		pdx_call_reply_error(c, 500, "internal_error", "out of memory");
		return -1;
	}
	c->side_inst = inst;
	return 0;
}

/* The proxy stops with c in flight (--drain-timeout ran out, or a
 * signal said now): its client hears why, as for an engine's stream
 * that broke off, rather than a connection that just closes (which
 * on_close would also log as the client leaving). The loop must run a
 * moment after, to write it. */
void pdx_call_shut(struct pdx_call *c, const char *why)
{
	if (c->over) { /* replied; only a side leg left */
		call_free(c);
		return;
	}
	if (!c->replying) {
		pdx_call_reply_error(c, 503, "service_unavailable", why);
		return;
	}
	log_warn("%s: %s; stream cut short", c->req_id, why);
	side_cancel(c);
	sse_error(c, why, "service_unavailable", 503);
	call_detach(c);
	evhttp_send_reply_end(c->req);
	call_free(c);
}

void pdx_call_abort(struct pdx_call *c)
{
	if (c->over) /* replied; only a side leg left */
		call_free(c);
	else
		evhttp_connection_free(c->conn); /* runs on_close */
}
