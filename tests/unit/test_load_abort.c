/* pdx-bench client aborts: which requests are cancelled and when. */
#include "bench/load_abort.h"
#include "tests/check.h"

#include <math.h>
#include <stdlib.h>

#define N 20000

static size_t count(const double *v, size_t n)
{
	size_t i, k = 0;

	for (i = 0; i < n; i++)
		k += v[i] >= 0.0;
	return k;
}

int main(void)
{
	struct pdx_load_abort_params p = {
	    .n = N, .fraction = 0.1, .within_s = 2.0, .seed = 7};
	double *a = calloc(N, sizeof(double)), *b = calloc(N, sizeof(double));
	double sum = 0.0, lo = INFINITY, hi = -INFINITY;
	size_t i, k, diff;

	/* About a tenth of the requests, each after a delay uniform in
	 * [0, 2 s]: mean 1 s, both ends reached. A binomial(20000, 0.1)
	 * has a standard deviation of 42; 200 is more than four of them. */
	CHECK_EQ(pdx_load_aborts(&p, a), 0);
	k = count(a, N);
	CHECK(k > N / 10 - 200 && k < N / 10 + 200);
	for (i = 0; i < N; i++) {
		CHECK(a[i] == -1.0 || (a[i] >= 0.0 && a[i] < 2.0));
		if (a[i] < 0.0)
			continue;
		sum += a[i];
		lo = fmin(lo, a[i]);
		hi = fmax(hi, a[i]);
	}
	CHECK(fabs(sum / k - 1.0) < 0.05);
	CHECK(lo < 0.01 && hi > 1.99);

	/* Deterministic for a seed; another seed picks other requests. */
	CHECK_EQ(pdx_load_aborts(&p, b), 0);
	CHECK(!memcmp(a, b, N * sizeof(double)));
	p.seed = 8;
	CHECK_EQ(pdx_load_aborts(&p, b), 0);
	for (i = 0, diff = 0; i < N; i++)
		diff += (a[i] >= 0.0) != (b[i] >= 0.0);
	CHECK(diff > N / 10);

	/* A larger fraction cancels a superset, each after the same delay;
	 * the delays scale with within_s. */
	p.seed = 7;
	p.fraction = 0.3;
	CHECK_EQ(pdx_load_aborts(&p, b), 0);
	CHECK(count(b, N) > count(a, N));
	for (i = 0; i < N; i++)
		if (a[i] >= 0.0)
			CHECK(b[i] == a[i]);
	p.fraction = 0.1;
	p.within_s = 0.5;
	CHECK_EQ(pdx_load_aborts(&p, b), 0);
	for (i = 0; i < N; i++)
		CHECK((a[i] < 0.0 && b[i] < 0.0) ||
		      fabs(b[i] - a[i] / 4.0) < 1e-12);

	/* 0: none; 1: all; within 0: at once. */
	p.fraction = 0.0;
	CHECK_EQ(pdx_load_aborts(&p, b), 0);
	CHECK_EQ(count(b, N), 0);
	p.fraction = 1.0;
	p.within_s = 0.0;
	CHECK_EQ(pdx_load_aborts(&p, b), 0);
	CHECK_EQ(count(b, N), N);
	for (i = 0; i < N; i++)
		CHECK(b[i] == 0.0);

	/* Bad parameters write nothing. */
	b[0] = 42.0;
	p.fraction = 1.5;
	CHECK_EQ(pdx_load_aborts(&p, b), -1);
	p.fraction = -0.1;
	CHECK_EQ(pdx_load_aborts(&p, b), -1);
	p.fraction = NAN;
	CHECK_EQ(pdx_load_aborts(&p, b), -1);
	p.fraction = 0.5;
	p.within_s = -1.0;
	CHECK_EQ(pdx_load_aborts(&p, b), -1);
	p.within_s = INFINITY;
	CHECK_EQ(pdx_load_aborts(&p, b), -1);
	CHECK(b[0] == 42.0);
	p.within_s = 1.0;
	p.n = 0;
	CHECK_EQ(pdx_load_aborts(&p, NULL), 0);

	free(a);
	free(b);
	CHECK_DONE();
}
