#include "bench/load_http.h"
#include "bench/load_openai.h"
#include "bench/load_progress.h"
#include "bench/load_sse.h"
#include "common/clock.h"
#include "common/nodelay.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT_S (6 * 3600.0) /* vllm's aiohttp total timeout */
#define ERR_BODY_MAX 200
#define PROGRESS_US 100000 /* redraw the progress line 10 times a second */

struct runner;

/* One request in flight. */
struct lreq {
	struct runner *run;
	size_t idx;
	struct evhttp_connection *conn;
	struct evhttp_request *req;
	struct event *timer;
	struct pdx_sse sse;
	uint64_t ready_ns; /* arrived, and the request it follows ended */
	uint64_t start_ns, last_ns, now_ns;
	bool first, finished, bad_json, started;
	bool parked;	/* arrived, waiting for the request it follows */
	bool aborts;	/* the timer is the client's abort, not the timeout */
	double abort_s; /* then: its delay from the send */
	int http_error; /* enum evhttp_request_error + 1, or 0 */
	double *itl;
	size_t n_itl, cap_itl;
	long chunks, usage_completion, usage_prompt;
	char *text;
	size_t text_len;
	char errbody[ERR_BODY_MAX + 1];
	size_t errbody_len;
};

struct runner {
	const struct pdx_load_run_params *p;
	struct pdx_load_result *res;
	struct event_base *base;
	struct event *tick, *progress;
	struct lreq *reqs;
	uint64_t t0;
	size_t next;		     /* next request to arrive */
	size_t *queue, qhead, qtail; /* arrived, waiting for a slot */
	int inflight;
	size_t finished;
	struct evhttp_connection **idle, **all, **dead;
	size_t n_idle, n_all, n_dead;
	struct event *reap; /* frees the dead connections */
	bool dispatching;   /* inside dispatch()'s loop */
	uint64_t freed_ns;  /* a slot freed meanwhile, by a start that failed */
	char host_hdr[300];
	uint64_t max_lag_ns;
	int drawn; /* length of the progress line on screen */
};

static uint64_t arrival_ns(const struct runner *r, size_t i)
{
	return r->t0 + (uint64_t)llround(r->p->arrivals[i] * 1e9);
}

/* Redraws the line in place: back to its start, then blanks over what
 * a longer line before left. */
static void progress_draw(struct runner *r, bool final)
{
	char line[160];
	int len;

	if (!r->p->progress)
		return;
	len = pdx_load_progress_format(line, sizeof(line), r->finished, r->p->n,
				       (double)(pdx_now_ns() - r->t0) / 1e9);
	fprintf(stderr, "\r%s%*s%s", line, r->drawn > len ? r->drawn - len : 0,
		"", final ? "\n" : "");
	fflush(stderr);
	r->drawn = len;
}

static void on_progress(evutil_socket_t fd, short what, void *arg)
{
	progress_draw(arg, false);
}

static const char *http_error_str(int e)
{
	switch (e - 1) {
	case EVREQ_HTTP_TIMEOUT:
		return "connection timed out";
	case EVREQ_HTTP_EOF:
		return "connection closed before the response ended";
	case EVREQ_HTTP_INVALID_HEADER:
		return "invalid response header";
	case EVREQ_HTTP_BUFFER_ERROR:
		return "connection error";
	case EVREQ_HTTP_REQUEST_CANCEL:
		return "request cancelled";
	case EVREQ_HTTP_DATA_TOO_LONG:
		return "response too long";
	default:
		return "connection failed";
	}
}

static void dispatch(struct runner *r, uint64_t slot_ns);

/* Request i may go once a slot is free, timed from ready_ns. */
static void enqueue(struct runner *r, size_t i, uint64_t ready_ns)
{
	r->reqs[i].ready_ns = ready_ns;
	r->queue[r->qtail++] = i;
}

/* The next round of a chat session, parked until this one ended. */
static void release_follower(struct runner *r, size_t i, uint64_t now)
{
	const bool *follows = r->p->follows;

	if (follows && i + 1 < r->p->n && follows[i + 1] &&
	    r->reqs[i + 1].parked) {
		r->reqs[i + 1].parked = false;
		enqueue(r, i + 1, now);
	}
}

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
	struct runner *r = arg;

	while (r->n_dead)
		evhttp_connection_free(r->dead[--r->n_dead]);
}

/* Takes c out of the run's connections, to be freed by on_reap. */
static void conn_bury(struct runner *r, struct evhttp_connection *c)
{
	for (size_t k = r->n_all; k-- > 0;) {
		if (r->all[k] == c) {
			r->all[k] = r->all[--r->n_all];
			break;
		}
	}
	r->dead[r->n_dead++] = c;
	event_active(r->reap, EV_TIMEOUT, 0);
}

static void finish(struct lreq *lr, bool ok, const char *fmt, ...)
{
	struct runner *r = lr->run;
	struct pdx_load_result *res = &r->res[lr->idx];
	char msg[512];
	va_list ap;

	if (lr->finished)
		return;
	lr->finished = true;
	res->success = ok;
	res->start = (double)(lr->start_ns - r->t0) / 1e9;
	res->queue = (double)(lr->start_ns - lr->ready_ns) / 1e9;
	res->prompt_len = lr->usage_prompt >= 0 ? (int)lr->usage_prompt
						: r->p->prompt_lens[lr->idx];
	if (ok) {
		res->latency = (double)(lr->last_ns - lr->start_ns) / 1e9;
		res->itl = lr->itl;
		res->n_itl = lr->n_itl;
		lr->itl = NULL;
		res->output_tokens = lr->usage_completion > 0
					 ? (int)lr->usage_completion
					 : (int)lr->chunks;
	}
	if (fmt) {
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
		res->error = strdup(msg);
	}
	res->text = lr->text;
	lr->text = NULL;
	free(lr->itl);
	lr->itl = NULL;
	pdx_sse_free(&lr->sse);
	if (lr->timer) {
		event_free(lr->timer);
		lr->timer = NULL;
	}
	/* A connection whose request failed is not reused: evhttp may still
	 * be failing its queue. It is closed once this callback returned:
	 * kept open to the end of the run, every failed request held one
	 * connection to the server, and against a server that fails fast
	 * (a 503) the run took every descriptor of a proxy under a low
	 * ulimit, which then served no one until the run ended. */
	if (lr->conn && ok)
		r->idle[r->n_idle++] = lr->conn;
	else if (lr->conn)
		conn_bury(r, lr->conn);
	lr->conn = NULL;
	lr->req = NULL;
	r->inflight--;
	r->finished++;
	release_follower(r, lr->idx, pdx_now_ns());
	if (r->finished == r->p->n)
		event_base_loopexit(r->base, NULL);
	else
		dispatch(r, pdx_now_ns());
}

static int on_event(void *arg, const char *data, size_t len)
{
	struct lreq *lr = arg;
	struct pdx_load_chunk c;
	double *n;
	size_t cap;

	if (pdx_load_openai_chunk(data, len, lr->run->p->chat, &c,
				  lr->run->p->keep_text ? &lr->text : NULL,
				  &lr->text_len)) {
		lr->bad_json = true;
		return 1;
	}
	if (c.has_choices) {
		if (!lr->first) {
			lr->first = true;
			lr->run->res[lr->idx].ttft =
			    (double)(lr->now_ns - lr->start_ns) / 1e9;
		} else {
			if (lr->n_itl == lr->cap_itl) {
				cap = lr->cap_itl ? 2 * lr->cap_itl : 64;
				n = realloc(lr->itl, cap * sizeof(*n));
				if (!n)
					return 1;
				lr->itl = n;
				lr->cap_itl = cap;
			}
			lr->itl[lr->n_itl++] =
			    (double)(lr->now_ns - lr->last_ns) / 1e9;
		}
		lr->last_ns = lr->now_ns;
		lr->chunks++;
	} else if (c.completion_tokens >= 0 || c.prompt_tokens >= 0) {
		lr->usage_completion = c.completion_tokens;
		lr->usage_prompt = c.prompt_tokens;
	}
	return 0;
}

/* Drains the response body into the SSE parser (or the error text). */
static void consume(struct lreq *lr, struct evhttp_request *req)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(req);
	int code = evhttp_request_get_response_code(req);
	struct evbuffer_iovec v[8];
	int i, nv;
	size_t len = evbuffer_get_length(in), take;

	if (!len)
		return;
	lr->now_ns = pdx_now_ns();
	if (code != 200) {
		take = ERR_BODY_MAX - lr->errbody_len;
		if (take > len)
			take = len;
		evbuffer_copyout(in, lr->errbody + lr->errbody_len, take);
		lr->errbody_len += take;
		lr->errbody[lr->errbody_len] = '\0';
	} else if (!lr->bad_json) {
		nv = evbuffer_peek(in, -1, NULL, v, 8);
		if (nv > 8) {
			evbuffer_pullup(in, -1);
			nv = evbuffer_peek(in, -1, NULL, v, 1);
		}
		for (i = 0; i < nv && !lr->bad_json; i++)
			pdx_sse_feed(&lr->sse, v[i].iov_base, v[i].iov_len,
				     on_event, lr);
	}
	evbuffer_drain(in, len);
}

static void on_chunk(struct evhttp_request *req, void *arg)
{
	struct lreq *lr = arg;

	if (!lr->finished)
		consume(lr, req);
}

static void on_error(enum evhttp_request_error e, void *arg)
{
	struct lreq *lr = arg;

	if (!lr->http_error)
		lr->http_error = (int)e + 1;
}

static void on_done(struct evhttp_request *req, void *arg)
{
	struct lreq *lr = arg;
	int code;

	if (lr->finished)
		return;
	code = req ? evhttp_request_get_response_code(req) : 0;
	if (!req || code == 0) {
		finish(lr, false, "%s", http_error_str(lr->http_error));
		return;
	}
	consume(lr, req);
	if (code != 200) {
		const char *reason = evhttp_request_get_response_code_line(req);

		finish(lr, false, "HTTP %d %s%s%s", code, reason ? reason : "",
		       lr->errbody_len ? ": " : "", lr->errbody);
		return;
	}
	lr->now_ns = pdx_now_ns();
	if (!lr->bad_json)
		pdx_sse_finish(&lr->sse, on_event, lr);
	if (lr->bad_json)
		finish(lr, false, "a streamed event is not a JSON object");
	else if (!lr->first)
		finish(lr, false,
		       "Never received a valid chunk to calculate TTFT.This "
		       "response will be marked as failed!");
	else
		finish(lr, true, NULL);
}

/* The request's timeout, or the client's planned abort: either way its
 * connection is closed, which tells the server the client left. */
static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct lreq *lr = arg;
	struct evhttp_request *req = lr->req;

	/* Cancel first: it resets the connection, which finish() then
	 * closes (a failed request's is not reused). */
	lr->req = NULL;
	lr->finished = true;
	if (req)
		evhttp_cancel_request(req);
	lr->finished = false;
	if (lr->aborts) {
		lr->run->res[lr->idx].aborted = true;
		finish(lr, false, "aborted by the client after %.3f s",
		       lr->abort_s);
		return;
	}
	finish(lr, false, "request timed out after %.3f s",
	       lr->run->p->timeout_s > 0 ? lr->run->p->timeout_s
					 : DEFAULT_TIMEOUT_S);
}

static struct evhttp_connection *get_conn(struct runner *r)
{
	const struct pdx_load_run_params *p = r->p;
	struct evhttp_connection *c;
	struct timeval tv;
	double t = p->timeout_s > 0 ? p->timeout_s : DEFAULT_TIMEOUT_S;

	if (r->n_idle)
		return r->idle[--r->n_idle];
	c = evhttp_connection_base_new(r->base, NULL, p->host,
				       (unsigned short)p->port);
	if (!c)
		return NULL;
	tv.tv_sec = (time_t)t;
	tv.tv_usec = (suseconds_t)((t - floor(t)) * 1e6);
	evhttp_connection_set_timeout_tv(c, &tv);
	evhttp_connection_set_retries(c, 0);
	r->all[r->n_all++] = c;
	return c;
}

static void start(struct runner *r, size_t i, uint64_t intended)
{
	const struct pdx_load_run_params *p = r->p;
	struct lreq *lr = &r->reqs[i];
	struct evkeyvalq *h;
	struct timeval tv;
	char auth[512];
	uint64_t now;
	double t = p->timeout_s > 0 ? p->timeout_s : DEFAULT_TIMEOUT_S;

	lr->run = r;
	lr->idx = i;
	lr->started = true;
	lr->start_ns = intended;
	lr->last_ns = intended;
	lr->usage_completion = lr->usage_prompt = -1;
	lr->abort_s = p->abort_after ? p->abort_after[i] : -1.0;
	lr->aborts = lr->abort_s >= 0.0 && lr->abort_s < t;
	if (lr->aborts)
		t = lr->abort_s;
	pdx_sse_init(&lr->sse, 0);
	r->inflight++;
	lr->conn = get_conn(r);
	lr->req = lr->conn ? evhttp_request_new(on_done, lr) : NULL;
	if (!lr->req) {
		finish(lr, false, "out of memory or connections");
		return;
	}
	evhttp_request_set_chunked_cb(lr->req, on_chunk);
	evhttp_request_set_error_cb(lr->req, on_error);
	h = evhttp_request_get_output_headers(lr->req);
	evhttp_add_header(h, "Host", r->host_hdr);
	evhttp_add_header(h, "Content-Type", "application/json");
	evhttp_add_header(h, "Accept", "text/event-stream");
	if (p->api_key) {
		snprintf(auth, sizeof(auth), "Bearer %s", p->api_key);
		evhttp_add_header(h, "Authorization", auth);
	}
	evbuffer_add_reference(evhttp_request_get_output_buffer(lr->req),
			       p->bodies[i], p->body_lens[i], NULL, NULL);
	lr->timer = evtimer_new(r->base, on_timeout, lr);
	tv.tv_sec = (time_t)t;
	tv.tv_usec = (suseconds_t)((t - floor(t)) * 1e6);
	if (lr->timer)
		evtimer_add(lr->timer, &tv);
	now = pdx_now_ns();
	if (now > intended && now - intended > r->max_lag_ns)
		r->max_lag_ns = now - intended;
	if (evhttp_make_request(lr->conn, lr->req, EVHTTP_REQ_POST, p->path)) {
		/* evhttp freed the request on failure. */
		lr->req = NULL;
		finish(lr, false, "could not send the request");
		return;
	}
	if (lr->conn) /* else it failed already, inside the call */
		pdx_evhttp_nodelay(lr->conn);
}

/* Starts queued requests while slots are free. slot_ns: when the slot
 * being filled became free (0 from the arrival timer: free all along). */
static void dispatch(struct runner *r, uint64_t slot_ns)
{
	uint64_t a;
	size_t i;

	/* A request that fails inside start() (no connection: a port where
	 * nobody listens, no descriptor left) ends before start() returns,
	 * and its slot is filled by the loop below, not by a call from here:
	 * each such failure started the next request one call deeper, and a
	 * run of 20000 requests to a closed port overflowed the stack. */
	if (r->dispatching) {
		r->freed_ns = slot_ns;
		return;
	}
	r->dispatching = true;
	r->freed_ns = 0;
	while (r->qhead < r->qtail && (r->p->max_concurrency <= 0 ||
				       r->inflight < r->p->max_concurrency)) {
		if (r->freed_ns > slot_ns)
			slot_ns = r->freed_ns;
		i = r->queue[r->qhead++];
		a = r->reqs[i].ready_ns;
		start(r, i, a > slot_ns ? a : slot_ns);
	}
	r->dispatching = false;
}

/* Queues what has arrived; a later round of a session waits, parked,
 * for the round before it (finish() releases it). */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct runner *r = arg;
	const bool *follows = r->p->follows;
	uint64_t now = pdx_now_ns(), wait;
	struct timeval tv;
	size_t i;

	while (r->next < r->p->n && arrival_ns(r, r->next) <= now) {
		i = r->next++;
		if (follows && i && follows[i] && !r->reqs[i - 1].finished)
			r->reqs[i].parked = true;
		else
			enqueue(r, i, arrival_ns(r, i));
	}
	dispatch(r, 0);
	if (r->next < r->p->n) {
		wait = arrival_ns(r, r->next) - now;
		tv.tv_sec = (time_t)(wait / 1000000000ULL);
		tv.tv_usec = (suseconds_t)(wait % 1000000000ULL / 1000);
		evtimer_add(r->tick, &tv);
	}
}

static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

static struct event_base *precise_base(void)
{
	struct event_config *cfg = event_config_new();
	struct event_base *b;

	if (!cfg)
		return NULL;
	/* Microsecond timers (timerfd) so arrivals land when they should. */
	event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
	b = event_base_new_with_config(cfg);
	event_config_free(cfg);
	return b;
}

int pdx_load_run(const struct pdx_load_run_params *p,
		 struct pdx_load_result *res, struct pdx_load_run_stats *st,
		 char *err, size_t errlen)
{
	struct runner r = {0};
	struct timeval zero = {0, 0}, progress_tv = {0, PROGRESS_US};
	uint64_t end;
	size_t i;
	int rc = -1;

	memset(res, 0, p->n * sizeof(*res));
	raise_fd_limit();
	r.p = p;
	r.res = res;
	r.base = precise_base();
	r.reqs = calloc(p->n + 1, sizeof(*r.reqs));
	r.queue = calloc(p->n + 1, sizeof(*r.queue));
	r.idle = calloc(p->n + 1, sizeof(*r.idle));
	r.all = calloc(p->n + 1, sizeof(*r.all));
	r.dead = calloc(p->n + 1, sizeof(*r.dead));
	if (!r.base || !r.reqs || !r.queue || !r.idle || !r.all || !r.dead) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	r.tick = evtimer_new(r.base, on_tick, &r);
	r.reap = event_new(r.base, -1, 0, on_reap, &r);
	if (p->progress)
		r.progress = event_new(r.base, -1, EV_PERSIST, on_progress, &r);
	if (!r.tick || !r.reap || (p->progress && !r.progress)) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	if (strchr(p->host, ':'))
		snprintf(r.host_hdr, sizeof(r.host_hdr), "[%s]:%d", p->host,
			 p->port);
	else
		snprintf(r.host_hdr, sizeof(r.host_hdr), "%s:%d", p->host,
			 p->port);
	r.t0 = pdx_now_ns();
	if (p->n) {
		evtimer_add(r.tick, &zero);
		if (r.progress) {
			progress_draw(&r, false);
			evtimer_add(r.progress, &progress_tv);
		}
		event_base_dispatch(r.base);
	}
	end = pdx_now_ns();
	progress_draw(&r, true);
	st->duration_s = (double)(end - r.t0) / 1e9;
	st->max_send_lag_s = (double)r.max_lag_ns / 1e9;
	rc = 0;
out:
	for (i = 0; r.reqs && i < p->n; i++) {
		free(r.reqs[i].itl);
		free(r.reqs[i].text);
		pdx_sse_free(&r.reqs[i].sse);
		if (r.reqs[i].timer)
			event_free(r.reqs[i].timer);
	}
	for (i = 0; r.all && i < r.n_all; i++)
		evhttp_connection_free(r.all[i]);
	for (i = 0; r.dead && i < r.n_dead; i++)
		evhttp_connection_free(r.dead[i]);
	if (r.tick)
		event_free(r.tick);
	if (r.reap)
		event_free(r.reap);
	if (r.progress)
		event_free(r.progress);
	if (r.base)
		event_base_free(r.base);
	free(r.reqs);
	free(r.queue);
	free(r.idle);
	free(r.all);
	free(r.dead);
	return rc;
}

struct get_state {
	struct event_base *base;
	char *body;
	int status;
	bool failed;
};

static void get_done(struct evhttp_request *req, void *arg)
{
	struct get_state *g = arg;
	struct evbuffer *in;
	size_t n;

	if (!req || !evhttp_request_get_response_code(req)) {
		g->failed = true;
	} else {
		g->status = evhttp_request_get_response_code(req);
		in = evhttp_request_get_input_buffer(req);
		n = evbuffer_get_length(in);
		g->body = malloc(n + 1);
		if (g->body) {
			evbuffer_copyout(in, g->body, n);
			g->body[n] = '\0';
		}
	}
	event_base_loopexit(g->base, NULL);
}

int pdx_load_http_get(const char *host, int port, const char *path,
		      double timeout_s, char **body_out, int *status_out)
{
	struct get_state g = {0};
	struct evhttp_connection *c = NULL;
	struct evhttp_request *req;
	char hosthdr[300];
	int rc = -1;

	g.base = event_base_new();
	if (!g.base)
		return -1;
	c = evhttp_connection_base_new(g.base, NULL, host,
				       (unsigned short)port);
	if (!c)
		goto out;
	evhttp_connection_set_timeout(c, timeout_s > 0 ? (int)ceil(timeout_s)
						       : 10);
	evhttp_connection_set_retries(c, 0);
	req = evhttp_request_new(get_done, &g);
	if (!req)
		goto out;
	snprintf(hosthdr, sizeof(hosthdr), "%s:%d", host, port);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Host",
			  hosthdr);
	if (evhttp_make_request(c, req, EVHTTP_REQ_GET, path))
		goto out;
	event_base_dispatch(g.base);
	if (!g.failed && g.body) {
		*body_out = g.body;
		*status_out = g.status;
		g.body = NULL;
		rc = 0;
	}
out:
	free(g.body);
	if (c)
		evhttp_connection_free(c);
	event_base_free(g.base);
	return rc;
}
