/* pdx-bench --plot: a PNG of one run, drawn by gnuplot (Debian's
 * gnuplot-nox) run as a child process. Three panels: the TTFT and ITL
 * distributions (CDFs, on a log scale when the tail is 20 times the
 * median) and, per bucket of one second (0.1 s for runs shorter than
 * 10 s), output tokens per second (one per token chunk, as
 * max_output_tokens_per_s counts them) and requests completed per
 * second.
 *
 * The data and script writers are pure (they write to a FILE) so tests
 * can read what gnuplot would get; pdx_load_plot_write() puts them in a
 * temporary directory, runs gnuplot there and removes it. Main thread
 * only: it waits for the child. */
#ifndef PDX_BENCH_LOAD_PLOT_H
#define PDX_BENCH_LOAD_PLOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "bench/load_metrics.h"

/* The most points a CDF is drawn with: larger sets are sampled evenly,
 * first and last point kept. */
#define PDX_LOAD_PLOT_CDF_POINTS 2000

/* 0 when gnuplot can be run and png's directory exists; else -1 with the
 * reason (and what to install) in err. Checked before the load runs. */
int pdx_load_plot_check(const char *png, char *err, size_t errlen);

/* "value fraction" lines of the CDF of n ascending values (seconds,
 * written in ms): value i has fraction (i + 1) / n. */
void pdx_load_plot_cdf(FILE *f, const double *sorted, size_t n);

/* The bucket width for a run of duration_s: 1 s, or 0.1 s under 10 s. */
double pdx_load_plot_bucket_s(double duration_s);

/* "start tokens/s completed/s" lines, one per bucket of the run from 0
 * to the one duration_s falls in: token chunks received and requests
 * that ended successfully in [start, start + width), divided by the
 * width. Returns the number of lines. */
size_t pdx_load_plot_buckets(FILE *f, const struct pdx_load_result *res,
			     size_t n, double duration_s);

struct pdx_load_plot_script_params {
	const char *png;      /* output file */
	const char *dir;      /* where ttft.dat, itl.dat and tput.dat are */
	const char *title;    /* the figure's title */
	size_t n_ttft, n_itl; /* values behind each CDF; 0: "no data" */
	double ttft_p50_ms, ttft_p99_ms, itl_p50_ms, itl_p99_ms; /* titles */
	bool ttft_log, itl_log; /* log-scale x */
	size_t n_buckets;	/* lines of tput.dat; 0: "no data" */
	double bucket_s;	/* their width */
};

/* The gnuplot script; strings are quoted for gnuplot, never
 * interpreted. */
void pdx_load_plot_script(FILE *f,
			  const struct pdx_load_plot_script_params *sp);

/* Writes the PNG of the run to png. 0, or -1 with the reason in err
 * (gnuplot's first error line when it failed). */
int pdx_load_plot_write(const char *png, const char *title,
			const struct pdx_load_result *res, size_t n,
			double duration_s, char *err, size_t errlen);

#endif
