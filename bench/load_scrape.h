/* pdx-bench's look behind the server: the prefix-cache counters of the
 * engines (--engine-metrics), read from their /metrics before and after
 * a run, so a prefix dataset shows what the decode engines' caches saved:
 * prompt tokens found, and the KV bytes their agents did not receive.
 *
 * One thread; blocking GETs (before and after the run, not during it). */
#ifndef PDX_BENCH_LOAD_SCRAPE_H
#define PDX_BENCH_LOAD_SCRAPE_H

#include <stddef.h>

struct pdx_load_prefix {
	double hit_tokens;   /* pdx_engine_prefix_hit_tokens_total */
	double hit_bytes;    /* pdx_engine_prefix_hit_bytes_total */
	double query_tokens; /* pdx_engine_prefix_query_tokens_total */
};

/* The sum of every sample of metric `name` (any labels) in a Prometheus
 * text exposition; 0 when there is none. Pure. */
double pdx_load_prom_sum(const char *text, const char *name);

/* Adds the counters of the engine at hostport ("HOST:PORT") to *acc. -1
 * with the reason in err when its /metrics cannot be read. */
int pdx_load_scrape_prefix(const char *hostport, struct pdx_load_prefix *acc,
			   char *err, size_t errlen);

#endif
