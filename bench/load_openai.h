/* The OpenAI-compatible side of pdx-bench: the request body it POSTs and
 * the reading of one streamed event, both as vllm bench serve does them
 * (vllm/benchmarks/lib/endpoint_request_func.py). Pure; needs jansson. */
#ifndef PDX_BENCH_LOAD_OPENAI_H
#define PDX_BENCH_LOAD_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pdx_load_body_params {
	bool chat;	     /* /v1/chat/completions: messages, not prompt */
	const char *model;   /* the "model" field */
	const char *text;    /* the prompt as text, or NULL ... */
	const uint32_t *ids; /* ... as token ids (completions only) */
	size_t n_ids;
	int max_tokens; /* max_tokens, or max_completion_tokens for chat */
	bool ignore_eos;
	/* Sampling parameters added when set (NaN or < 0 top_k: left out). */
	double temperature, top_p;
	int top_k;
};

/* The JSON body, "stream": true with usage included; malloc'd, caller
 * frees. NULL on out of memory, or a chat request with token ids. */
char *pdx_load_openai_body(const struct pdx_load_body_params *bp,
			   size_t *len_out);

struct pdx_load_chunk {
	bool done;		/* the "[DONE]" sentinel */
	bool has_choices;	/* a non-empty "choices" array: a token chunk */
	long completion_tokens; /* from "usage", -1 when absent */
	long prompt_tokens;	/* from "usage", -1 when absent */
};

/* Reads one event's data. The generated text of a token chunk ("text",
 * or "delta"."content" for chat) is appended to *text (grown with
 * realloc; *text_len bytes, NUL-terminated) when text is not NULL.
 * Returns 0, or -1 when the data is not a JSON object (the request then
 * fails, as a json.loads error fails it in vllm). */
int pdx_load_openai_chunk(const char *data, size_t len, bool chat,
			  struct pdx_load_chunk *out, char **text,
			  size_t *text_len);

#endif
