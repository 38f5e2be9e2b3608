/* What http_api.c (the server and its small routes) and http_gen.c (the
 * completion routes) share. Internal to pdx-engine's HTTP front. */
#ifndef PDX_ENGINE_HTTP_INTERNAL_H
#define PDX_ENGINE_HTTP_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include <event2/http.h>

#include "engine/http_api.h"

struct pdx__gen_call;

struct pdx_http_api {
	struct pdx_http_api_params p;
	struct evhttp *http;
	uint16_t port;
	long long started; /* unix seconds: /v1/models "created" */
	uint64_t next_id;  /* for request ids the client did not send */
	uint64_t id_seed;
	LIST_HEAD(, pdx__gen_call) calls; /* completions in flight */
};

/* Sends an OpenAI error object with the given HTTP status. */
void pdx__http_error(struct pdx_http_api *api, struct evhttp_request *req,
		     int status, const char *type, const char *message);

/* POST /v1/completions (chat false) and /v1/chat/completions. */
void pdx__gen_handle(struct pdx_http_api *api, struct evhttp_request *req,
		     bool chat);

/* Ends every call in flight (their clients get nothing more). */
void pdx__gen_abort_all(struct pdx_http_api *api);

#endif
