/* Compute time: the documented H100 figures, and how time grows. */
#include "engine/synth_time.h"
#include "tests/check.h"

static uint64_t prefill_ns(const struct pdx_model *m,
			   const struct pdx_synth_gpu *g, uint64_t cached,
			   uint64_t n)
{
	struct pdx_synth_work w = { 0 };

	pdx_synth_work_prefill(&w, cached, n);
	return pdx_synth_step_ns(m, g, &w);
}

static uint64_t decode_ns(const struct pdx_model *m, uint64_t batch,
			  uint64_t context)
{
	struct pdx_synth_work w = { 0 };

	for (uint64_t i = 0; i < batch; i++)
		pdx_synth_work_decode(&w, context);
	return pdx_synth_step_ns(m, NULL, &w);
}

#define NEAR(v, want) ((v) > (want) * 0.995 && (v) < (want) * 1.005)

/* The numbers docs/engine.md quotes for llama3-8b on one H100. */
static void documented(void)
{
	const struct pdx_model *m = pdx_model_find("llama3-8b");
	uint64_t t;

	t = prefill_ns(m, NULL, 0, 8192);
	CHECK(NEAR(t, 301.6e6));
	t = decode_ns(m, 1, 8192);
	CHECK(NEAR(t, 7.307e6));
	/* a short prompt is bound by reading the weights */
	t = prefill_ns(m, NULL, 0, 16);
	CHECK(NEAR(t, 6.850e6));
}

/* deepseek-v3 on one H100: a decode step reads the 37.6B active
 * weights, not all 671B, and the 8k-token latent cache behind them
 * (docs/engine.md). */
static void mixture_of_experts(void)
{
	const struct pdx_model *m = pdx_model_find("deepseek-v3");

	CHECK(m != NULL);
	if (!m)
		return;
	CHECK(NEAR(decode_ns(m, 1, 8192), 32.27e6));
	CHECK(NEAR(prefill_ns(m, NULL, 0, 8192), 2465.0e6));
}

static void growth(void)
{
	const struct pdx_model *m = pdx_model_find("llama3-8b");

	CHECK(prefill_ns(m, NULL, 0, 4096) < prefill_ns(m, NULL, 0, 8192));
	/* the same chunk costs more after a longer context */
	CHECK(prefill_ns(m, NULL, 4096, 2048) > prefill_ns(m, NULL, 0, 2048));
	CHECK(decode_ns(m, 1, 1024) < decode_ns(m, 1, 8192));
	CHECK(decode_ns(m, 1, 1024) < decode_ns(m, 64, 1024));
	/* batching decode is cheaper than stepping alone */
	CHECK(decode_ns(m, 64, 1024) < 64 * decode_ns(m, 1, 1024));
	CHECK_EQ(decode_ns(m, 0, 1024), 0);
}

/* Chunks of a prompt attend to what the whole prompt does. */
static void chunked(void)
{
	struct pdx_synth_work whole = { 0 }, parts = { 0 };

	pdx_synth_work_prefill(&whole, 100, 8192);
	pdx_synth_work_prefill(&parts, 100, 3000);
	pdx_synth_work_prefill(&parts, 3100, 5192);
	CHECK_EQ(parts.tokens, whole.tokens);
	CHECK_EQ(parts.attn_pairs, whole.attn_pairs);
	CHECK_EQ(whole.attn_pairs, 8192ULL * 100 + 8192ULL * 8193 / 2);
}

static void overrides(void)
{
	const struct pdx_model *m = pdx_model_find("llama3-8b");
	struct pdx_synth_gpu half = { .scale = 0.5 };
	struct pdx_synth_gpu fast = { .flops = 1978e12 };
	struct pdx_synth_gpu zero = { 0 };
	uint64_t t = prefill_ns(m, NULL, 0, 8192);

	CHECK_EQ(prefill_ns(m, &zero, 0, 8192), t);
	CHECK(NEAR(prefill_ns(m, &half, 0, 8192), t / 2.0));
	CHECK(NEAR(prefill_ns(m, &fast, 0, 8192), t / 2.0));
	/* memory-bound steps do not care about FLOPs */
	CHECK_EQ(prefill_ns(m, &fast, 0, 16), prefill_ns(m, NULL, 0, 16));
}

/* tiny is fast: a whole request in well under a millisecond. */
static void tiny(void)
{
	const struct pdx_model *m = pdx_model_find("tiny");

	CHECK(prefill_ns(m, NULL, 0, 256) < 100000);
	CHECK(decode_ns(m, 8, 256) < 100000);
	CHECK(prefill_ns(m, NULL, 0, 256) > 0);
}

int main(void)
{
	documented();
	mixture_of_experts();
	growth();
	chunked();
	overrides();
	tiny();
	CHECK_DONE();
}
