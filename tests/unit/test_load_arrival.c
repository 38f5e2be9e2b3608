/* pdx-bench arrival times: vllm's gamma gaps and rescaling, and one
 * arrival per multi-round session. */
#include "bench/load_arrival.h"
#include "tests/check.h"

#include <math.h>
#include <stdlib.h>

#define N 20000

/* Coefficient of variation of the gaps (std / mean). */
static double gap_cv(const double *t, size_t n)
{
	double sum = 0, sq = 0, g, mean;
	size_t i;

	for (i = 0; i < n; i++) {
		g = t[i] - (i ? t[i - 1] : 0.0);
		sum += g;
		sq += g * g;
	}
	mean = sum / n;
	return sqrt(sq / n - mean * mean) / mean;
}

/* Sessions of 3, 1 and 2 requests get the arrivals three stand-alone
 * requests would; with no follower it is pdx_load_arrivals() itself. */
static void test_sessions(void)
{
	struct pdx_load_arrival_params ap = {
	    .n = 3, .rate = 2.0, .burstiness = 1.0, .seed = 11};
	bool follows[6] = {true, true, true, false, false, true};
	double starts[3], a[6], b[6];
	size_t i;

	CHECK_EQ(pdx_load_arrivals(&ap, starts), 0);
	ap.n = 6;
	CHECK_EQ(pdx_load_session_arrivals(&ap, follows, a), 0);
	CHECK(a[0] == starts[0] && a[1] == starts[0] && a[2] == starts[0]);
	CHECK(a[3] == starts[1]);
	CHECK(a[4] == starts[2] && a[5] == starts[2]);
	CHECK(fabs(a[5] - 3 / 2.0) < 1e-9); /* last session at n / rate */

	CHECK_EQ(pdx_load_arrivals(&ap, b), 0);
	CHECK_EQ(pdx_load_session_arrivals(&ap, NULL, a), 0);
	CHECK(!memcmp(a, b, sizeof(a)));
	for (i = 0; i < 6; i++)
		follows[i] = false;
	CHECK_EQ(pdx_load_session_arrivals(&ap, follows, a), 0);
	CHECK(!memcmp(a, b, sizeof(a)));
	ap.rate = -1.0;
	CHECK_EQ(pdx_load_session_arrivals(&ap, follows, a), -1);
}

int main(void)
{
	struct pdx_load_arrival_params ap = {
	    .n = N, .rate = 10.0, .burstiness = 1.0, .seed = 3};
	double *a = calloc(N, sizeof(double)), *b = calloc(N, sizeof(double));
	double bursts[] = {0.25, 1.0, 4.0}, cv;
	size_t i, k, diff;

	/* The last arrival lands exactly at n / rate; the mean rate is the
	 * rate asked for; arrivals never go backwards; the first request
	 * waits one gap, as in vllm. */
	CHECK_EQ(pdx_load_arrivals(&ap, a), 0);
	CHECK(fabs(a[N - 1] - N / 10.0) < 1e-9);
	CHECK(a[0] > 0.0);
	for (i = 1; i < N; i++)
		CHECK(a[i] >= a[i - 1]);
	CHECK(fabs(a[N / 2] - N / 20.0) < 0.05 * N / 20.0);

	/* Deterministic for a seed. */
	CHECK_EQ(pdx_load_arrivals(&ap, b), 0);
	CHECK(!memcmp(a, b, N * sizeof(double)));
	ap.seed = 4;
	CHECK_EQ(pdx_load_arrivals(&ap, b), 0);
	for (i = 0, diff = 0; i < N; i++)
		diff += a[i] != b[i];
	CHECK(diff > N / 2);

	/* Gamma gaps of shape k have CV 1/sqrt(k): 2 (bursty), 1 (Poisson),
	 * 0.5 (smoother). */
	for (k = 0; k < 3; k++) {
		ap.burstiness = bursts[k];
		CHECK_EQ(pdx_load_arrivals(&ap, a), 0);
		cv = gap_cv(a, N);
		if (fabs(cv - 1.0 / sqrt(bursts[k])) > 0.08 / sqrt(bursts[k])) {
			fprintf(stderr, "burstiness %g: cv %g\n", bursts[k],
				cv);
			check_failures++;
		}
		CHECK(fabs(a[N - 1] - N / 10.0) < 1e-9);
	}

	/* burstiness inf: even gaps of 1/rate. */
	ap.n = 5;
	ap.rate = 4.0;
	ap.burstiness = INFINITY;
	CHECK_EQ(pdx_load_arrivals(&ap, a), 0);
	for (i = 0; i < 5; i++)
		CHECK(fabs(a[i] - (i + 1) * 0.25) < 1e-12);

	/* rate inf: everything at time 0. */
	ap.rate = INFINITY;
	ap.burstiness = 1.0;
	CHECK_EQ(pdx_load_arrivals(&ap, a), 0);
	for (i = 0; i < 5; i++)
		CHECK(a[i] == 0.0);

	ap.rate = 0.0;
	CHECK_EQ(pdx_load_arrivals(&ap, a), -1);
	ap.rate = 1.0;
	ap.burstiness = -1.0;
	CHECK_EQ(pdx_load_arrivals(&ap, a), -1);
	free(a);
	free(b);
	test_sessions();
	CHECK_DONE();
}
