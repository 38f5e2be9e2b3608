/* The OpenAI API's JSON, as pdx-engine reads and writes it: request
 * bodies of /v1/completions and /v1/chat/completions, the chat prompt
 * template, and the response and stream chunk objects (the error
 * object is common/http_error.h's).
 *
 * Chat prompt template (deterministic, documented in docs/engine.md):
 * each message becomes "<|ROLE|>\nCONTENT\n" and the prompt ends with
 * "<|assistant|>\n"; it is then tokenized like any text.
 *
 * Pure (jansson only); any thread.
 */
#ifndef PDX_ENGINE_OPENAI_H
#define PDX_ENGINE_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/kv_params.h"

#define PDX_OAI_DEFAULT_MAX_TOKENS 16

struct pdx_oai_limits {
	const char *model;	/* the served name: other names are refused */
	uint32_t vocab;		/* token ids < vocab */
	uint32_t max_model_len; /* prompt + max_tokens */
};

struct pdx_oai_req {
	bool chat; /* /v1/chat/completions */
	bool stream;
	bool include_usage; /* stream_options.include_usage */
	/* top-level fields neither vLLM nor pdx knows, ignored as vLLM
	 * ignores them ("a, b"; "" when none): the caller warns */
	char ignored[160];
	uint32_t *prompt;   /* token ids, malloc'd */
	uint32_t n_prompt;
	uint32_t max_tokens;
	uint64_t cache_salt; /* cache_salt's FNV-1a 64; 0: none */
	struct pdx_kv_params kv; /* kv_transfer_params */
};

/* Why a body was refused: the HTTP status, the OpenAI error type and
 * the parameter at fault. */
struct pdx_oai_error {
	int status;	  /* 400 or 404 */
	const char *type; /* "invalid_request_error", "not_found_error" */
	char param[64];	  /* "" when no one parameter is at fault */
	char message[256];
};

/* Parses a request body of len bytes. 0 and *out filled (free with
 * pdx_oai_req_clear()), or -1 and *err filled. A body must first meet
 * vLLM's rules (common/oai_params.h); then every parameter that would
 * change the output and that pdx-engine does not implement is refused
 * unless it asks for nothing (its default): docs/engine.md lists them. */
int pdx_oai_parse(const char *body, size_t len, bool chat,
		  const struct pdx_oai_limits *lim, struct pdx_oai_req *out,
		  struct pdx_oai_error *err);

void pdx_oai_req_clear(struct pdx_oai_req *r);

/* What every response object of one request repeats. */
struct pdx_oai_meta {
	bool chat;
	const char *id;	   /* "cmpl-..." or "chatcmpl-..." */
	long long created; /* unix seconds */
	const char *model;
	/* the response's kv_transfer_params (not streamed), or NULL */
	json_t *kv_answer;
};

struct pdx_oai_usage {
	uint32_t prompt_tokens, completion_tokens;
};

/* The non-streamed response: text (the output), finish_reason "length".
 * Each returns a malloc'd NUL-terminated JSON text, NULL when out of
 * memory. */
char *pdx_oai_response(const struct pdx_oai_meta *m, const char *text,
		       const struct pdx_oai_usage *u);

/* One stream chunk carrying one token's text; first: chat's delta also
 * carries the role; last: finish_reason "length", else null. */
char *pdx_oai_chunk(const struct pdx_oai_meta *m, const char *text, bool first,
		    bool last);

/* The stream's usage chunk: empty choices, usage. */
char *pdx_oai_usage_chunk(const struct pdx_oai_meta *m,
			  const struct pdx_oai_usage *u);

#endif
