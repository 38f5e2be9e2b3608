/* What http_api.c (the server and its small routes) and http_gen.c (the
 * completion routes) share. Internal to pdx-engine's HTTP front. */
#ifndef PDX_ENGINE_HTTP_INTERNAL_H
#define PDX_ENGINE_HTTP_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include <event2/http.h>
#include <jansson.h>

#include "engine/http_api.h"
#include "engine/kv_params.h"
#include "engine/openai.h"

struct pdx__gen_call;
struct pdx__kv;
struct pdx_kv_seq;
struct pdx_sched_req;

struct pdx_http_api {
	struct pdx_http_api_params p;
	struct evhttp *http;
	struct evhttp_bound_socket *bound; /* listens once serving */
	uint16_t port;
	long long started; /* unix seconds: /v1/models "created" */
	uint64_t next_id;  /* for request ids the client did not send */
	uint64_t id_seed;
	uint64_t engine_id; /* X-PDX-Engine-Id: this start's */
	LIST_HEAD(, pdx__gen_call) calls; /* completions in flight */
	LIST_HEAD(, pdx__kv) kvs; /* transfers of requests (http_kv.c) */
};

/* Sends an OpenAI error object with the given HTTP status. */
void pdx__http_error(struct pdx_http_api *api, struct evhttp_request *req,
		     int status, const char *type, const char *message);

/* Sends the error of a refused request body, naming its parameter. */
void pdx__http_refuse(struct pdx_http_api *api, struct evhttp_request *req,
		      const struct pdx_oai_error *e);

/* POST /v1/completions (chat false) and /v1/chat/completions. */
void pdx__gen_handle(struct pdx_http_api *api, struct evhttp_request *req,
		     bool chat);

/* Ends every call in flight (their clients get nothing more). */
void pdx__gen_abort_all(struct pdx_http_api *api);

/* http_kv.c: one request's KV transfer (kv_transfer_params), from its
 * admission to the agent's event, which may come after the request ended
 * (the prefill side holds its blocks until they are sent). */

/* A transfer for request sreq of n_prompt tokens; NULL: out of memory. */
struct pdx__kv *pdx__kv_new(struct pdx_http_api *api,
			    const struct pdx_kv_params *p, uint32_t n_prompt);
void pdx__kv_set_req(struct pdx__kv *k, struct pdx_sched_req *sreq);
/* The scheduler's KV hooks, forwarded by the request's sink. */
void pdx__kv_admitted(struct pdx__kv *k, struct pdx_kv_seq *seq);
/* pdx_kv_link_on_held()'s callback (arg: the api): a queued request's
 * held transfer failed at the agent: it learns now (the scheduler's
 * on_failure), not once admitted. */
void pdx__kv_held_event(void *arg, const struct pdx_engine_event *ev);
void pdx__kv_layer_done(struct pdx__kv *k, uint32_t layer, uint32_t slot);
void pdx__kv_first_token(struct pdx__kv *k, uint32_t token);
/* When the transfer ended here (CLOCK_MONOTONIC ns; 0: not yet), and
 * whether this side receives. */
uint64_t pdx__kv_done_ns(const struct pdx__kv *k);
bool pdx__kv_receives(const struct pdx__kv *k);
bool pdx__kv_hold(struct pdx__kv *k, struct pdx_kv_seq *seq);
/* The prefill side's kv_transfer_params answer (a new object), or NULL. */
json_t *pdx__kv_answer(const struct pdx__kv *k, uint32_t first_token);
/* Prefill side: PDX_OK, or why its transfer failed (its answer would be
 * no use). Either side: the failure's reason in *reason, "" if none. */
pdx_status_t pdx__kv_status(const struct pdx__kv *k, const char **reason);
/* The transfer failed on the other side or between the agents (an
 * event, or the bound on one), not for a cause of this instance's. */
bool pdx__kv_partner_failed(const struct pdx__kv *k);
/* Of those, one neither side's alone: the agents refused to pair
 * (PDX_EINCOMPAT), or a bound ran out waiting for the other side. */
bool pdx__kv_both_sides(const struct pdx__kv *k);
/* The request ended (done or aborted): a held transfer lives on. */
void pdx__kv_call_end(struct pdx__kv *k);
/* Shutdown: every transfer aborted, every held block freed. */
void pdx__kv_free_all(struct pdx_http_api *api);

#endif
