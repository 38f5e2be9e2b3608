#include "engine/openai.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fnv.h"
#include "common/oai_params.h"
#include "engine/tokenizer.h"

static int vfail(struct pdx_oai_error *err, int status, const char *param,
		 const char *fmt, va_list ap)
{
	err->status = status;
	err->type = status == 404 ? "not_found_error" : "invalid_request_error";
	snprintf(err->param, sizeof(err->param), "%s", param);
	vsnprintf(err->message, sizeof(err->message), fmt, ap);
	return -1;
}

static int fail(struct pdx_oai_error *err, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(struct pdx_oai_error *err, const char *param, const char *fmt,
		  ...) __attribute__((format(printf, 3, 4)));

static int fail(struct pdx_oai_error *err, int status, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = vfail(err, status, "", fmt, ap);
	va_end(ap);
	return rc;
}

/* A 400 naming the parameter at fault. */
static int refuse(struct pdx_oai_error *err, const char *param, const char *fmt,
		  ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = vfail(err, 400, param, fmt, ap);
	va_end(ap);
	return rc;
}

static bool present(const json_t *v)
{
	return v && !json_is_null(v);
}

static bool not_one(const json_t *v)
{
	return present(v) && json_number_value(v) != 1;
}

static bool not_text(const json_t *v)
{
	const char *t = json_string_value(json_object_get(v, "type"));

	return present(v) && (!t || strcmp(t, "text") != 0);
}

static bool not_none(const json_t *v)
{
	return present(v) &&
	       !(json_is_string(v) && !strcmp(json_string_value(v), "none"));
}

static bool per_chunk_usage(const json_t *v)
{
	return json_is_true(json_object_get(v, "continuous_usage_stats"));
}

enum { CMPL = 1, CHAT = 2, BOTH = 3 };

/* Parameters of vLLM's that pdx-engine does not implement. Each would
 * change the output, so each is refused when it asks for anything (not
 * its default), never ignored. The sampling parameters that only shape a
 * random draw (temperature, top_p, top_k, min_p, seed) are not here: the
 * synthetic model's next token is certain, and any draw gives it. */
static const struct unsupported {
	const char *name;
	unsigned char api;
	bool (*asks)(const json_t *v);
	const char *why;
} unsupported[] = {
    {"logprobs", CMPL, present, "it returns no log probabilities"},
    {"logprobs", CHAT, pdx_oai_truthy, "it returns no log probabilities"},
    {"prompt_logprobs", BOTH, present, "it returns no log probabilities"},
    {"echo", BOTH, pdx_oai_truthy, "it does not echo the prompt"},
    {"stop", BOTH, pdx_oai_truthy,
     "it has no stop strings: every request runs to max_tokens"},
    {"stop_token_ids", BOTH, pdx_oai_truthy,
     "it has no stop tokens: every request runs to max_tokens"},
    {"presence_penalty", BOTH, pdx_oai_truthy,
     "the synthetic model's next token cannot be penalized"},
    {"frequency_penalty", BOTH, pdx_oai_truthy,
     "the synthetic model's next token cannot be penalized"},
    {"repetition_penalty", BOTH, not_one,
     "the synthetic model's next token cannot be penalized"},
    {"logit_bias", BOTH, pdx_oai_truthy,
     "the synthetic model's next token cannot be biased"},
    {"allowed_token_ids", BOTH, present,
     "the synthetic model's next token cannot be restricted"},
    {"bad_words", CHAT, pdx_oai_truthy,
     "the synthetic model's next token cannot be restricted"},
    {"use_beam_search", BOTH, pdx_oai_truthy, "it has no beam search"},
    {"response_format", BOTH, not_text, "it has no structured output"},
    {"structured_outputs", BOTH, present, "it has no structured output"},
    {"logits_processors", BOTH, pdx_oai_truthy, "it has no logits processors"},
    {"max_repetition_pattern_size", BOTH, pdx_oai_truthy,
     "it has no repetition detection"},
    {"tools", CHAT, pdx_oai_truthy, "it makes no tool calls"},
    {"tool_choice", CHAT, not_none, "it makes no tool calls"},
    {"chat_template", CHAT, present, "it has one fixed chat template"},
    {"priority", BOTH, pdx_oai_truthy, "it has no priority scheduling"},
    {"prompt_embeds", CMPL, present, "it takes no prompt embeddings"},
    {"return_token_ids", BOTH, pdx_oai_truthy, "it returns no token ids"},
    {"stream_options", BOTH, per_chunk_usage,
     "it sends usage only at the end ('continuous_usage_stats')"},
};

static int check_supported(json_t *root, bool chat, struct pdx_oai_error *err)
{
	unsigned api = chat ? CHAT : CMPL;

	for (size_t i = 0; i < sizeof(unsupported) / sizeof(unsupported[0]);
	     i++) {
		const struct unsupported *u = &unsupported[i];

		if ((u->api & api) && u->asks(json_object_get(root, u->name)))
			return refuse(err, u->name,
				      "'%s' is not supported by pdx-engine: %s",
				      u->name, u->why);
	}
	return 0;
}

/* Names the top-level fields no one knows into out->ignored. */
static void list_ignored(json_t *root, bool chat, struct pdx_oai_req *out)
{
	size_t len = 0, cap = sizeof(out->ignored);
	const char *k;
	json_t *v;
	int n;

	json_object_foreach(root, k, v)
	{
		if (pdx_oai_params_known(k, chat) || len >= cap)
			continue;
		n = snprintf(out->ignored + len, cap - len, "%s%s",
			     len ? ", " : "", k);
		len += n > 0 ? (size_t)n : 0;
	}
}

/* A growing string for the chat template. */
struct strbuf {
	char *s;
	size_t len, cap;
};

static int sb_add(struct strbuf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = (b->len + n + 1) * 2;
		char *p = realloc(b->s, cap);

		if (!p)
			return -1;
		b->s = p;
		b->cap = cap;
	}
	memcpy(b->s + b->len, s, n);
	b->len += n;
	b->s[b->len] = '\0';
	return 0;
}

/* A message's content: a string, or an array of {"type": "text",
 * "text": ...} parts, concatenated. */
static int add_content(struct strbuf *b, json_t *content,
		       struct pdx_oai_error *err)
{
	size_t i;
	json_t *part, *t;

	if (json_is_string(content))
		return sb_add(b, json_string_value(content),
			      json_string_length(content));
	if (json_is_null(content))
		return 0;
	if (!json_is_array(content))
		return refuse(
		    err, "messages",
		    "message content must be a string or an array of parts");
	json_array_foreach(content, i, part)
	{
		t = json_object_get(part, "text");
		if (!json_is_string(t))
			return refuse(err, "messages",
				      "only text content parts are supported");
		if (sb_add(b, json_string_value(t), json_string_length(t)))
			return fail(err, 400, "out of memory");
	}
	return 0;
}

/* continue_final_message leaves the last message open (no newline after
 * it, no assistant header): the model continues it. Otherwise the
 * assistant header ends the prompt unless add_generation_prompt is
 * false. */
static int chat_template(json_t *root, struct strbuf *b,
			 struct pdx_oai_error *err)
{
	json_t *messages = json_object_get(root, "messages");
	json_t *agp = json_object_get(root, "add_generation_prompt");
	bool open_end =
	    json_is_true(json_object_get(root, "continue_final_message"));
	size_t i, last = json_array_size(messages) - 1;
	json_t *msg, *role;

	if (json_array_size(messages) == 0)
		return refuse(err, "messages",
			      "'messages' must be a non-empty array");
	json_array_foreach(messages, i, msg)
	{
		role = json_object_get(msg, "role");
		if (!json_is_string(role))
			return refuse(err, "messages",
				      "messages[%zu]: 'role' must be a string",
				      i);
		if (sb_add(b, "<|", 2) ||
		    sb_add(b, json_string_value(role),
			   json_string_length(role)) ||
		    sb_add(b, "|>\n", 3))
			return fail(err, 400, "out of memory");
		if (add_content(b, json_object_get(msg, "content"), err))
			return -1;
		if (!(open_end && i == last) && sb_add(b, "\n", 1))
			return fail(err, 400, "out of memory");
	}
	if (!open_end && !json_is_false(agp) &&
	    sb_add(b, "<|assistant|>\n", 14))
		return fail(err, 400, "out of memory");
	return 0;
}

/* Room for a prompt of n tokens, of which the last keep stay (vLLM's
 * truncate_prompt_tokens); refused past the model's length. */
static int prompt_alloc(size_t n, size_t keep, const struct pdx_oai_limits *lim,
			struct pdx_oai_req *out, struct pdx_oai_error *err)
{
	if ((n < keep ? n : keep) > lim->max_model_len)
		return refuse(err, "prompt",
			      "the prompt has %zu tokens, more than this "
			      "model's maximum context length of %u",
			      n, lim->max_model_len);
	out->prompt = malloc(sizeof(*out->prompt) * (n ? n : 1));
	if (!out->prompt)
		return fail(err, 400, "out of memory");
	return 0;
}

/* Keeps the last keep of the n tokens in out->prompt. */
static void prompt_truncate(struct pdx_oai_req *out, size_t n, size_t keep)
{
	if (n > keep) {
		memmove(out->prompt, out->prompt + (n - keep),
			sizeof(*out->prompt) * keep);
		n = keep;
	}
	out->n_prompt = (uint32_t)n;
}

static int tokenize(const char *text, size_t len, size_t keep,
		    const struct pdx_oai_limits *lim, struct pdx_oai_req *out,
		    struct pdx_oai_error *err)
{
	size_t n = pdx_tok_encode(text, len, lim->vocab, NULL, 0);

	if (prompt_alloc(n, keep, lim, out, err))
		return -1;
	pdx_tok_encode(text, len, lim->vocab, out->prompt, n);
	prompt_truncate(out, n, keep);
	return 0;
}

/* An array of token ids (common/oai_params.c saw integers, one prompt). */
static int token_ids(const json_t *arr, size_t keep,
		     const struct pdx_oai_limits *lim, struct pdx_oai_req *out,
		     struct pdx_oai_error *err)
{
	size_t n = json_array_size(arr), i;
	json_t *v;

	if (prompt_alloc(n, keep, lim, out, err))
		return -1;
	json_array_foreach(arr, i, v)
	{
		if (!pdx_tok_id_valid(json_integer_value(v), lim->vocab))
			return refuse(err, "prompt",
				      "prompt[%zu]: want a token id in [0, %u)",
				      i, lim->vocab);
		out->prompt[i] = (uint32_t)json_integer_value(v);
	}
	prompt_truncate(out, n, keep);
	return 0;
}

static int parse_prompt(json_t *root, bool chat,
			const struct pdx_oai_limits *lim,
			struct pdx_oai_req *out, struct pdx_oai_error *err)
{
	json_t *t = json_object_get(root, "truncate_prompt_tokens");
	size_t keep = SIZE_MAX;
	struct strbuf b = {0};
	const json_t *p;
	int rc;

	if (json_is_integer(t)) /* -1: the model's length */
		keep = json_integer_value(t) < 0
			   ? lim->max_model_len
			   : (size_t)json_integer_value(t);
	if (chat) {
		rc = chat_template(root, &b, err);
		if (rc == 0)
			rc = tokenize(b.s, b.len, keep, lim, out, err);
		free(b.s);
		return rc;
	}
	p = pdx_oai_prompt(root); /* a list of one: its prompt */
	if (json_is_string(p))
		return tokenize(json_string_value(p), json_string_length(p),
				keep, lim, out, err);
	return token_ids(p, keep, lim, out, err);
}

/* max_tokens (chat: max_completion_tokens first): absent or null means
 * the default; common/oai_params.c saw an integer >= 1. */
static int parse_max_tokens(json_t *root, bool chat,
			    const struct pdx_oai_limits *lim,
			    struct pdx_oai_req *out, struct pdx_oai_error *err)
{
	const char *key = "max_tokens";
	json_t *v = NULL;

	if (chat)
		v = json_object_get(root, "max_completion_tokens");
	if (json_is_null(v) || !v)
		v = json_object_get(root, key);
	else
		key = "max_completion_tokens";
	if (!v || json_is_null(v)) {
		out->max_tokens = PDX_OAI_DEFAULT_MAX_TOKENS;
		return 0;
	}
	if (json_integer_value(v) > lim->max_model_len)
		return refuse(err, key, "'%s' must be an integer in [1, %u]",
			      key, lim->max_model_len);
	out->max_tokens = (uint32_t)json_integer_value(v);
	return 0;
}

/* model, stream, stream_options, cache_salt, kv_transfer_params. */
static int parse_options(json_t *root, const struct pdx_oai_limits *lim,
			 struct pdx_oai_req *out, struct pdx_oai_error *err)
{
	json_t *v, *so;
	char msg[sizeof(err->message)];

	v = json_object_get(root, "model");
	/* "" names none (vLLM's _is_model_supported): the served one */
	if (json_is_string(v) && json_string_length(v) &&
	    strcmp(json_string_value(v), lim->model) != 0)
		return fail(err, 404, "The model `%.100s` does not exist.",
			    json_string_value(v));
	out->stream = json_is_true(json_object_get(root, "stream"));
	/* vLLM: include_usage defaults to true once stream_options is given */
	so = json_object_get(root, "stream_options");
	v = json_object_get(so, "include_usage");
	out->include_usage = json_is_object(so) && (!v || json_is_true(v));
	v = json_object_get(root, "cache_salt"); /* a non-empty string */
	if (json_is_string(v))
		out->cache_salt = pdx_fnv1a64(PDX_FNV1A64_INIT,
					      json_string_value(v),
					      json_string_length(v));
	if (pdx_kv_params_parse(json_object_get(root, "kv_transfer_params"),
				lim->vocab, &out->kv, msg, sizeof(msg)))
		return refuse(err, "kv_transfer_params", "%s", msg);
	return 0;
}

int pdx_oai_parse(const char *body, size_t len, bool chat,
		  const struct pdx_oai_limits *lim, struct pdx_oai_req *out,
		  struct pdx_oai_error *err)
{
	struct pdx_oai_fault f;
	json_t *root;
	int rc = -1;

	memset(out, 0, sizeof(*out));
	out->chat = chat;
	root = pdx_oai_body_load(body, len, &f);
	if (!root)
		return refuse(err, f.param, "%s", f.message);
	if (pdx_oai_params_check(root, chat, &f)) {
		refuse(err, f.param, "%s", f.message);
		goto out;
	}
	if (parse_options(root, lim, out, err) ||
	    check_supported(root, chat, err) ||
	    parse_max_tokens(root, chat, lim, out, err) ||
	    parse_prompt(root, chat, lim, out, err))
		goto out;
	list_ignored(root, chat, out);
	if (out->n_prompt == 0) {
		refuse(err, chat ? "messages" : "prompt",
		       "the prompt is empty");
		goto out;
	}
	if ((uint64_t)out->n_prompt + out->max_tokens > lim->max_model_len) {
		refuse(err, chat ? "messages" : "prompt",
		       "This model's maximum context length is %u tokens. "
		       "However, you requested %llu tokens (%u in the prompt, "
		       "%u in the completion).",
		       lim->max_model_len,
		       (unsigned long long)out->n_prompt + out->max_tokens,
		       out->n_prompt, out->max_tokens);
		goto out;
	}
	rc = 0;
out:
	json_decref(root);
	if (rc)
		pdx_oai_req_clear(out);
	return rc;
}

void pdx_oai_req_clear(struct pdx_oai_req *r)
{
	free(r->prompt);
	r->prompt = NULL;
	r->n_prompt = 0;
}

static char *dump(json_t *o)
{
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

	json_decref(o);
	return s;
}

static json_t *usage_obj(const struct pdx_oai_usage *u)
{
	return json_pack("{s:I, s:I, s:I}", "prompt_tokens",
			 (json_int_t)u->prompt_tokens, "completion_tokens",
			 (json_int_t)u->completion_tokens, "total_tokens",
			 (json_int_t)u->prompt_tokens + u->completion_tokens);
}

static json_t *envelope(const struct pdx_oai_meta *m, bool chunk,
			json_t *choices)
{
	const char *object =
	    m->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
		    : "text_completion";

	return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", m->id, "object",
			 object, "created", (json_int_t)m->created, "model",
			 m->model, "choices", choices);
}

char *pdx_oai_response(const struct pdx_oai_meta *m, const char *text,
		       const struct pdx_oai_usage *u)
{
	json_t *choice, *o;

	if (m->chat)
		choice = json_pack("{s:i, s:{s:s, s:s}, s:n, s:s}", "index", 0,
				   "message", "role", "assistant", "content",
				   text, "logprobs", "finish_reason", "length");
	else
		choice = json_pack("{s:i, s:s, s:n, s:s}", "index", 0, "text",
				   text, "logprobs", "finish_reason", "length");
	o = envelope(m, false, json_pack("[o]", choice));
	if (o && m->kv_answer &&
	    json_object_set(o, "kv_transfer_params", m->kv_answer)) {
		json_decref(o);
		return NULL;
	}
	if (o && json_object_set_new(o, "usage", usage_obj(u))) {
		json_decref(o);
		return NULL;
	}
	return dump(o);
}

char *pdx_oai_chunk(const struct pdx_oai_meta *m, const char *text, bool first,
		    bool last)
{
	json_t *choice, *finish = last ? json_string("length") : json_null();

	if (m->chat && first)
		choice = json_pack("{s:i, s:{s:s, s:s}, s:n, s:o}", "index", 0,
				   "delta", "role", "assistant", "content",
				   text, "logprobs", "finish_reason", finish);
	else if (m->chat)
		choice = json_pack("{s:i, s:{s:s}, s:n, s:o}", "index", 0,
				   "delta", "content", text, "logprobs",
				   "finish_reason", finish);
	else
		choice = json_pack("{s:i, s:s, s:n, s:o}", "index", 0, "text",
				   text, "logprobs", "finish_reason", finish);
	return dump(envelope(m, true, json_pack("[o]", choice)));
}

char *pdx_oai_usage_chunk(const struct pdx_oai_meta *m,
			  const struct pdx_oai_usage *u)
{
	json_t *o = envelope(m, true, json_array());

	if (o && json_object_set_new(o, "usage", usage_obj(u))) {
		json_decref(o);
		return NULL;
	}
	return dump(o);
}
