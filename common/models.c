/* The model table. Shapes are those of the published configs
 * (config.json on the Hugging Face hub): llama3-8b is
 * Meta-Llama-3-8B, qwen2-7b is Qwen2-7B, llama3-70b is Meta-Llama-3-70B,
 * deepseek-v3 is deepseek-ai/DeepSeek-V3; params are their total weight
 * counts. tiny is invented: small enough that tests fill and check its
 * KV cache in microseconds.
 *
 * deepseek-v3 keeps MLA's cache: per layer and token one latent vector,
 * kv_lora_rank 512 compressed KV followed by qk_rope_head_dim 64 of
 * rotary key, 576 bf16 values (the one "head" of kv_heads 1, as vLLM and
 * SGLang store it); num_hidden_layers 61, vocab_size 129280. hidden is
 * num_attention_heads 128 x 576: in the absorbed form FlashMLA runs every
 * query head scores against the whole latent. params 671026419200 is
 * the main model counted from the config (embeddings and lm_head untied,
 * 3 dense layers of intermediate_size 18432, 58 MoE layers of 256 routed
 * and 1 shared experts of 2048, MLA projections; the hub's 685B adds the
 * 14B multi-token-prediction module, which decoding without speculation
 * does not run); active 37552297472 is the same count with 8 routed
 * experts a token. 64-token blocks: FlashMLA's only block size, and
 * vLLM's for MLA on GPUs. */
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
	{ .name = "deepseek-v3", .layers = 61, .tensors = 1, .kv_heads = 1,
	  .head_dim = 576, .dtype_bytes = 2, .block_tokens = 64,
	  .vocab = 129280, .hidden = 73728, .params = 671026419200ULL,
	  .active = 37552297472ULL },
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
	return "llama3-8b|qwen2-7b|llama3-70b|deepseek-v3|tiny";
}

const struct pdx_model *pdx_model_at(unsigned i)
{
	return i < N_MODELS ? &models[i] : NULL;
}
