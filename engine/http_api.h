/* pdx-engine's HTTP front: the OpenAI-compatible routes on an evhttp
 * server in the engine's loop.
 *
 *   POST /v1/completions, /v1/chat/completions  (engine/openai.h; SSE when
 *        "stream": true, one token per event, flushed as produced)
 *   GET  /v1/models, /health, /live, /metrics, /v1/pdx/info (role, agent
 *        peer address), /version
 *
 * Every request is handed to the scheduler; a client that disconnects
 * before the end has its request aborted, and so its KV blocks freed.
 * Every error is OpenAI's error object (common/http_error.h): 404 for an
 * unknown route, 405 with Allow for a known one asked with another
 * method, 413 for a body over PDX_HTTP_MAX_BODY plus the headroom left
 * for a proxy's fields.
 *
 * One thread: the loop's.
 */
#ifndef PDX_ENGINE_HTTP_API_H
#define PDX_ENGINE_HTTP_API_H

#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <pdx/status.h>

#include "common/models.h"
#include "engine/kv_link.h"
#include "engine/kv_pool.h"
#include "engine/metrics.h"
#include "engine/scheduler.h"

struct pdx_http_api;

/* Everything is borrowed and must outlive the server. */
struct pdx_http_api_params {
	struct event_base *base;
	const char *host;
	uint16_t port; /* 0: any free port (pdx_http_api_port()) */
	const struct pdx_model *model;
	uint32_t max_model_len;
	struct pdx_sched *sched;
	struct pdx_kv_pool *pool;
	struct pdx_engine_metrics *metrics;
	const char *role;	  /* "both", "prefill", "decode" */
	const char *agent;	  /* --agent, or NULL */
	struct pdx_kv_link *link; /* the agent link, or NULL: none */
	uint32_t kv_timeout_ms;	  /* bound on a transfer's wait */
	uint32_t kv_quarantine_ms; /* blocks of a transfer failed because the
				      agent went away, before their reuse */
	uint32_t queue_timeout_ms; /* the scheduler's, for its 503 */
};

/* Binds its port (another process there is found now), but connections
 * are refused until pdx_http_api_serve(). On failure writes the reason
 * to err and returns PDX_EIO or PDX_ENOMEM. */
pdx_status_t pdx_http_api_new(const struct pdx_http_api_params *p,
			      struct pdx_http_api **out, char *err,
			      size_t errlen);

/* Listens: the engine can serve (its agent registered it). PDX_EIO with
 * the reason in err. */
pdx_status_t pdx_http_api_serve(struct pdx_http_api *api, char *err,
				size_t errlen);

/* The port it is bound to. */
uint16_t pdx_http_api_port(const struct pdx_http_api *api);

/* The agent link, once made: the engine binds its port before it
 * registers with its agent (engine/main.c). Before any request comes. */
void pdx_http_api_set_link(struct pdx_http_api *api,
			   struct pdx_kv_link *link);

/* Aborts every request in flight, closes every connection; NULL-safe.
 * Call before pdx_sched_free(). */
void pdx_http_api_free(struct pdx_http_api *api);

#endif
