/* The proxy's Prometheus metrics: requests by HTTP status, aborted
 * requests, retries, a request latency histogram, and (read from the
 * pools when rendered) in-flight requests overall and per instance, each
 * instance's health and circuit breaker.
 *
 * One thread. Plain counters; rendering reads the proxy's state.
 */
#ifndef PDX_PROXY_METRICS_H
#define PDX_PROXY_METRICS_H

#include <event2/buffer.h>
#include <stdbool.h>
#include <stdint.h>

#define PDX_PROXY_LAT_BUCKETS 14

/* Where a request's time to first token went, from the engines'
 * Server-Timing headers and the proxy's own clock. */
enum pdx_proxy_phase {
	PDX_PHASE_PREFILL_QUEUE, /* P: arrival to admission */
	PDX_PHASE_PREFILL,	 /* P: admission to its first token */
	PDX_PHASE_DECODE_QUEUE,	 /* D: arrival to admission */
	PDX_PHASE_KV_WAIT,	 /* D: admission to the KV received */
	PDX_PHASE_FIRST_TOKEN,	 /* proxy: arrival to D's first byte out */
	PDX_PHASES
};

struct pdx_hist {
	uint64_t bucket[PDX_PROXY_LAT_BUCKETS]; /* not cumulative */
	uint64_t count;
	double sum;
};
#define PDX_PROXY_STATUS_MAX 24 /* distinct status codes counted */

struct pdx_proxy_metrics {
	uint64_t aborted; /* clients that left before the end */
	uint64_t retries[2]; /* starts over, by the failed leg's role */
	unsigned nstatus;
	struct {
		int code;
		uint64_t n;
	} status[PDX_PROXY_STATUS_MAX];
	struct pdx_hist lat;
	struct pdx_hist phase[PDX_PHASES];
};

void pdx_proxy_metrics_phase(struct pdx_proxy_metrics *m,
			     enum pdx_proxy_phase ph, double seconds);

/* Observes the phases in an engine's Server-Timing value ("queue;dur=MS,
 * prefill;dur=MS, kv;dur=MS, ttft;dur=MS"), from P's answer (prefill)
 * or D's. Unknown entries are skipped. */
void pdx_proxy_metrics_timing(struct pdx_proxy_metrics *m, const char *v,
			      bool prefill);

/* Counts one finished request (status 499: the client left). */
void pdx_proxy_metrics_request(struct pdx_proxy_metrics *m, int status,
			       double seconds);

struct pdx_proxy;

/* Appends the exposition text (format 0.0.4) to out; -1 on no memory. */
int pdx_proxy_metrics_render(const struct pdx_proxy *px, struct evbuffer *out);

#endif
