/* The proxy's Prometheus metrics: requests by HTTP status, aborted
 * requests, a request latency histogram, and (read from the pools when
 * rendered) in-flight requests overall and per instance.
 *
 * One thread. Plain counters; rendering reads the proxy's state.
 */
#ifndef PDX_PROXY_METRICS_H
#define PDX_PROXY_METRICS_H

#include <event2/buffer.h>
#include <stdint.h>

#define PDX_PROXY_LAT_BUCKETS 14
#define PDX_PROXY_STATUS_MAX 24 /* distinct status codes counted */

struct pdx_proxy_metrics {
	uint64_t aborted; /* clients that left before the end */
	unsigned nstatus;
	struct {
		int code;
		uint64_t n;
	} status[PDX_PROXY_STATUS_MAX];
	uint64_t lat_bucket[PDX_PROXY_LAT_BUCKETS]; /* not cumulative */
	uint64_t lat_count;
	double lat_sum;
};

/* Counts one finished request (status 499: the client left). */
void pdx_proxy_metrics_request(struct pdx_proxy_metrics *m, int status,
			       double seconds);

struct pdx_proxy;

/* Appends the exposition text (format 0.0.4) to out; -1 on no memory. */
int pdx_proxy_metrics_render(const struct pdx_proxy *px, struct evbuffer *out);

#endif
