/* The console block and result JSON: vllm bench serve's labels and keys. */
#include "bench/load_report.h"
#include "tests/check.h"

#include <math.h>
#include <stdlib.h>

static const char *const want_keys[] = {
    "date",
    "endpoint_type",
    "backend",
    "label",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "latencies",
    "queue_times",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "mean_ttft_ms",
    "median_ttft_ms",
    "std_ttft_ms",
    "p99_ttft_ms",
    "p50_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "std_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "std_itl_ms",
    "p99_itl_ms",
    "p99.9_itl_ms",
};

static double itl[] = {0.01, 0.02};
static struct pdx_load_result res[] = {
    {.success = true,
     .ttft = 0.05,
     .latency = 0.08,
     .itl = itl,
     .n_itl = 2,
     .prompt_len = 10,
     .output_tokens = 3},
    {.success = false, .prompt_len = 10},
};

static char *print(const struct pdx_load_report *r)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	pdx_load_report_print(f, r);
	fclose(f);
	return buf;
}

static struct pdx_load_report base(const struct pdx_load_metrics *m,
				   const double *pcts, size_t npct)
{
	struct pdx_load_report r = {0};

	r.m = m;
	r.duration_s = 1.0;
	r.request_rate = INFINITY;
	r.burstiness = 1.0;
	r.metrics = PDX_LOAD_M_DEFAULT;
	r.pcts = pcts;
	r.npct = npct;
	r.date = "20250101-000000";
	r.backend = "openai";
	r.model_id = "m";
	r.num_prompts = 2;
	r.res = res;
	r.n_res = 2;
	return r;
}

static void test_console(void)
{
	double pcts[] = {99};
	struct pdx_load_metrics m;
	struct pdx_load_report r;
	char *out;

	CHECK_EQ(pdx_load_metrics_compute(res, 2, 1.0, pcts, 1, NULL, &m), 0);
	r = base(&m, pcts, 1);
	out = print(&r);
	CHECK(!strncmp(out,
		       "============ Serving Benchmark Result "
		       "============\n",
		       51));
	/* "{:<40} {:<10}" rows. */
	CHECK_STR_CONTAINS(out, "\nSuccessful requests:                     "
				"1         \n");
	CHECK_STR_CONTAINS(out, "\nFailed requests:                         "
				"1         \n");
	CHECK_STR_CONTAINS(out, "\nBenchmark duration (s):                  "
				"1.00      \n");
	CHECK_STR_CONTAINS(out, "\nTotal input tokens:");
	CHECK_STR_CONTAINS(out, "\nTotal generated tokens:");
	CHECK_STR_CONTAINS(out, "\nRequest throughput (req/s):");
	CHECK_STR_CONTAINS(out, "\nOutput token throughput (tok/s):");
	CHECK_STR_CONTAINS(out, "\nPeak output token throughput (tok/s):");
	CHECK_STR_CONTAINS(out, "\nPeak concurrent requests:");
	CHECK_STR_CONTAINS(out, "\nTotal token throughput (tok/s):");
	CHECK_STR_CONTAINS(out, "\n---------------Time to First Token"
				"----------------\n");
	CHECK_STR_CONTAINS(out, "\n-----Time per Output Token (excl. 1st "
				"token)------\n");
	CHECK_STR_CONTAINS(out, "\n---------------Inter-token Latency"
				"----------------\n");
	CHECK_STR_CONTAINS(out, "\nMean TTFT (ms):                          "
				"50.00     \n");
	CHECK_STR_CONTAINS(out, "\nMedian TPOT (ms):");
	CHECK_STR_CONTAINS(out, "\nP99 ITL (ms):");
	CHECK(strstr(out, "Request goodput") == NULL);
	CHECK(strstr(out, "Maximum request concurrency") == NULL);
	CHECK(strstr(out, "Request rate configured") == NULL);
	CHECK(strstr(out, "E2EL") == NULL);
	CHECK(!strcmp(out + strlen(out) - 51,
		      "==================================================\n"));
	free(out);

	/* Optional rows appear with their options. */
	r.goodput = true;
	r.max_concurrency = 4;
	r.request_rate = 2.5;
	r.metrics |= PDX_LOAD_M_E2EL | PDX_LOAD_M_CLIENT_QUEUE;
	out = print(&r);
	CHECK_STR_CONTAINS(out, "\nRequest goodput (req/s):");
	CHECK_STR_CONTAINS(out, "\nMaximum request concurrency:             "
				"4         \n");
	CHECK_STR_CONTAINS(out, "\nRequest rate configured (RPS):           "
				"2.50      \n");
	CHECK_STR_CONTAINS(out, "\n----------------End-to-end Latency"
				"----------------\n");
	CHECK_STR_CONTAINS(out, "\nMean Client Queue Time (ms):");
	free(out);
}

static void test_json(void)
{
	double pcts[] = {99, 50, 99.9};
	struct pdx_load_metrics m;
	struct pdx_load_report r;
	json_t *j;
	size_t i;

	CHECK_EQ(pdx_load_metrics_compute(res, 2, 1.0, pcts, 3, NULL, &m), 0);
	r = base(&m, pcts, 3);
	j = pdx_load_report_json(&r);
	CHECK(j != NULL);
	for (i = 0; i < sizeof(want_keys) / sizeof(want_keys[0]); i++)
		if (!json_object_get(j, want_keys[i])) {
			fprintf(stderr, "missing key %s\n", want_keys[i]);
			check_failures++;
		}
	CHECK(!strcmp(json_string_value(json_object_get(j, "request_rate")),
		      "inf"));
	CHECK(json_is_null(json_object_get(j, "request_goodput")));
	CHECK(json_is_null(json_object_get(j, "max_concurrency")));
	CHECK_EQ(json_integer_value(json_object_get(j, "completed")), 1);
	CHECK_EQ(json_integer_value(json_object_get(j, "total_input_tokens")),
		 10);
	CHECK(fabs(json_real_value(json_object_get(j, "mean_ttft_ms")) - 50) <
	      1e-9);
	CHECK(json_array_size(json_object_get(j, "latencies")) == 2);
	/* e2el is not selected by default; detailed lists only on demand. */
	CHECK(json_object_get(j, "mean_e2el_ms") == NULL);
	CHECK(json_object_get(j, "ttfts") == NULL);
	json_decref(j);

	r.detailed = true;
	r.goodput = true;
	r.request_rate = 4.0;
	r.max_concurrency = 2;
	j = pdx_load_report_json(&r);
	CHECK(json_array_size(json_object_get(j, "ttfts")) == 2);
	CHECK(json_array_size(json_array_get(json_object_get(j, "itls"), 0)) ==
	      2);
	CHECK(json_array_size(json_object_get(j, "errors")) == 2);
	CHECK(json_is_real(json_object_get(j, "request_goodput")));
	CHECK(json_real_value(json_object_get(j, "request_rate")) == 4.0);
	CHECK_EQ(json_integer_value(json_object_get(j, "max_concurrency")), 2);
	json_decref(j);
}

/* Client aborts (--abort-fraction): neither completed nor failed, left
 * out of the latencies, a row and a key of their own only when asked
 * for, so a run without them prints what vllm prints. */
static void test_aborted(void)
{
	struct pdx_load_result ab[] = {
	    res[0],
	    res[1],
	    {.aborted = true, .ttft = 5.0, .latency = 9.0, .prompt_len = 10},
	};
	double pcts[] = {99};
	struct pdx_load_metrics m;
	struct pdx_load_report r;
	json_t *j;
	char *out;

	CHECK_EQ(pdx_load_metrics_compute(ab, 3, 1.0, pcts, 1, NULL, &m), 0);
	CHECK_EQ(m.completed, 1);
	CHECK_EQ(m.failed, 1);
	CHECK_EQ(m.aborted, 1);
	CHECK_EQ(m.total_input, 10);
	CHECK(fabs(m.ttft.mean - 50) < 1e-9);
	CHECK_EQ(m.max_concurrent_requests, 1);
	r = base(&m, pcts, 1);
	r.res = ab;
	r.n_res = 3;
	out = print(&r);
	CHECK(strstr(out, "Aborted") == NULL);
	free(out);
	j = pdx_load_report_json(&r);
	CHECK(json_object_get(j, "aborted") == NULL);
	json_decref(j);

	r.aborts = true;
	out = print(&r);
	CHECK_STR_CONTAINS(out, "\nFailed requests:                         "
				"1         \nAborted requests:                 "
				"       1         \n");
	free(out);
	j = pdx_load_report_json(&r);
	CHECK_EQ(json_integer_value(json_object_get(j, "aborted")), 1);
	CHECK_EQ(json_integer_value(json_object_get(j, "failed")), 1);
	json_decref(j);
}

static void test_names(void)
{
	char b[64];
	unsigned m = 0;

	pdx_load_py_float(10, b, sizeof(b));
	CHECK(!strcmp(b, "10.0"));
	pdx_load_py_float(100, b, sizeof(b));
	CHECK(!strcmp(b, "100.0"));
	pdx_load_py_float(2.5, b, sizeof(b));
	CHECK(!strcmp(b, "2.5"));
	pdx_load_py_float(0.1, b, sizeof(b));
	CHECK(!strcmp(b, "0.1"));
	pdx_load_py_float(INFINITY, b, sizeof(b));
	CHECK(!strcmp(b, "inf"));
	pdx_load_py_float(1e16, b, sizeof(b));
	CHECK(!strcmp(b, "1e+16"));
	pdx_load_py_float(1e-5, b, sizeof(b));
	CHECK(!strcmp(b, "1e-05"));
	pdx_load_pct_word(99, b, sizeof(b));
	CHECK(!strcmp(b, "p99"));
	pdx_load_pct_word(99.9, b, sizeof(b));
	CHECK(!strcmp(b, "p99.9"));
	CHECK_EQ(pdx_load_metric_names_parse("ttft,e2el", &m), 0);
	CHECK_EQ(m, PDX_LOAD_M_TTFT | PDX_LOAD_M_E2EL);
	CHECK_EQ(pdx_load_metric_names_parse("ttft,bogus", &m), -1);
	CHECK_EQ(pdx_load_metric_names_parse("", &m), -1);
}

int main(void)
{
	test_console();
	test_json();
	test_aborted();
	test_names();
	CHECK_DONE();
}
