/* Prometheus text exposition (format 0.0.4) into an evbuffer: a family's
 * HELP and TYPE lines, its samples, and histograms over one set of
 * bounds in seconds. Names, label values and help text are the caller's
 * and are written as given (no escaping): pdx passes constants and
 * addresses.
 *
 * Any thread; no state. Each function returns 0, or -1 when out of
 * memory, and logs nothing.
 */
#ifndef PDX_COMMON_PROM_H
#define PDX_COMMON_PROM_H

#include <event2/buffer.h>
#include <stdint.h>

/* "# HELP name help" and "# TYPE name type" (counter, gauge,
 * histogram): once per family, before its samples. */
int pdx_prom_family(struct evbuffer *out, const char *name, const char *type,
		    const char *help);

/* One sample: name{labels} v; labels "k=\"v\",k2=\"v2\"", or "" for
 * none. */
int pdx_prom_sample(struct evbuffer *out, const char *name, const char *labels,
		    uint64_t v);

/* The family NAME (a program's pdx_PROG_build_info): one sample of 1
 * whose label version is what --version prints, then the labels given
 * ("" for none, else ",k=\"v\"..."): which build runs there, as a
 * rolling upgrade needs to know. */
int pdx_prom_build_info(struct evbuffer *out, const char *name,
			const char *labels);

/* A histogram of durations, buckets from 1 ms to 30 s (le, seconds). */
#define PDX_PROM_BUCKETS 14

struct pdx_prom_hist {
	uint64_t bucket[PDX_PROM_BUCKETS]; /* per bucket, not cumulative */
	uint64_t count;			   /* the +Inf bucket included */
	double sum;			   /* seconds */
};

void pdx_prom_hist_observe(struct pdx_prom_hist *h, double seconds);

/* The series of one label set ("" for none): name_bucket (cumulative,
 * +Inf last), name_sum, name_count. */
int pdx_prom_hist_render(struct evbuffer *out, const char *name,
			 const char *labels, const struct pdx_prom_hist *h);

#endif
