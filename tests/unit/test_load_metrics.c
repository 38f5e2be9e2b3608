/* pdx-bench metrics against hand-computed values (vllm's definitions). */
#include "bench/load_metrics.h"
#include "tests/check.h"

#include <math.h>

#define CHECK_NEAR(a, b)                                                       \
	do {                                                                   \
		double _a = (a), _b = (b);                                     \
		if (fabs(_a - _b) > 1e-6 * (1 + fabs(_b))) {                   \
			fprintf(stderr,                                        \
				"%s:%d: %s == %s failed: %.9g != %.9g\n",      \
				__FILE__, __LINE__, #a, #b, _a, _b);           \
			check_failures++;                                      \
		}                                                              \
	} while (0)

static double itl0[] = {0.1, 0.1, 0.2}, itl3[] = {0.5, 0.5};

/* r0: 4 chunks, 5 tokens (usage); r1: one token; r2: failed; r3: 3
 * chunks, 3 tokens. */
static struct pdx_load_result res[] = {
    {.success = true,
     .start = 0.0,
     .ttft = 0.1,
     .latency = 0.5,
     .itl = itl0,
     .n_itl = 3,
     .prompt_len = 10,
     .output_tokens = 5},
    {.success = true,
     .start = 0.2,
     .ttft = 0.3,
     .latency = 0.3,
     .prompt_len = 20,
     .output_tokens = 1,
     .queue = 0.1},
    {.success = false, .start = 0.3, .prompt_len = 40},
    {.success = true,
     .start = 0.5,
     .ttft = 0.2,
     .latency = 1.2,
     .itl = itl3,
     .n_itl = 2,
     .prompt_len = 30,
     .output_tokens = 3,
     .queue = 0.3},
};

static void test_percentile(void)
{
	double v[] = {1, 2, 3, 4};

	/* numpy.percentile, linear interpolation. */
	CHECK_NEAR(pdx_load_percentile(v, 4, 25), 1.75);
	CHECK_NEAR(pdx_load_percentile(v, 4, 50), 2.5);
	CHECK_NEAR(pdx_load_percentile(v, 4, 99), 3.97);
	CHECK_NEAR(pdx_load_percentile(v, 4, 0), 1);
	CHECK_NEAR(pdx_load_percentile(v, 4, 100), 4);
	CHECK_NEAR(pdx_load_percentile(v, 1, 90), 1);
	CHECK_NEAR(pdx_load_percentile(v, 0, 90), 0);
}

static void test_compute(void)
{
	double pcts[] = {50, 90, 99};
	struct pdx_load_goodput g = {0};
	struct pdx_load_metrics m;

	CHECK_EQ(pdx_load_metrics_compute(res, 4, 2.0, pcts, 3, NULL, &m), 0);
	CHECK_EQ(m.completed, 3);
	CHECK_EQ(m.failed, 1);
	CHECK_EQ(m.total_input, 60); /* failed requests do not count */
	CHECK_EQ(m.total_output, 9);
	CHECK_NEAR(m.request_throughput, 1.5);
	CHECK_NEAR(m.output_throughput, 4.5);
	CHECK_NEAR(m.total_token_throughput, 34.5);
	CHECK_NEAR(m.request_goodput, 0);

	/* TTFT {0.1, 0.3, 0.2} s. */
	CHECK_NEAR(m.ttft.mean, 200);
	CHECK_NEAR(m.ttft.median, 200);
	CHECK_NEAR(m.ttft.std, sqrt(0.02 / 3) * 1000);
	CHECK_NEAR(m.ttft.pct[0], 200);
	CHECK_NEAR(m.ttft.pct[1], 280);
	CHECK_NEAR(m.ttft.pct[2], 298);
	/* TPOT: (0.5 - 0.1) / 4 and (1.2 - 0.2) / 2; r1 (1 token) has none. */
	CHECK_NEAR(m.tpot.mean, 300);
	CHECK_NEAR(m.tpot.median, 300);
	CHECK_NEAR(m.tpot.std, 200);
	CHECK_NEAR(m.tpot.pct[1], 460);
	/* ITL pooled: {0.1, 0.1, 0.2, 0.5, 0.5}. */
	CHECK_NEAR(m.itl.mean, 280);
	CHECK_NEAR(m.itl.median, 200);
	CHECK_NEAR(m.itl.pct[1], 500);
	/* E2EL {0.5, 0.3, 1.2}. */
	CHECK_NEAR(m.e2el.mean, 2000.0 / 3);
	CHECK_NEAR(m.e2el.median, 500);
	/* Client queue {0, 0.1, 0.3}; with E2EL {0.5, 0.4, 1.5}. */
	CHECK_NEAR(m.client_queue_time.mean, 400.0 / 3);
	CHECK_NEAR(m.e2el_including_client_queue.median, 500);
	CHECK_NEAR(m.e2el_including_client_queue.mean, 800);
	/* Peaks: chunks at 0.1 0.2 0.3 0.5 | 0.5 | 0.7 1.2 1.7 -> 6 in the
	 * first second; r0 ends at 0.5 as r3 starts: 2 at once. */
	CHECK_NEAR(m.max_output_tokens_per_s, 6);
	CHECK_EQ(m.max_concurrent_requests, 2);

	/* Goodput: r0 meets ttft 250 and tpot 200; r1 misses ttft; r3
	 * misses tpot. */
	g.ttft = g.tpot = true;
	g.ttft_ms = 250;
	g.tpot_ms = 200;
	CHECK_EQ(pdx_load_metrics_compute(res, 4, 2.0, pcts, 3, &g, &m), 0);
	CHECK_EQ(m.good, 1);
	CHECK_NEAR(m.request_goodput, 0.5);
	/* A one-token request's TPOT counts as 0 for goodput; SLOs are
	 * inclusive (metric <= SLO). */
	g = (struct pdx_load_goodput){
	    .tpot = true, .tpot_ms = 0, .e2el = true, .e2el_ms = 300};
	CHECK_EQ(pdx_load_metrics_compute(res, 4, 2.0, pcts, 3, &g, &m), 0);
	CHECK_EQ(m.good, 1);

	/* Nothing completed: zeros, not NaN. */
	CHECK_EQ(pdx_load_metrics_compute(&res[2], 1, 1.0, pcts, 3, NULL, &m),
		 0);
	CHECK_EQ(m.completed, 0);
	CHECK_EQ(m.failed, 1);
	CHECK_NEAR(m.ttft.mean, 0);
	CHECK_NEAR(m.itl.pct[2], 0);
}

static void test_parse(void)
{
	struct pdx_load_goodput g = {0};
	double p[PDX_LOAD_MAX_PCTS];
	char err[128];
	size_t n;

	CHECK_EQ(
	    pdx_load_goodput_parse("ttft:500 tpot:50", &g, err, sizeof(err)),
	    0);
	CHECK(g.ttft && g.tpot && !g.e2el);
	CHECK_NEAR(g.ttft_ms, 500);
	CHECK_NEAR(g.tpot_ms, 50);
	CHECK_EQ(pdx_load_goodput_parse("e2el:1.5e3", &g, err, sizeof(err)), 0);
	CHECK(g.e2el && g.e2el_ms == 1500);
	CHECK_EQ(pdx_load_goodput_parse("itl:5", &g, err, sizeof(err)), -1);
	CHECK_STR_CONTAINS(err, "itl");
	CHECK_EQ(pdx_load_goodput_parse("ttft:-1", &g, err, sizeof(err)), -1);
	CHECK_EQ(pdx_load_goodput_parse("ttft", &g, err, sizeof(err)), -1);
	CHECK_EQ(pdx_load_goodput_parse("ttft:5x", &g, err, sizeof(err)), -1);

	CHECK_EQ(pdx_load_percentiles_parse("50,90,99.9", p, 16, &n), 0);
	CHECK_EQ(n, 3);
	CHECK_NEAR(p[2], 99.9);
	CHECK_EQ(pdx_load_percentiles_parse("101", p, 16, &n), -1);
	CHECK_EQ(pdx_load_percentiles_parse("50,", p, 16, &n), -1);
	CHECK_EQ(pdx_load_percentiles_parse("x", p, 16, &n), -1);
}

int main(void)
{
	test_percentile();
	test_compute();
	test_parse();
	CHECK_DONE();
}
