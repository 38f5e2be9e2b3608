#include "engine/openai.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer.h"

static int fail(struct pdx_oai_error *err, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(struct pdx_oai_error *err, int status, const char *fmt, ...)
{
	va_list ap;

	err->status = status;
	err->type = status == 404 ? "not_found_error" : "invalid_request_error";
	va_start(ap, fmt);
	vsnprintf(err->message, sizeof(err->message), fmt, ap);
	va_end(ap);
	return -1;
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
		return fail(
		    err, 400,
		    "message content must be a string or an array of parts");
	json_array_foreach(content, i, part)
	{
		t = json_object_get(part, "text");
		if (!json_is_string(t))
			return fail(err, 400,
				    "only text content parts are supported");
		if (sb_add(b, json_string_value(t), json_string_length(t)))
			return fail(err, 400, "out of memory");
	}
	return 0;
}

static int chat_template(json_t *messages, struct strbuf *b,
			 struct pdx_oai_error *err)
{
	size_t i;
	json_t *msg, *role;

	if (!json_is_array(messages) || json_array_size(messages) == 0)
		return fail(err, 400, "'messages' must be a non-empty array");
	json_array_foreach(messages, i, msg)
	{
		role = json_object_get(msg, "role");
		if (!json_is_string(role))
			return fail(err, 400,
				    "messages[%zu]: 'role' must be a string",
				    i);
		if (sb_add(b, "<|", 2) ||
		    sb_add(b, json_string_value(role),
			   json_string_length(role)) ||
		    sb_add(b, "|>\n", 3))
			return fail(err, 400, "out of memory");
		if (add_content(b, json_object_get(msg, "content"), err))
			return -1;
		if (sb_add(b, "\n", 1))
			return fail(err, 400, "out of memory");
	}
	if (sb_add(b, "<|assistant|>\n", 14))
		return fail(err, 400, "out of memory");
	return 0;
}

/* Room for a prompt of n tokens, refused past the model's length. */
static int prompt_alloc(size_t n, const struct pdx_oai_limits *lim,
			struct pdx_oai_req *out, struct pdx_oai_error *err)
{
	if (n > lim->max_model_len)
		return fail(err, 400,
			    "the prompt has %zu tokens, more than this model's "
			    "maximum context length of %u",
			    n, lim->max_model_len);
	out->prompt = malloc(sizeof(*out->prompt) * (n ? n : 1));
	if (!out->prompt)
		return fail(err, 400, "out of memory");
	return 0;
}

static int tokenize(const char *text, size_t len,
		    const struct pdx_oai_limits *lim, struct pdx_oai_req *out,
		    struct pdx_oai_error *err)
{
	size_t n = pdx_tok_encode(text, len, lim->vocab, NULL, 0);

	if (prompt_alloc(n, lim, out, err))
		return -1;
	pdx_tok_encode(text, len, lim->vocab, out->prompt, n);
	out->n_prompt = (uint32_t)n;
	return 0;
}

static int token_ids(json_t *arr, const struct pdx_oai_limits *lim,
		     struct pdx_oai_req *out, struct pdx_oai_error *err)
{
	size_t n = json_array_size(arr), i;
	json_t *v;

	if (n > 0 && json_is_string(json_array_get(arr, 0)))
		return fail(err, 400,
			    "a list of prompts is not supported; send one "
			    "prompt per request");
	if (prompt_alloc(n, lim, out, err))
		return -1;
	json_array_foreach(arr, i, v)
	{
		if (!json_is_integer(v) ||
		    !pdx_tok_id_valid(json_integer_value(v), lim->vocab))
			return fail(err, 400,
				    "prompt[%zu]: want a token id in [0, %u)",
				    i, lim->vocab);
		out->prompt[i] = (uint32_t)json_integer_value(v);
	}
	out->n_prompt = (uint32_t)n;
	return 0;
}

static int parse_prompt(json_t *root, bool chat,
			const struct pdx_oai_limits *lim,
			struct pdx_oai_req *out, struct pdx_oai_error *err)
{
	struct strbuf b = {0};
	json_t *p;
	int rc;

	if (chat) {
		rc = chat_template(json_object_get(root, "messages"), &b, err);
		if (rc == 0)
			rc = tokenize(b.s, b.len, lim, out, err);
		free(b.s);
		return rc;
	}
	p = json_object_get(root, "prompt");
	if (json_is_string(p))
		return tokenize(json_string_value(p), json_string_length(p),
				lim, out, err);
	if (json_is_array(p))
		return token_ids(p, lim, out, err);
	return fail(err, 400,
		    "'prompt' must be a string or an array of token ids");
}

/* max_tokens (chat: max_completion_tokens first): absent or null means
 * the default. */
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
	if (!json_is_integer(v) || json_integer_value(v) < 1 ||
	    json_integer_value(v) > lim->max_model_len)
		return fail(err, 400, "'%s' must be an integer in [1, %u]", key,
			    lim->max_model_len);
	out->max_tokens = (uint32_t)json_integer_value(v);
	return 0;
}

/* model, n, stream, stream_options. */
static int parse_options(json_t *root, const struct pdx_oai_limits *lim,
			 struct pdx_oai_req *out, struct pdx_oai_error *err)
{
	json_t *v, *so;
	char msg[sizeof(err->message)];

	v = json_object_get(root, "model");
	if (v && !json_is_string(v))
		return fail(err, 400, "'model' must be a string");
	if (v && strcmp(json_string_value(v), lim->model) != 0)
		return fail(err, 404, "The model `%.100s` does not exist.",
			    json_string_value(v));
	v = json_object_get(root, "n");
	if (v && !json_is_null(v) &&
	    (!json_is_integer(v) || json_integer_value(v) != 1))
		return fail(err, 400, "'n' must be 1");
	v = json_object_get(root, "stream");
	if (v && !json_is_null(v) && !json_is_boolean(v))
		return fail(err, 400, "'stream' must be a boolean");
	out->stream = json_is_true(v);
	so = json_object_get(root, "stream_options");
	if (so && !json_is_null(so)) {
		if (!json_is_object(so))
			return fail(err, 400,
				    "'stream_options' must be an object");
		v = json_object_get(so, "include_usage");
		if (v && !json_is_null(v) && !json_is_boolean(v))
			return fail(
			    err, 400,
			    "'stream_options.include_usage' must be a boolean");
		out->include_usage = json_is_true(v);
	}
	if (pdx_kv_params_parse(json_object_get(root, "kv_transfer_params"),
				lim->vocab, &out->kv, msg, sizeof(msg)))
		return fail(err, 400, "%s", msg);
	return 0;
}

int pdx_oai_parse(const char *body, size_t len, bool chat,
		  const struct pdx_oai_limits *lim, struct pdx_oai_req *out,
		  struct pdx_oai_error *err)
{
	json_error_t jerr;
	json_t *root;
	int rc = -1;

	memset(out, 0, sizeof(*out));
	out->chat = chat;
	root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return fail(err, 400, "invalid JSON: %s (line %d, column %d)",
			    jerr.text, jerr.line, jerr.column);
	if (!json_is_object(root)) {
		fail(err, 400, "the body must be a JSON object");
		goto out;
	}
	if (parse_options(root, lim, out, err) ||
	    parse_max_tokens(root, chat, lim, out, err) ||
	    parse_prompt(root, chat, lim, out, err))
		goto out;
	if (out->n_prompt == 0) {
		fail(err, 400, "the prompt is empty");
		goto out;
	}
	if ((uint64_t)out->n_prompt + out->max_tokens > lim->max_model_len) {
		fail(err, 400,
		     "This model's maximum context length is %u tokens. "
		     "However, you requested %llu tokens (%u in the prompt, %u "
		     "in the completion).",
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
