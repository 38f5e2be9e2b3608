/* A small deterministic generator for tests (xorshift64): the same cases
 * on every run, seeded per test file. */
#ifndef PDX_TESTS_RNG_H
#define PDX_TESTS_RNG_H

#include <stdint.h>

struct test_rng {
	uint64_t s; /* never 0 */
};

static inline uint64_t test_rnd(struct test_rng *r)
{
	r->s ^= r->s << 13;
	r->s ^= r->s >> 7;
	r->s ^= r->s << 17;
	return r->s;
}

/* One of v[0..n). */
static inline uint32_t test_pick(struct test_rng *r, const uint32_t *v, int n)
{
	return v[test_rnd(r) % (uint64_t)n];
}

#endif
