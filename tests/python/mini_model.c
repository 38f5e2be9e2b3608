/* pdx-engine's model and request parsing for tests/python/mini_vllm.py,
 * through ctypes: flat calls over engine/synth_model.c, engine/tokenizer.c
 * and engine/openai.c, so the harness computes the same KV bytes, tokens
 * and prompts as pdx-engine without a second copy of any of them. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/models.h"
#include "engine/openai.h"
#include "engine/synth_model.h"
#include "engine/tokenizer.h"

#define EXPORT __attribute__((visibility("default")))

/* The model's shape: layers, tensors, kv_heads, head_dim, dtype_bytes,
 * block_tokens, vocab. -1 when the name is unknown. */
EXPORT int pdx_mv_model(const char *name, uint32_t out[7])
{
	const struct pdx_model *m = pdx_model_find(name);

	if (!m)
		return -1;
	out[0] = m->layers;
	out[1] = m->tensors;
	out[2] = m->kv_heads;
	out[3] = m->head_dim;
	out[4] = m->dtype_bytes;
	out[5] = m->block_tokens;
	out[6] = m->vocab;
	return 0;
}

EXPORT int pdx_mv_layout_check(const struct pdx_kv_layout *l)
{
	return pdx_synth_layout_check(l);
}

/* Writes positions [a, b) of one layer of one sequence; the pool holds
 * the model's heads from head0 on (a tensor-parallel rank's). */
EXPORT void pdx_mv_fill(const struct pdx_kv_layout *l, uint8_t *base,
			const uint32_t *blocks, const uint64_t *hash,
			uint32_t layer, uint32_t a, uint32_t b, uint32_t head0)
{
	struct pdx_synth_seq s = {.layout = l,
				  .base = base,
				  .blocks = blocks,
				  .hash = hash,
				  .head0 = head0};

	pdx_synth_fill(&s, layer, a, b);
}

EXPORT uint32_t pdx_mv_next_token(const struct pdx_kv_layout *l,
				  uint8_t *base, const uint32_t *blocks,
				  uint32_t n, uint32_t vocab)
{
	struct pdx_synth_seq s = {
	    .layout = l, .base = base, .blocks = blocks};

	return pdx_synth_next_token(&s, n, vocab);
}

/* -1 when positions [a, b) all hold their KV, else the first that does
 * not. */
EXPORT int64_t pdx_mv_check(const struct pdx_kv_layout *l, uint8_t *base,
			    const uint32_t *blocks, const uint64_t *hash,
			    uint32_t a, uint32_t b, uint32_t head0)
{
	struct pdx_synth_seq s = {.layout = l,
				  .base = base,
				  .blocks = blocks,
				  .hash = hash,
				  .head0 = head0};
	uint32_t bad;

	return pdx_synth_check(&s, a, b, &bad) ? -1 : (int64_t)bad;
}

/* A completion body as pdx-engine reads it (pdx_oai_parse): the prompt's
 * token ids (the first cap of *n_prompt), max_tokens, stream and
 * include_usage in opts[0..2]. 0, or -1 with the HTTP status, the
 * parameter at fault and the message. */
EXPORT int pdx_mv_parse(const char *body, size_t len, bool chat,
			const char *model, uint32_t vocab,
			uint32_t max_model_len, uint32_t *tokens, size_t cap,
			uint32_t *n_prompt, uint32_t opts[3], int *status,
			char *param, size_t param_len, char *msg,
			size_t msg_len)
{
	struct pdx_oai_limits lim = { model, vocab, max_model_len };
	struct pdx_oai_req req;
	struct pdx_oai_error err;

	memset(&err, 0, sizeof(err));
	if (pdx_oai_parse(body, len, chat, &lim, &req, &err)) {
		*status = err.status;
		snprintf(param, param_len, "%s", err.param);
		snprintf(msg, msg_len, "%s", err.message);
		return -1;
	}
	*n_prompt = req.n_prompt;
	memcpy(tokens, req.prompt,
	       (req.n_prompt < cap ? req.n_prompt : cap) * sizeof(*tokens));
	opts[0] = req.max_tokens;
	opts[1] = req.stream;
	opts[2] = req.include_usage;
	pdx_oai_req_clear(&req);
	return 0;
}
