/* Tensor parallelism's split of the KV cache: which KV heads one rank of
 * an instance of TP size n holds. Rank r of n holds heads [r * k / n,
 * (r + 1) * k / n) of the model's k, as vLLM and SGLang split GQA KV over
 * their ranks; a model with one latent tensor a layer (MLA) has no heads
 * to split, and every rank holds the whole latent (replicated, as both
 * replicate it).
 *
 * Pure; any thread.
 */
#ifndef PDX_ENGINE_TP_SLICE_H
#define PDX_ENGINE_TP_SLICE_H

#include <stddef.h>
#include <stdint.h>

#include "common/models.h"

/* The largest TP size an instance may have. */
#define PDX_TP_MAX 16

struct pdx_tp_slice {
	uint32_t head0; /* the first of its heads in the whole model's */
	uint32_t heads; /* how many */
	struct pdx_model model; /* m with kv_heads = heads: its pool's shape */
};

/* The slice of model m that rank `rank` of `size` holds. -1 with the
 * reason in err when size is not a power of two in [1, PDX_TP_MAX], rank
 * is not below it, or m's KV heads do not split evenly over size. */
int pdx_tp_slice(const struct pdx_model *m, uint32_t size, uint32_t rank,
		 struct pdx_tp_slice *out, char *err, size_t errlen);

#endif
