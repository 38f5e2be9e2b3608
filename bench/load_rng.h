/* A small seeded random generator for pdx-bench (xoshiro256**), with the
 * draws the load tool needs: uniform integers and reals, normal and gamma
 * variates, a shuffle. Deterministic for a given seed on every platform.
 * Not thread-safe: one generator per user. */
#ifndef PDX_BENCH_LOAD_RNG_H
#define PDX_BENCH_LOAD_RNG_H

#include <stddef.h>
#include <stdint.h>

struct pdx_load_rng {
	uint64_t s[4];
};

/* Seeds from one 64-bit value (expanded through splitmix64); 'stream'
 * separates independent sequences drawn from the same user seed. */
void pdx_load_rng_seed(struct pdx_load_rng *r, uint64_t seed, uint64_t stream);
uint64_t pdx_load_rng_next(struct pdx_load_rng *r);
/* Uniform in [0, 1). */
double pdx_load_rng_double(struct pdx_load_rng *r);
/* Uniform integer in [lo, hi] inclusive, without modulo bias. */
int64_t pdx_load_rng_range(struct pdx_load_rng *r, int64_t lo, int64_t hi);
/* Standard normal. */
double pdx_load_rng_normal(struct pdx_load_rng *r);
/* Gamma(shape, scale): mean shape * scale. shape > 0. */
double pdx_load_rng_gamma(struct pdx_load_rng *r, double shape, double scale);
/* Fisher-Yates shuffle of n elements of 'size' bytes. */
void pdx_load_rng_shuffle(struct pdx_load_rng *r, void *base, size_t n,
			  size_t size);

#endif
