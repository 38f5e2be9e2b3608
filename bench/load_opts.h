/* pdx-bench's command line: vllm bench serve's option names and defaults,
 * plus a few of pdx's own (--prompt-format, --vocab-size,
 * --request-timeout, --plot, --abort-fraction, --abort-within-ms) and the options of LMCache's multi-round QA
 * and long-document QA shapes (--multi-round-*, --long-doc-*). Parsed
 * once on the main thread. */
#ifndef PDX_BENCH_LOAD_OPTS_H
#define PDX_BENCH_LOAD_OPTS_H

#include <stdbool.h>
#include <stdio.h>

#include "bench/load_dataset.h"
#include "bench/load_metrics.h"

/* --request-timeout's bound (s): about 115 days, well inside a timeval. */
#define PDX_LOAD_TIMEOUT_MAX_S 1e7

/* Pointers point into argv. */
struct pdx_load_opts {
	const char *backend, *label, *base_url, *host, *endpoint, *model;
	const char *served_model_name;
	int port;
	double request_timeout; /* 0: unset (6 hours) */
	const char *dataset_name, *dataset_path;
	long num_prompts; /* 0: unset */
	int input_len, output_len; /* -1: unset */
	struct pdx_load_dataset_params dp;
	bool ids;
	double request_rate, burstiness;
	int max_concurrency;
	double abort_fraction, abort_within_ms; /* client aborts */
	bool ignore_eos;
	double temperature, top_p;
	int top_k;
	const char *percentile_metrics, *metric_percentiles;
	struct pdx_load_goodput goodput;
	bool has_goodput;
	bool save_result, save_detailed, disable_tqdm;
	const char *result_dir, *result_filename, *plot;
	const char *metadata[32];
	int n_metadata;
	/* --engine-metrics HOST:PORT: engines whose prefix-cache counters
	 * the report shows (bench/load_scrape.h) */
	const char *engine_metrics[16];
	int n_engine_metrics;
};

void pdx_load_opts_defaults(struct pdx_load_opts *o);
void pdx_load_opts_usage(FILE *f);
/* Parses argv into o (start from the defaults); prints --help and exits
 * 0 on -h; -1 with a message on stderr for a bad option (pdx-bench then
 * exits 2, as argparse does). */
int pdx_load_opts_parse(int argc, char **argv, struct pdx_load_opts *o);

#endif
