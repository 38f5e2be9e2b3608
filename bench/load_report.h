/* pdx-bench's two outputs, with vllm bench serve's labels and keys: the
 * console block that starts "============ Serving Benchmark Result
 * ============", and the result JSON object (what --save-result writes).
 * Pure apart from the FILE it prints to; needs jansson. */
#ifndef PDX_BENCH_LOAD_REPORT_H
#define PDX_BENCH_LOAD_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

#include "bench/load_metrics.h"
#include "bench/load_scrape.h"

/* --percentile-metrics, as bits. */
enum {
	PDX_LOAD_M_TTFT = 1 << 0,
	PDX_LOAD_M_TPOT = 1 << 1,
	PDX_LOAD_M_ITL = 1 << 2,
	PDX_LOAD_M_E2EL = 1 << 3,
	PDX_LOAD_M_CLIENT_QUEUE = 1 << 4, /* client_queue_time */
	PDX_LOAD_M_E2EL_QUEUE = 1 << 5,	  /* e2el_including_client_queue */
};
#define PDX_LOAD_M_DEFAULT (PDX_LOAD_M_TTFT | PDX_LOAD_M_TPOT | PDX_LOAD_M_ITL)

/* Parses "ttft,tpot,itl,e2el,..." into bits; -1 on an unknown name. */
int pdx_load_metric_names_parse(const char *spec, unsigned *mask);

struct pdx_load_report {
	const struct pdx_load_metrics *m;
	double duration_s;
	double request_rate; /* INFINITY when unlimited */
	double burstiness;
	int max_concurrency; /* 0: none */
	bool goodput;	     /* --goodput was given */
	unsigned metrics;    /* PDX_LOAD_M_* selected */
	const double *pcts;  /* --metric-percentiles */
	size_t npct;
	/* Result JSON header. */
	const char *date, *backend, *label, *model_id, *tokenizer_id;
	size_t num_prompts;
	/* Per-request lists: always "latencies" and "queue_times" (as
	 * vllm keeps them); the others with detailed. */
	const struct pdx_load_result *res;
	size_t n_res;
	bool detailed;
	double max_send_lag_ms; /* pdx: how late the tool sent, at worst */
	bool aborts; /* pdx: --abort-fraction > 0: "Aborted requests:" and
		      * "aborted" */
	/* pdx: --engine-metrics: the engines' prefix-cache counters over
	 * the run (NULL: none given) */
	const struct pdx_load_prefix *prefix;
};

/* "p99", "p99.9": vllm's percentile word. buf of at least 32 bytes. */
void pdx_load_pct_word(double p, char *buf, size_t len);

/* Python's str(float): "inf", "10.0", "2.5", the shortest text that reads
 * back the same. */
void pdx_load_py_float(double v, char *buf, size_t len);

void pdx_load_report_print(FILE *f, const struct pdx_load_report *r);

/* The result object, keys in vllm's order; NULL on out of memory. */
json_t *pdx_load_report_json(const struct pdx_load_report *r);

#endif
