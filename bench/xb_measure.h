/* pdx-xferbench's measurement: the iterations of a run, each a batch of
 * --concurrency transfers from the prefill engine to the decode engine,
 * every byte verified; the warm-up, the layer calibration and, with
 * --versus, a second arm measured beside the first, iteration by
 * iteration. It gathers raw samples (latencies, wall times, exposed times,
 * the paired memcpy) into each arm's results; the report
 * (bench/xb_report.h) turns them into figures.
 */
#ifndef PDX_BENCH_XB_MEASURE_H
#define PDX_BENCH_XB_MEASURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench/xb_nodes.h"
#include "bench/xb_opts.h"
#include "bench/xb_plan.h"
#include "bench/xb_tp.h"

struct xb_results {
	double *lat_ms;       /* per measured transfer */
	size_t n_lat;
	double wall_s;        /* sum over measured iterations */
	uint64_t bytes;       /* over measured iterations */
	uint64_t ev_bytes;    /* the same, as the decode agent's events say */
	uint64_t ops;         /* UCX operations over measured iterations */
	double layer_sum_ms;  /* layer_xfer samples */
	size_t layer_n;
	/* per measured iteration, reported as medians: one iteration that the
	 * shared machine delays says little about the overlap */
	double exposed_ms[MAX_ITERS];        /* to the decode agent's "received" */
	double engine_exposed_ms[MAX_ITERS]; /* to the decode engine reading it */
	size_t exposed_n;
	bool verified;
	/* per decode rank: bytes its agent's events said, over the measured
	 * transfers, and whether all its bytes arrived intact */
	uint64_t rank_ev_bytes[XB_TP_MAX];
	bool rank_verified[XB_TP_MAX];
	uint32_t xfers;
	double memcpy_s;      /* the paired copy limit */
	uint64_t memcpy_bytes;
};

/* One configuration measured. arm[0] is the run's options; with --versus,
 * arm[1] is the variant, measured in the same process, iteration by
 * iteration beside the baseline. */
struct xb_arm {
	struct xb_shape shape;
	struct xb_side *dec;  /* its decode ranks: the run's, of its TP size */
	struct xb_results res;
};

/* --mem cuda: the device and its copy rates, measured once */
struct xb_dev {
	char gpu[128];
	double d2d_gbps, d2h_gbps;
};

/* A run: its options, the shared plan, the nodes it drives and what it
 * measured. */
struct xb_run {
	const struct xb_opts *o;
	struct xb_plan *plan;
	struct xb_side pre;    /* the prefill ranks, every arm's */
	struct xb_side dec[2]; /* decode ranks, one side per TP size */
	/* rank 0 of the prefill side and of arm[0]'s decode side: the lane
	 * they report, the GPU yardsticks, --one-block's pair */
	struct xb_node *prefill, *decode;
	struct xb_arm arm[2];
	uint32_t n_arms;
	uint64_t rng;         /* block choice and data seeds */
	struct xb_dev dev;
};

/* The warm-up, the GPU yardsticks (--mem cuda), the layer calibration
 * (--layer-ms) and the measured iterations of every arm. */
void xb_measure_run(struct xb_run *r);

/* Whether every arm's bytes arrived intact. */
bool xb_run_verified(const struct xb_run *r);

#endif
