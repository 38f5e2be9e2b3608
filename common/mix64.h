/* splitmix64 (Steele, Lea and Flood; the seeding generator of xoshiro):
 * pdx_mix64 is its finalizer, a bijection of 64-bit words that spreads
 * every input bit over the output, and pdx_splitmix64 the generator
 * (its state advanced by the golden-ratio step). Stable across processes
 * and versions: the reference engine's KV contents, the benchmarks'
 * patterns and the proxy's rendezvous weights are written down in terms
 * of it (docs/engine.md, kernels/kv_kernels.h). The CUDA kernels keep
 * their own device copy. */
#ifndef PDX_COMMON_MIX64_H
#define PDX_COMMON_MIX64_H

#include <stdint.h>

#define PDX_GOLDEN_STEP 0x9e3779b97f4a7c15ull

static inline uint64_t pdx_mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline uint64_t pdx_splitmix64(uint64_t *state)
{
	*state += PDX_GOLDEN_STEP;
	return pdx_mix64(*state);
}

#endif
