/* The engine's Prometheus metrics: counters and the TTFT histogram kept
 * here, gauges (requests, KV blocks) and the prefix cache's counters read
 * from their owners when rendered. Names start with pdx_engine_; text exposition format 0.0.4.
 *
 * One thread: the loop's.
 */
#ifndef PDX_ENGINE_METRICS_H
#define PDX_ENGINE_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/buffer.h>

#define PDX_METRICS_TTFT_BUCKETS 16

struct pdx_engine_metrics {
	uint64_t prompt_tokens;	    /* of requests admitted */
	uint64_t generation_tokens; /* delivered to clients */
	uint64_t req_finished;	    /* ran to their length */
	uint64_t req_aborted;	    /* the client left */
	uint64_t req_rejected;	    /* 4xx/5xx before running */
	uint64_t ttft_count[PDX_METRICS_TTFT_BUCKETS]; /* per bucket, not
							  cumulative */
	uint64_t ttft_inf; /* above the last bound */
	uint64_t ttft_n;
	double ttft_sum; /* seconds */
};

/* What the rest of the engine reports at render time. */
struct pdx_metrics_gauges {
	const char *model;
	uint32_t running, waiting;
	uint32_t kv_total, kv_free; /* free: no request holds them */
	/* the prefix cache's (prefix_cache.h; zero without one): its
	 * blocks now, and its counters */
	uint32_t prefix_blocks;
	uint64_t prefix_query_tokens, prefix_hit_tokens;
	uint64_t prefix_hit_bytes; /* the hits' KV: bytes not computed or
				      received */
	bool has_agent; /* --agent given: agent_up is reported */
	bool agent_up;  /* its agent is there with our pool registered */
};

/* Counts one time to first token, in seconds. */
void pdx_metrics_ttft(struct pdx_engine_metrics *m, double seconds);

/* Appends the text exposition of m and g to out. 0, or -1 when out of
 * memory. */
int pdx_metrics_render(const struct pdx_engine_metrics *m,
		       const struct pdx_metrics_gauges *g,
		       struct evbuffer *out);

#endif
