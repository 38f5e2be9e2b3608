/* Which requests of a run the client cancels on purpose, and when: each
 * request, with probability 'fraction', has the client close its
 * connection a delay drawn uniformly from [0, within_s] seconds after it
 * was sent, unless it has ended by then (pdx-bench's --abort-fraction and
 * --abort-within-ms; a server under test must free what the request held).
 *
 * Pure and deterministic for a seed, on a random stream of its own: the
 * prompts and arrival times of a run are the same with or without aborts.
 * Two draws are made for every request whatever the fraction, so for one
 * seed a larger fraction cancels a superset of the requests a smaller one
 * cancels, each after the same delay. */
#ifndef PDX_BENCH_LOAD_ABORT_H
#define PDX_BENCH_LOAD_ABORT_H

#include <stddef.h>
#include <stdint.h>

struct pdx_load_abort_params {
	size_t n;
	double fraction; /* in [0, 1] */
	double within_s; /* >= 0, finite */
	uint64_t seed;
};

/* Writes n values into out: seconds from request i's send to its cancel,
 * or -1 when request i is not cancelled. Returns -1 (nothing written)
 * on a fraction outside [0, 1] or a bad within_s. */
int pdx_load_aborts(const struct pdx_load_abort_params *p, double *out);

#endif
