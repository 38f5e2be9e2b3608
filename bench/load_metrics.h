/* What a run measured, computed as vllm bench serve's calculate_metrics()
 * does (vllm/benchmarks/serve.py): TTFT, TPOT = (latency - TTFT) /
 * (output_tokens - 1) over requests with more than one output token, ITL
 * pooled over every gap between token chunks, E2EL; each as mean, median,
 * population standard deviation and numpy-style (linear) percentiles, in
 * milliseconds; throughputs over the run's duration; goodput against
 * per-request SLOs. Pure. */
#ifndef PDX_BENCH_LOAD_METRICS_H
#define PDX_BENCH_LOAD_METRICS_H

#include <stdbool.h>
#include <stddef.h>

#define PDX_LOAD_MAX_PCTS 16

/* One request's outcome. Times in seconds. */
struct pdx_load_result {
	bool success;
	bool aborted;	/* the client cancelled it (--abort-fraction) */
	double start;	/* when it was meant to be sent, from the run start */
	double queue;	/* waited for a --max-concurrency slot */
	double ttft;	/* first token chunk - start */
	double latency; /* last token chunk - start */
	double *itl;	/* gaps between token chunks (malloc'd) */
	size_t n_itl;
	int prompt_len;	   /* from the dataset, or the server's usage */
	int output_tokens; /* usage's completion_tokens, else token chunks */
	char *error;	   /* why it failed (malloc'd), or NULL */
	char *text;	   /* generated text (malloc'd), or NULL */
};

void pdx_load_result_clear(struct pdx_load_result *r); /* frees; NULL-safe */

struct pdx_load_stat {
	double mean, median, std;      /* ms */
	double pct[PDX_LOAD_MAX_PCTS]; /* ms, one per selected percentile */
};

/* --goodput "ttft:MS tpot:MS e2el:MS" (any subset). */
struct pdx_load_goodput {
	bool ttft, tpot, e2el; /* which SLOs are set */
	double ttft_ms, tpot_ms, e2el_ms;
};

struct pdx_load_metrics {
	int completed, failed;
	int aborted; /* cancelled by the client: neither completed nor failed */
	long total_input, total_output;
	double request_throughput, request_goodput, output_throughput,
	    total_token_throughput;
	struct pdx_load_stat ttft, tpot, itl, e2el;
	/* Client-side queueing (only meaningful with --max-concurrency). */
	struct pdx_load_stat client_queue_time, e2el_including_client_queue;
	double max_output_tokens_per_s; /* busiest 1-second bucket */
	int max_concurrent_requests;	/* peak overlap of [start, end) */
	int good;			/* requests meeting every SLO */
};

/* Parses SLO pairs ("ttft:500", "tpot:50 e2el:2000", ...; names ttft,
 * tpot, e2el; values >= 0 ms) separated by spaces or commas and adds them
 * to *g. -1 with the reason in err on a bad pair. */
int pdx_load_goodput_parse(const char *spec, struct pdx_load_goodput *g,
			   char *err, size_t errlen);

/* Parses "50,90,99" into pcts (each in [0, 100]); -1 on error. */
int pdx_load_percentiles_parse(const char *spec, double *pcts, size_t max,
			       size_t *n_out);

/* numpy.percentile(v, p) with linear interpolation; v sorted ascending;
 * 0 for an empty array (as vllm's "values or 0"). */
double pdx_load_percentile(const double *sorted, size_t n, double p);

/* mean/median/std/percentiles of n values in seconds, reported in ms. */
void pdx_load_stat_compute(const double *v, size_t n, const double *pcts,
			   size_t npct, struct pdx_load_stat *out);

/* Everything at once; g may be NULL (no goodput). -1 on out of memory. */
int pdx_load_metrics_compute(const struct pdx_load_result *res, size_t n,
			     double duration_s, const double *pcts, size_t npct,
			     const struct pdx_load_goodput *g,
			     struct pdx_load_metrics *out);

#endif
