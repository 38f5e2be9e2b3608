/* The model table: the shapes benchmarks and engines agree on. */
#include <string.h>

#include "common/models.h"
#include "tests/check.h"

static void llama3_8b(void)
{
	const struct pdx_model *m = pdx_model_find("llama3-8b");

	CHECK(m != NULL);
	if (!m)
		return;
	CHECK_EQ(m->layers, 32);
	CHECK_EQ(m->tensors, 2);
	CHECK_EQ(m->kv_heads, 8);
	CHECK_EQ(m->head_dim, 128);
	CHECK_EQ(m->dtype_bytes, 2);
	CHECK_EQ(m->block_tokens, 16);
	CHECK_EQ(m->vocab, 128256);
	CHECK_EQ(m->hidden, 4096);
	CHECK(m->params > 8000000000ULL && m->params < 8100000000ULL);
	/* 128 KiB of KV per token: what pdx-xferbench's figures assume */
	CHECK_EQ((uint64_t)m->layers * m->tensors * m->kv_heads * m->head_dim *
			 m->dtype_bytes,
		 131072);
}

/* DeepSeek-V3's MLA cache (deepseek-ai/DeepSeek-V3 config.json):
 * one latent tensor a layer, kv_lora_rank 512 + qk_rope_head_dim 64. */
static void deepseek_v3(void)
{
	const struct pdx_model *m = pdx_model_find("deepseek-v3");

	CHECK(m != NULL);
	if (!m)
		return;
	CHECK_EQ(m->layers, 61);
	CHECK_EQ(m->tensors, 1);
	CHECK_EQ(m->kv_heads, 1);
	CHECK_EQ(m->head_dim, 512 + 64);
	CHECK_EQ(m->dtype_bytes, 2);
	CHECK_EQ(m->block_tokens, 64);
	CHECK_EQ(m->vocab, 129280);
	CHECK_EQ(m->hidden, 128 * 576);
	CHECK_EQ(m->params, 671026419200ULL);
	CHECK_EQ(m->active, 37552297472ULL);
	/* 1152 bytes a layer, 68.6 KiB a token; a block a layer 72 KiB */
	CHECK_EQ((uint64_t)m->layers * m->tensors * m->kv_heads * m->head_dim *
			 m->dtype_bytes,
		 70272);
	CHECK_EQ((uint64_t)m->block_tokens * m->head_dim * m->dtype_bytes,
		 73728);
}

/* Every model is found by its name, listed in the usage text once, and
 * has a shape a pool can hold. */
static void table_and_names(void)
{
	const char *names = pdx_model_names();
	const struct pdx_model *m;
	size_t listed = 1, len = 0;
	unsigned i;

	for (const char *c = names; *c; c++)
		listed += *c == '|';
	for (i = 0; (m = pdx_model_at(i)); i++) {
		const char *at = strstr(names, m->name);
		size_t n = strlen(m->name);

		len += n + (i > 0);
		CHECK(pdx_model_find(m->name) == m);
		CHECK(at && (at == names || at[-1] == '|') &&
		      (at[n] == '|' || at[n] == '\0'));
		CHECK(m->block_tokens * m->kv_heads * m->head_dim *
			      m->dtype_bytes % 8 ==
		      0);
		CHECK(m->vocab > 0 && m->hidden % m->head_dim == 0);
		CHECK(m->params > 0 && m->layers > 0);
		CHECK(m->tensors == 1 || m->tensors == 2);
		CHECK(m->active <= m->params);
	}
	CHECK_EQ(listed, i);
	CHECK_EQ(strlen(names), len);
	CHECK(pdx_model_find("tiny") != NULL);
	CHECK(pdx_model_find("llama3") == NULL);
	CHECK(pdx_model_find(NULL) == NULL);
}

int main(void)
{
	llama3_8b();
	deepseek_v3();
	table_and_names();
	CHECK_DONE();
}
