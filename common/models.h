/* Model shapes: what the synthetic engines, pdx-xferbench and pdx-bench
 * agree a named model looks like.
 *
 * The KV fields describe the paged cache (see include/pdx/layout.h); the
 * rest feed the reference engine's tokenizer and compute-time model. The
 * table is static and read-only: any thread may call these.
 */
#ifndef PDX_COMMON_MODELS_H
#define PDX_COMMON_MODELS_H

#include <stdint.h>

struct pdx_model {
	const char *name;
	/* KV cache shape */
	uint32_t layers;
	uint32_t tensors;      /* 2: K and V; 1: one MLA tensor */
	uint32_t kv_heads;
	uint32_t head_dim;
	uint32_t dtype_bytes;
	uint32_t block_tokens; /* tokens per paged block */
	/* the rest of the model, for tokens and compute time */
	uint32_t vocab;        /* token ids are < vocab */
	uint32_t hidden;       /* query heads * head_dim: attention width */
	uint64_t params;       /* weights, all of them (embeddings included) */
	uint64_t active;       /* weights one token goes through: less than
				* params in a mixture of experts (only the
				* routed experts run); 0: all of them */
};

/* NULL when the name is unknown (or NULL). */
const struct pdx_model *pdx_model_find(const char *name);

/* "llama3-8b|...|tiny": the names in table order, for usage texts. */
const char *pdx_model_names(void);

/* The i-th model of the table, NULL past the end: for listing them. */
const struct pdx_model *pdx_model_at(unsigned i);

#endif
