/* The reference engine's request parsing (engine/openai.c): the JSON body
 * of /v1/completions or /v1/chat/completions (the first byte picks which
 * and the model's limits), with kv_transfer_params (engine/kv_params.c).
 * What it accepts must respect the limits; what it refuses must have an
 * error body a client can read; the answers built for an accepted request
 * must be JSON. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/http_error.h"
#include "engine/openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_json(char *s)
{
	json_t *o;

	if (!s)
		abort();
	o = json_loads(s, 0, NULL);
	if (!json_is_object(o))
		abort();
	json_decref(o);
	free(s);
}

static void answers(const struct pdx_oai_req *r)
{
	struct pdx_oai_meta m = {.chat = r->chat,
				 .id = "cmpl-fuzz",
				 .created = 1,
				 .model = "fuzz-model"};
	struct pdx_oai_usage u = {r->n_prompt, r->max_tokens};

	if (r->kv.role == PDX_KV_SEND) {
		m.kv_answer = pdx_kv_params_answer(&r->kv, "tcp://self:1", 3);
		if (!m.kv_answer)
			abort();
	}
	check_json(pdx_oai_response(&m, "text", &u));
	check_json(pdx_oai_chunk(&m, "t", true, false));
	check_json(pdx_oai_chunk(&m, "t", false, true));
	check_json(pdx_oai_usage_chunk(&m, &u));
	json_decref(m.kv_answer);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint32_t vocab[4] = {1, 256, 32000, 128256};
	static const uint32_t max_len[4] = {1, 16, 2048, 131072};
	struct pdx_oai_limits lim;
	struct pdx_oai_error err;
	struct pdx_oai_req r;

	if (size < 1)
		return 0;
	lim = (struct pdx_oai_limits){"fuzz-model", vocab[data[0] >> 1 & 3],
				      max_len[data[0] >> 3 & 3]};
	if (pdx_oai_parse((const char *)data + 1, size - 1, data[0] & 1, &lim,
			  &r, &err)) {
		if ((err.status != 400 && err.status != 404) || !err.type ||
		    strnlen(err.message, sizeof(err.message)) ==
			sizeof(err.message) ||
		    strnlen(err.param, sizeof(err.param)) ==
			sizeof(err.param) ||
		    r.prompt)
			abort();
		check_json(pdx_http_error_body(err.status, err.type, err.param,
					       err.message));
		return 0;
	}
	if (!r.n_prompt || !r.max_tokens ||
	    (uint64_t)r.n_prompt + r.max_tokens > lim.max_model_len)
		abort();
	for (uint32_t i = 0; i < r.n_prompt; i++)
		if (r.prompt[i] >= lim.vocab)
			abort();
	answers(&r);
	pdx_oai_req_clear(&r);
	return 0;
}
