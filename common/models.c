/* The model table. Shapes are those of the published configs
 * (config.json on the Hugging Face hub): llama3-8b is
 * Meta-Llama-3-8B, qwen2-7b is Qwen2-7B, llama3-70b is Meta-Llama-3-70B;
 * params are their total weight counts. tiny is invented: small enough
 * that tests fill and check its KV cache in microseconds. */
#include "common/models.h"

#include <stddef.h>
#include <string.h>

static const struct pdx_model models[] = {
	{ .name = "llama3-8b", .layers = 32, .tensors = 2, .kv_heads = 8,
	  .head_dim = 128, .dtype_bytes = 2, .block_tokens = 16,
	  .vocab = 128256, .hidden = 4096, .params = 8030261248ULL },
	{ .name = "qwen2-7b", .layers = 28, .tensors = 2, .kv_heads = 4,
	  .head_dim = 128, .dtype_bytes = 2, .block_tokens = 16,
	  .vocab = 152064, .hidden = 3584, .params = 7615616512ULL },
	{ .name = "llama3-70b", .layers = 80, .tensors = 2, .kv_heads = 8,
	  .head_dim = 128, .dtype_bytes = 2, .block_tokens = 16,
	  .vocab = 128256, .hidden = 8192, .params = 70553706496ULL },
	{ .name = "tiny", .layers = 4, .tensors = 2, .kv_heads = 2,
	  .head_dim = 16, .dtype_bytes = 2, .block_tokens = 4,
	  .vocab = 1024, .hidden = 64, .params = 1000000 },
};

#define N_MODELS (sizeof(models) / sizeof(models[0]))

const struct pdx_model *pdx_model_find(const char *name)
{
	for (size_t i = 0; i < N_MODELS; i++)
		if (name && strcmp(models[i].name, name) == 0)
			return &models[i];
	return NULL;
}

const char *pdx_model_names(void)
{
	return "llama3-8b|qwen2-7b|llama3-70b|tiny";
}

const struct pdx_model *pdx_model_at(unsigned i)
{
	return i < N_MODELS ? &models[i] : NULL;
}
