/* The completion routes: a request body becomes a scheduler request, and
 * its tokens become one JSON response or an SSE stream. */
#define PDX_LOG_TOPIC "http"
#include "engine/http_internal.h"

#include <event2/buffer.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/http_error.h"
#include "common/http_listen.h"
#include "common/log.h"
#include "common/mix64.h"
#include "common/oai_params.h"
#include "common/req_id.h"
#include "engine/kv_seq.h"
#include "engine/openai.h"
#include "engine/tokenizer.h"

/* One completion in flight, from its accepted body to its last byte. */
struct pdx__gen_call {
	LIST_ENTRY(pdx__gen_call) link;
	struct pdx_http_api *api;
	struct evhttp_request *req;
	struct evhttp_connection *conn;
	struct pdx_sched_req *sreq;
	struct pdx__kv *kv; /* its KV transfer, or NULL */
	uint32_t first_token;
	struct pdx_client_watch *watch; /* notices the client leaving */
	struct pdx_oai_meta meta;
	bool stream, include_usage;
	struct pdx_oai_usage usage;
	uint64_t arrival_ns, admitted_ns, first_ns; /* for Server-Timing */
	bool head_sent; /* a stream's head goes out with its first token */
	/* it failed because its KV transfer did, our agent there: the other
	 * side or the link between the agents failed (on_done) */
	bool partner_failed;
	bool both_sides; /* neither side's alone (pdx__kv_both_sides) */
	struct evbuffer *out; /* the text (whole) or the next SSE frame */
	char req_id[PDX_REQ_ID_MAX + 1];
	char id[PDX_REQ_ID_MAX + 16]; /* "cmpl-" or "chatcmpl-" + req_id */
};

/* The client's X-Request-Id, or 32 fresh hex digits; echoed back. */
static void set_ids(struct pdx__gen_call *c, bool chat)
{
	struct pdx_http_api *api = c->api;
	const char *h = evhttp_find_header(
	    evhttp_request_get_input_headers(c->req), "X-Request-Id");

	if (h && pdx_req_id_usable(h)) {
		snprintf(c->req_id, sizeof(c->req_id), "%s", h);
	} else {
		uint64_t n = ++api->next_id;

		snprintf(c->req_id, sizeof(c->req_id), "%016llx%016llx",
			 (unsigned long long)pdx_mix64(api->id_seed ^ n),
			 (unsigned long long)pdx_mix64(api->id_seed + n));
	}
	snprintf(c->id, sizeof(c->id), "%s%s", chat ? "chatcmpl-" : "cmpl-",
		 c->req_id);
	evhttp_add_header(evhttp_request_get_output_headers(c->req),
			  "X-Request-Id", c->req_id);
}

static void call_free(struct pdx__gen_call *c)
{
	LIST_REMOVE(c, link);
	pdx_client_watch_free(c->watch);
	evbuffer_free(c->out);
	free(c);
}

/* Lets go of the connection before the last reply, which may close it
 * (and would then call on_close for a call already over). */
static void call_detach(struct pdx__gen_call *c)
{
	evhttp_connection_set_closecb(c->conn, NULL, NULL);
}

/* The connection is being freed. When evhttp found the client gone while
 * writing a stream, it has already let go of the request (evcon NULL),
 * which is then ours to free; otherwise the connection frees it. */
static void on_close(struct evhttp_connection *conn, void *arg)
{
	struct pdx__gen_call *c = arg;

	log_debug("%s: client left, aborting", c->req_id);
	if (!evhttp_request_get_connection(c->req))
		evhttp_request_free(c->req);
	c->api->p.metrics->req_aborted++;
	/* first: a receive under way keeps the request's blocks */
	pdx_sched_abort(c->api->p.sched, c->sreq);
	if (c->kv)
		pdx__kv_call_end(c->kv);
	call_free(c);
}


/* Server-Timing (W3C): where the time to the first token went, in ms:
 * queue (arrival to admission: a running slot and all blocks), then
 * prefill (admission to the first token, computed here) or kv (admission
 * to the received KV, decode side), and ttft (arrival to first token).
 * pdx-proxy reads it into its phase histograms. */
static void add_timing(struct pdx__gen_call *c)
{
	uint64_t adm = c->admitted_ns ? c->admitted_ns : c->arrival_ns;
	uint64_t kv = c->kv ? pdx__kv_done_ns(c->kv) : 0;
	char v[160];

	if (!c->first_ns)
		return;
	if (kv > adm && pdx__kv_receives(c->kv))
		snprintf(v, sizeof(v),
			 "queue;dur=%.3f, kv;dur=%.3f, ttft;dur=%.3f",
			 (adm - c->arrival_ns) / 1e6, (kv - adm) / 1e6,
			 (c->first_ns - c->arrival_ns) / 1e6);
	else
		snprintf(v, sizeof(v),
			 "queue;dur=%.3f, prefill;dur=%.3f, ttft;dur=%.3f",
			 (adm - c->arrival_ns) / 1e6,
			 (c->first_ns - adm) / 1e6,
			 (c->first_ns - c->arrival_ns) / 1e6);
	evhttp_add_header(evhttp_request_get_output_headers(c->req),
			  "Server-Timing", v);
}

/* A stream's head waits for its first token, so it can carry the timing
 * and a request that fails before any token gets a plain HTTP error. */
static void stream_head(struct pdx__gen_call *c)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(c->req);

	evhttp_add_header(h, "Content-Type", "text/event-stream");
	evhttp_add_header(h, "Cache-Control", "no-cache");
	add_timing(c);
	pdx_http_reply_start(c->req, 200, "OK");
	c->head_sent = true;
}

static void sse_send(struct pdx__gen_call *c, char *json)
{
	if (!c->head_sent)
		stream_head(c);
	if (json) {
		evbuffer_add_printf(c->out, "data: %s\n\n", json);
		free(json);
	}
	evhttp_send_reply_chunk(c->req, c->out);
}

static void on_token(void *arg, uint32_t token, uint32_t index, bool last)
{
	struct pdx__gen_call *c = arg;
	struct pdx_engine_metrics *m = c->api->p.metrics;
	char piece[PDX_TOK_WORD_MAX + 1];

	/* words joined by single spaces: the text encodes back to the ids */
	piece[0] = ' ';
	pdx_tok_word(token, piece + 1);
	if (index == 0)
		c->first_token = token;
	if (index == 0) {
		log_debug("%s: first token", c->id);
		c->first_ns = pdx_now_ns();
		pdx_metrics_ttft(m, (double)(c->first_ns - c->arrival_ns) / 1e9);
	}
	m->generation_tokens++;
	c->usage.completion_tokens = index + 1;
	if (c->stream)
		sse_send(c, pdx_oai_chunk(&c->meta, piece + (index == 0),
					  index == 0, last));
	else
		evbuffer_add(c->out, piece + (index == 0),
			     strlen(piece + (index == 0)));
}

/* A request that ended in failure before its answer began: a 503 to
 * retry when the queue's bound ran out (the engine was full); a 409 when
 * its kv_transfer_params named a transfer in flight here already (the
 * client's mistake, an xfer_id in two requests: a 5xx had a proxy take
 * this engine for a broken one); a 502 when its KV transfer failed on
 * the other side or between the agents (a proxy then does not take this
 * engine for a broken one: its breaker opened on a prefill instance's
 * mistakes); a 503 when our own agent went away mid-transfer (as for
 * a request it refuses while the agent is away); else a 500 with the
 * reason. */
static void fail_reply(struct pdx__gen_call *c, pdx_status_t st,
		       const char *why)
{
	char msg[160];

	if (st == PDX_EEXIST) {
		pdx__http_error(c->api, c->req, 409, "invalid_request_error",
				why);
		return;
	}
	if (st == PDX_EAGENT) {
		/* our agent went away mid-transfer: the 503 it gets once
		 * the agent is known away, not a 500 (a new user's find) */
		pdx__http_error(c->api, c->req, 503, "service_unavailable",
				why);
		return;
	}
	if (st != PDX_EAGAIN) {
		if (c->partner_failed) {
			/* for a proxy: count it against the other side;
			 * agents that refused to pair (another model, block
			 * size or dtype on one side) and a bound run out
			 * against both, or a misconfigured decode instance
			 * opened every good prefill instance's breaker and
			 * kept its own */
			evhttp_add_header(
			    evhttp_request_get_output_headers(c->req),
			    "X-PDX-Failed-Side",
			    c->both_sides ? "both" : "peer");
			pdx__http_error(c->api, c->req, 502,
					"kv_transfer_failed", why);
		}
		else
			pdx__http_error(c->api, c->req, 500, "internal_error",
					why);
		return;
	}
	snprintf(msg, sizeof(msg),
		 "the engine had no room for the request (a running slot and "
		 "all its KV blocks) within %u ms (--queue-timeout-ms); retry "
		 "later",
		 c->api->p.queue_timeout_ms);
	evhttp_add_header(evhttp_request_get_output_headers(c->req),
			  "Retry-After", "1");
	pdx__http_error(c->api, c->req, 503, "service_unavailable", msg);
}

static void finish_stream(struct pdx__gen_call *c, pdx_status_t st,
			  const char *why)
{
	if (st != PDX_OK && !c->head_sent) {
		fail_reply(c, st, why);
		return;
	}
	if (st != PDX_OK)
		sse_send(c, pdx_http_error_body(500, "internal_error", NULL,
						why));
	else if (c->include_usage)
		sse_send(c, pdx_oai_usage_chunk(&c->meta, &c->usage));
	evbuffer_add_printf(c->out, "data: [DONE]\n\n");
	evhttp_send_reply_chunk(c->req, c->out);
	evhttp_send_reply_end(c->req);
}

static void finish_whole(struct pdx__gen_call *c, pdx_status_t st,
			 const char *why)
{
	struct evbuffer *b;
	char *json;

	if (st != PDX_OK) {
		fail_reply(c, st, why);
		return;
	}
	evbuffer_add(c->out, "", 1); /* NUL: the text as a C string */
	if (c->kv)
		c->meta.kv_answer = pdx__kv_answer(c->kv, c->first_token);
	json = pdx_oai_response(
	    &c->meta, (const char *)evbuffer_pullup(c->out, -1), &c->usage);
	json_decref(c->meta.kv_answer);
	b = evbuffer_new();
	if (!json || !b) {
		evhttp_send_error(c->req, 500, "out of memory");
	} else {
		evbuffer_add(b, json, strlen(json));
		evhttp_add_header(evhttp_request_get_output_headers(c->req),
				  "Content-Type", "application/json");
		add_timing(c);
		evhttp_send_reply(c->req, 200, "OK", b);
	}
	evbuffer_free(b);
	free(json);
}

static void on_done(void *arg, pdx_status_t st)
{
	struct pdx__gen_call *c = arg;
	const char *why = pdx_status_str(st), *reason = "";
	pdx_status_t kst = c->kv ? pdx__kv_status(c->kv, &reason) : PDX_OK;
	char ranks[PDX_REASON_MAX];

	/* a prefill whose transfer failed is no use to its decode side */
	if (st == PDX_OK && kst != PDX_OK)
		st = kst;
	/* the request failed as its transfer did, for the other side */
	c->partner_failed = st != PDX_OK && c->kv &&
			    pdx__kv_partner_failed(c->kv);
	c->both_sides = c->partner_failed && pdx__kv_both_sides(c->kv);
	if (st != PDX_OK && reason[0])
		why = reason;
	/* a forward pass a rank of this TP instance could not run (it is
	 * gone): say which, not "peer unreachable" */
	else if (st == PDX_EPEER && c->api->p.link &&
		 pdx_kv_link_ranks_status(c->api->p.link, ranks,
					  sizeof(ranks)) != PDX_OK)
		why = ranks;
	if (st == PDX_OK)
		c->api->p.metrics->req_finished++;
	else
		log_warn("%s: %s", c->req_id, pdx_status_str(st));
	call_detach(c);
	if (c->stream)
		finish_stream(c, st, why);
	else
		finish_whole(c, st, why);
	if (c->kv)
		pdx__kv_call_end(c->kv);
	call_free(c);
}

static void on_admitted(void *arg, struct pdx_kv_seq *seq)
{
	struct pdx__gen_call *c = arg;

	c->admitted_ns = pdx_now_ns();
	if (c->kv)
		pdx__kv_admitted(c->kv, seq);
}

static void on_first_token(void *arg, uint32_t token)
{
	pdx__kv_first_token(((struct pdx__gen_call *)arg)->kv, token);
}

static void on_layer_done(void *arg, uint32_t layer, uint32_t slot)
{
	pdx__kv_layer_done(((struct pdx__gen_call *)arg)->kv, layer, slot);
}

static bool on_hold(void *arg, struct pdx_kv_seq *seq)
{
	struct pdx__gen_call *c = arg;

	return c->kv && pdx__kv_hold(c->kv, seq);
}

/* A request refused before its transfer was made here that names one:
 * the other side's agent is told at once (pdx_kv_link_abort_at), so the
 * other engine frees the KV it computed or waits for now, not when a
 * lease or a timeout runs out. Its kv_transfer_params are read on their
 * own, as the refusal may be about any other field. */
static void refused_transfer(struct pdx_http_api *api, json_t *kv_obj)
{
	struct pdx_kv_params kv;
	char msg[128];

	/* also when only a field of this side's was wrong (a client's
	 * on_failure "bogus"): the other side's leg had begun, and its KV
	 * was held for its lease (a burst of them starved the prefill
	 * engine) */
	if (!api->p.link)
		return;
	if (pdx_kv_params_parse(kv_obj, api->p.model->vocab, &kv, msg,
				sizeof(msg)) &&
	    !kv.peer_read)
		return;
	if (kv.role != PDX_KV_NONE && kv.remote_agent[0]) {
		log_debug("%s: refused; its peer agent is told", kv.xfer_hex);
		pdx_kv_link_abort_at(api->p.link, &kv.xfer,
				     &kv.remote_agents);
	}
}

/* A client's kv_transfer_params naming one of our own agents (a rank's)
 * as the other side: the agent refused the transfer, and the client got
 * a 500. */
static bool names_own_agent(struct pdx_http_api *api,
			    const struct pdx_kv_params *kv)
{
	struct pdx_kv_peers own;

	pdx_kv_link_peers(api->p.link, &own);
	for (uint32_t i = 0; i < kv->remote_agents.n; i++)
		for (uint32_t r = 0; r < own.n; r++)
			if (!strcmp(kv->remote_agents.addr[i], own.addr[r]))
				return true;
	return false;
}

/* A request with kv_transfer_params: checked against the engine's role,
 * its transfer made and its sink given the KV hooks. -1: replied. */
static int kv_setup(struct pdx__gen_call *c, struct pdx_oai_req *r,
		    struct pdx_sched_sink *sink)
{
	struct pdx_http_api *api = c->api;
	bool recv = r->kv.role == PDX_KV_RECV;
	const char *bad = NULL;
	bool ours = false; /* it names our own agent */
	char why[PDX_REASON_MAX + 32];

	if (!api->p.link)
		bad = "kv_transfer_params: this engine has no --agent";
	else if (recv && !strcmp(api->p.role, "prefill"))
		bad = "do_remote_prefill: this is a prefill engine";
	else if (!recv && !strcmp(api->p.role, "decode"))
		bad = "do_remote_decode: this is a decode engine";
	else if (pdx_kv_params_check_tp(&r->kv, why, sizeof(why)))
		bad = why;
	else if ((ours = names_own_agent(api, &r->kv)))
		bad = "kv_transfer_params.remote_agent: this engine's own "
		      "agent; want the other side's";
	if (bad) {
		pdx__http_error(api, c->req, 400, "invalid_request_error", bad);
		/* the other side is told, not our own agent */
		if (api->p.link && r->kv.remote_agent[0] && !ours)
			pdx_kv_link_abort_at(api->p.link, &r->kv.xfer,
					     &r->kv.remote_agents);
		return -1;
	}
	/* No compute for a transfer that cannot happen: the proxy tries
	 * another instance (a 503 is retried). A decode request that may
	 * recompute its prefill does so at once instead. */
	if (pdx_kv_link_status(api->p.link, why, sizeof(why)) != PDX_OK) {
		/* recomputing needs every TP rank, not their agents */
		if (recv && r->kv.recompute &&
		    pdx_kv_link_ranks_status(api->p.link, NULL, 0) == PDX_OK) {
			log_warn("%s: %s; prefilling here (recompute)",
				 r->kv.xfer_hex, why);
			return 0;
		}
		pdx__http_error(api, c->req, 503, "service_unavailable", why);
		return -1;
	}
	if (pdx_kv_params_mint(&r->kv)) {
		pdx__http_error(api, c->req, 500, "internal_error",
				"no random bytes for an xfer_id");
		return -1;
	}
	c->kv = pdx__kv_new(api, &r->kv, r->n_prompt);
	if (!c->kv) {
		pdx__http_error(api, c->req, 500, "internal_error",
				"out of memory");
		return -1;
	}
	/* the prefill side answers the first token; the decode side goes on */
	if (!recv)
		r->max_tokens = 1;
	sink->remote_kv = recv;
	sink->recompute = r->kv.recompute;
	sink->layer_done = recv ? NULL : on_layer_done;
	sink->first_token = recv ? NULL : on_first_token;
	sink->hold = on_hold; /* prefill: until sent; both: quarantine */
	return 0;
}

static void refuse(struct pdx_http_api *api, struct evhttp_request *req,
		   pdx_status_t st, const struct pdx_oai_req *r)
{
	struct pdx_block_stats bs;
	char msg[256];

	pdx_block_alloc_stats(pdx_kv_pool_blocks(api->p.pool), &bs);
	if (st == PDX_ETOOBIG) {
		snprintf(msg, sizeof(msg),
			 "the request needs more KV blocks than the engine's "
			 "pool of %u holds (%u prompt + %u output tokens)",
			 bs.total, r->n_prompt, r->max_tokens);
		pdx__http_error(api, req, 400, "invalid_request_error", msg);
	} else if (st == PDX_EAGAIN) {
		pdx__http_error(api, req, 503, "service_unavailable",
				"the engine's queue is full; retry later");
	} else {
		pdx__http_error(api, req, 500, "internal_error",
				pdx_status_str(st));
	}
}

/* Reads the body into r; on failure replies and returns -1. */
static int read_body(struct pdx_http_api *api, struct evhttp_request *req,
		     bool chat, struct pdx_oai_req *r)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(req);
	const struct pdx_oai_limits lim = {
	    .model = api->p.model->name,
	    .vocab = api->p.model->vocab,
	    .max_model_len = api->p.max_model_len,
	};
	size_t len = evbuffer_get_length(in);
	struct pdx_oai_error err;
	const char *body = (const char *)evbuffer_pullup(in, -1);

	if (pdx_oai_parse(body ? body : "", len, chat, &lim, r, &err)) {
		struct pdx_oai_fault f;
		json_t *root =
		    api->p.link ? pdx_oai_body_load(body, len, &f) : NULL;

		pdx__http_refuse(api, req, &err);
		refused_transfer(api,
				 json_object_get(root, "kv_transfer_params"));
		json_decref(root);
		return -1;
	}
	if (r->ignored[0]) /* as vLLM does */
		log_warn("fields present in the request but ignored: %s",
			 r->ignored);
	return 0;
}

void pdx__gen_handle(struct pdx_http_api *api, struct evhttp_request *req,
		     bool chat)
{
	struct pdx_sched_sink sink = {
	    .token = on_token, .done = on_done, .admitted = on_admitted};
	struct pdx__gen_call *c;
	uint64_t arrival_ns = pdx_now_ns(); /* TTFT counts parsing too */
	struct pdx_oai_req r;
	char why[PDX_REASON_MAX + 32];
	pdx_status_t st;

	if (read_body(api, req, chat, &r))
		return;
	/* a forward pass needs every TP rank: without them, as a transfer
	 * without its agent, a 503 the proxy retries elsewhere */
	if (r.kv.role == PDX_KV_NONE && api->p.link &&
	    pdx_kv_link_ranks_status(api->p.link, why, sizeof(why)) !=
		PDX_OK) {
		pdx_oai_req_clear(&r);
		pdx__http_error(api, req, 503, "service_unavailable", why);
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c || !(c->out = evbuffer_new())) {
		free(c);
		pdx_oai_req_clear(&r);
		pdx__http_error(api, req, 500, "internal_error",
				"out of memory");
		return;
	}
	c->api = api;
	c->req = req;
	c->conn = evhttp_request_get_connection(req);
	c->arrival_ns = arrival_ns;
	c->stream = r.stream;
	c->include_usage = r.include_usage;
	c->usage.prompt_tokens = r.n_prompt;
	set_ids(c, chat);
	log_debug("%s: %u prompt tokens, read in %.3f ms", c->id, r.n_prompt,
		  (pdx_now_ns() - arrival_ns) / 1e6);
	c->meta = (struct pdx_oai_meta){.chat = chat,
					.id = c->id,
					.created = (long long)time(NULL),
					.model = api->p.model->name};
	LIST_INSERT_HEAD(&api->calls, c, link);
	sink.arg = c;
	if (r.kv.role != PDX_KV_NONE && kv_setup(c, &r, &sink)) {
		pdx_oai_req_clear(&r);
		call_free(c);
		return;
	}
	st = pdx_sched_submit(api->p.sched, r.prompt, r.n_prompt, r.max_tokens,
			      r.cache_salt, &sink, &c->sreq);
	if (st != PDX_OK) {
		refuse(api, req, st, &r);
		pdx_oai_req_clear(&r);
		if (c->kv)
			pdx__kv_call_end(c->kv);
		call_free(c);
		return;
	}
	if (c->kv)
		pdx__kv_set_req(c->kv, c->sreq);
	api->p.metrics->prompt_tokens += r.n_prompt;
	pdx_oai_req_clear(&r);
	evhttp_connection_set_closecb(c->conn, on_close, c);
	c->watch = pdx_client_watch_new(api->p.base, c->conn);
	if (!c->watch)
		log_warn("%s: cannot watch the client's socket", c->req_id);
}

void pdx__gen_abort_all(struct pdx_http_api *api)
{
	struct pdx__gen_call *c;

	while ((c = LIST_FIRST(&api->calls))) {
		call_detach(c);
		/* first, as on_close: a receive's blocks go to its kv (freed
		 * below with every kv) */
		pdx_sched_abort(api->p.sched, c->sreq);
		if (c->kv)
			pdx__kv_call_end(c->kv);
		call_free(c);
	}
	pdx__kv_free_all(api);
}
