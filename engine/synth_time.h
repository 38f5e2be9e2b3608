/* The synthetic model's compute time: how long a forward pass would take
 * on one GPU, so the reference engine sleeps as long as a real one works.
 *
 * A step (one forward pass over a batch of prefill chunks and decode
 * tokens) is a roofline: the longer of its FLOPs at the effective compute
 * rate and its bytes at the effective memory bandwidth, times scale.
 *   FLOPs = 2 * params * tokens + 4 * hidden * layers * attn_pairs
 *   bytes = params * dtype_bytes + kv_tokens * KV bytes per token
 * (all layers and tensors; params: the active ones of a mixture of
 * experts). Long prefills come out compute-bound, decode
 * steps and short prefills memory-bound, as on real GPUs. Each layer takes
 * an equal share, step / layers. The defaults are one H100 SXM; their
 * derivation is in docs/engine.md.
 *
 * Pure functions; any thread may call them.
 */
#ifndef PDX_ENGINE_SYNTH_TIME_H
#define PDX_ENGINE_SYNTH_TIME_H

#include <stdint.h>

#include "common/models.h"

/* Zero fields mean the defaults. */
struct pdx_synth_gpu {
	double flops;     /* peak dense FLOP/s at the model's dtype: 989e12 */
	double flops_eff; /* share of it a prefill reaches: 0.5 */
	double mem_bw;    /* bytes/s: 3.35e12 */
	double mem_eff;   /* share of it a decode step reaches: 0.7 */
	double scale;     /* multiplies every time: 1 */
};

/* What one step computes; start from zero and add sequences to it. */
struct pdx_synth_work {
	uint64_t tokens;     /* tokens that go through the layers */
	uint64_t attn_pairs; /* (query, key) pairs attention scores */
	uint64_t kv_tokens;  /* tokens whose KV attention reads */
};

/* Adds a prefill chunk of n new tokens after `cached` tokens already in
 * the KV cache (a prefix hit, or earlier chunks). */
void pdx_synth_work_prefill(struct pdx_synth_work *w, uint64_t cached,
			    uint64_t n);

/* Adds one decode token of a sequence that is `context` tokens long,
 * the new one included. */
void pdx_synth_work_decode(struct pdx_synth_work *w, uint64_t context);

/* Nanoseconds the step takes, all layers; 0 for an empty step. g may be
 * NULL: the defaults. */
uint64_t pdx_synth_step_ns(const struct pdx_model *m,
			   const struct pdx_synth_gpu *g,
			   const struct pdx_synth_work *w);

#endif
