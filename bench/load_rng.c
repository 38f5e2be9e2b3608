#include "bench/load_rng.h"

#include "common/mix64.h"

#include <math.h>

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

void pdx_load_rng_seed(struct pdx_load_rng *r, uint64_t seed, uint64_t stream)
{
	uint64_t x = seed ^ (stream * 0xd1342543de82ef95ULL);
	int i;

	for (i = 0; i < 4; i++)
		r->s[i] = pdx_splitmix64(&x);
}

uint64_t pdx_load_rng_next(struct pdx_load_rng *r)
{
	uint64_t *s = r->s;
	uint64_t result = rotl(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

double pdx_load_rng_double(struct pdx_load_rng *r)
{
	return (double)(pdx_load_rng_next(r) >> 11) * 0x1.0p-53;
}

int64_t pdx_load_rng_range(struct pdx_load_rng *r, int64_t lo, int64_t hi)
{
	uint64_t span, limit, x;

	if (hi <= lo)
		return lo;
	span = (uint64_t)(hi - lo) + 1;
	if (span == 0) /* the whole 64-bit range */
		return (int64_t)pdx_load_rng_next(r);
	/* Reject the top sliver so every value is equally likely. */
	limit = UINT64_MAX - UINT64_MAX % span;
	do {
		x = pdx_load_rng_next(r);
	} while (x >= limit);
	return lo + (int64_t)(x % span);
}

double pdx_load_rng_normal(struct pdx_load_rng *r)
{
	double u, v, s;

	/* Marsaglia's polar method; the second variate is dropped so each
	 * call consumes a fresh, reproducible amount of the stream. */
	do {
		u = 2.0 * pdx_load_rng_double(r) - 1.0;
		v = 2.0 * pdx_load_rng_double(r) - 1.0;
		s = u * u + v * v;
	} while (s >= 1.0 || s == 0.0);
	return u * sqrt(-2.0 * log(s) / s);
}

/* Marsaglia and Tsang (2000) for shape >= 1; shape < 1 through
 * Gamma(shape + 1) * U^(1/shape). */
double pdx_load_rng_gamma(struct pdx_load_rng *r, double shape, double scale)
{
	double d, c, x, v, u;

	if (shape < 1.0) {
		u = pdx_load_rng_double(r);
		while (u == 0.0)
			u = pdx_load_rng_double(r);
		return pdx_load_rng_gamma(r, shape + 1.0, scale) *
		       pow(u, 1.0 / shape);
	}
	d = shape - 1.0 / 3.0;
	c = 1.0 / sqrt(9.0 * d);
	for (;;) {
		do {
			x = pdx_load_rng_normal(r);
			v = 1.0 + c * x;
		} while (v <= 0.0);
		v = v * v * v;
		u = pdx_load_rng_double(r);
		if (u < 1.0 - 0.0331 * x * x * x * x)
			return d * v * scale;
		if (u > 0.0 && log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
			return d * v * scale;
	}
}

void pdx_load_rng_shuffle(struct pdx_load_rng *r, void *base, size_t n,
			  size_t size)
{
	unsigned char *p = base, *a, *b, t;
	size_t i, j, k;

	for (i = n; i > 1; i--) {
		j = (size_t)pdx_load_rng_range(r, 0, (int64_t)i - 1);
		a = p + (i - 1) * size;
		b = p + j * size;
		for (k = 0; k < size && a != b; k++) {
			t = a[k];
			a[k] = b[k];
			b[k] = t;
		}
	}
}
