/* The rules a request body of /v1/completions or /v1/chat/completions
 * must meet wherever it enters pdx: pdx-proxy checks them before it asks
 * any engine for work, pdx-engine before it parses the request.
 *
 * They are vLLM's OpenAI server's rules (its pydantic request models,
 * their validators and SamplingParams._verify_args, at the commit named
 * in docs/proxy.md): a field's JSON type, its range, and the rules
 * between fields (stream_options only with stream, min_tokens <=
 * max_tokens, top_logprobs only with logprobs, ...). Plus one of pdx's
 * own: a request asks for one sequence (n and best_of 1, one prompt),
 * because a P/D transfer carries one sequence's KV.
 *
 * What this does not know, each caller checks itself: the served model's
 * name, vocabulary and context length, and (pdx-engine) which parameters
 * it implements. Fields vLLM does not know are left alone here, as vLLM
 * ignores them.
 *
 * Pure (jansson only), any thread; logs nothing.
 */
#ifndef PDX_COMMON_OAI_PARAMS_H
#define PDX_COMMON_OAI_PARAMS_H

#include <jansson.h>
#include <stdbool.h>

/* Why a body breaks a rule: the parameter (OpenAI's error "param") and a
 * sentence that names it and the rule. */
struct pdx_oai_fault {
	char param[64];
	char message[256];
};

/* A request body read as vLLM's server reads it (Python's json.loads of
 * its bytes): a UTF-8 byte order mark before the JSON is skipped (RFC
 * 8259 lets a parser ignore one, and some Windows tools write one), a
 * key given twice keeps its last value, only white space may follow the
 * value, and a string may hold a NUL (\u0000) where it is text: in the
 * prompt or the messages (elsewhere it is refused, naming the field).
 * The body must be an object. Returns it (json_decref() it), or NULL and
 * *f filled (param "" but for a NUL): empty, not JSON (where it broke),
 * not an object. */
json_t *pdx_oai_body_load(const char *body, size_t len,
			  struct pdx_oai_fault *f);

/* 0 when body (a JSON object) meets every rule for its route (chat:
 * /v1/chat/completions); -1 and *f filled at the first broken one. */
int pdx_oai_params_check(const json_t *body, bool chat,
			 struct pdx_oai_fault *f);

/* A completion body's one prompt: its "prompt", or the prompt a list of
 * one holds (a string or an array of token ids). Borrowed from body. */
const json_t *pdx_oai_prompt(const json_t *body);

/* Python's truth of a value (NULL: absent): what vLLM's validators test
 * of data.get(key), and what "asks for something" means. */
bool pdx_oai_truthy(const json_t *v);

/* Is name a request field vLLM's model for this route declares? */
bool pdx_oai_params_known(const char *name, bool chat);

#endif
