#include "common/oai_params.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Which route's model declares a field. */
enum { CMPL = 1, CHAT = 2, BOTH = 3 };

enum kind {
	K_ANY, /* its shape is checked by a rule below */
	K_BOOL,
	K_INT,
	K_NUM,
	K_STR,
	K_OBJ,
	K_ARR,
	K_STOP, /* a string or an array of strings */
	K_INTS, /* an array of integers */
	K_STRS, /* an array of strings */
};

static const char *const kind_name[] = {
    [K_ANY] = "a value",
    [K_BOOL] = "a boolean",
    [K_INT] = "an integer",
    [K_NUM] = "a number",
    [K_STR] = "a string",
    [K_OBJ] = "an object",
    [K_ARR] = "an array",
    [K_STOP] = "a string or an array of strings",
    [K_INTS] = "an array of integers",
    [K_STRS] = "an array of strings",
};

struct field {
	const char *name;
	unsigned char api;
	unsigned char kind;
	bool nullable; /* vLLM's field is Optional: null means its default */
};

/* vLLM's CompletionRequest and ChatCompletionRequest, field by field, in
 * their order. JSON's types are taken as they are: a number in a string
 * is not a number (pydantic's lax mode would convert it). */
static const struct field fields[] = {
    {"model", BOTH, K_STR, true},
    {"prompt", CMPL, K_ANY, true},
    {"messages", CHAT, K_ARR, false},
    {"echo", CMPL, K_BOOL, true},
    {"frequency_penalty", BOTH, K_NUM, true},
    {"logit_bias", BOTH, K_OBJ, true},
    {"logprobs", CMPL, K_INT, true},
    {"logprobs", CHAT, K_BOOL, true},
    {"top_logprobs", CHAT, K_INT, true},
    {"max_tokens", BOTH, K_INT, true},
    {"max_completion_tokens", CHAT, K_INT, true},
    {"n", CMPL, K_INT, false},
    {"n", CHAT, K_INT, true},
    {"presence_penalty", BOTH, K_NUM, true},
    {"response_format", BOTH, K_OBJ, true},
    {"seed", BOTH, K_INT, true},
    {"stop", BOTH, K_STOP, true},
    {"stream", BOTH, K_BOOL, true},
    {"stream_options", BOTH, K_OBJ, true},
    {"suffix", CMPL, K_STR, true},
    {"temperature", BOTH, K_NUM, true},
    {"top_p", BOTH, K_NUM, true},
    {"tools", CHAT, K_ARR, true},
    {"tool_choice", CHAT, K_ANY, true},
    {"reasoning_effort", CHAT, K_STR, true},
    {"include_reasoning", CHAT, K_BOOL, false},
    {"parallel_tool_calls", CHAT, K_BOOL, true},
    {"user", BOTH, K_STR, true},
    {"use_beam_search", BOTH, K_BOOL, false},
    {"top_k", BOTH, K_INT, true},
    {"min_p", BOTH, K_NUM, true},
    {"repetition_penalty", BOTH, K_NUM, true},
    {"length_penalty", BOTH, K_NUM, false},
    {"stop_token_ids", BOTH, K_INTS, true},
    {"include_stop_str_in_output", BOTH, K_BOOL, false},
    {"ignore_eos", BOTH, K_BOOL, false},
    {"min_tokens", BOTH, K_INT, false},
    {"skip_special_tokens", BOTH, K_BOOL, false},
    {"spaces_between_special_tokens", BOTH, K_BOOL, false},
    {"truncate_prompt_tokens", BOTH, K_INT, true},
    {"allowed_token_ids", BOTH, K_INTS, true},
    {"prompt_logprobs", BOTH, K_INT, true},
    {"bad_words", CHAT, K_STRS, false},
    {"echo", CHAT, K_BOOL, false},
    {"prompt_embeds", CMPL, K_ANY, true},
    {"add_generation_prompt", CHAT, K_BOOL, false},
    {"continue_final_message", CHAT, K_BOOL, false},
    {"add_special_tokens", BOTH, K_BOOL, false},
    {"documents", CHAT, K_ARR, true},
    {"chat_template", CHAT, K_STR, true},
    {"chat_template_kwargs", CHAT, K_OBJ, true},
    {"mm_processor_kwargs", CHAT, K_OBJ, true},
    {"response_format", CMPL, K_OBJ, true},
    {"structured_outputs", BOTH, K_OBJ, true},
    {"priority", BOTH, K_INT, false},
    {"request_id", BOTH, K_STR, false},
    {"logits_processors", BOTH, K_ARR, true},
    {"return_tokens_as_token_ids", BOTH, K_BOOL, true},
    {"return_token_ids", BOTH, K_BOOL, true},
    {"cache_salt", BOTH, K_STR, true},
    {"kv_transfer_params", BOTH, K_OBJ, true},
    {"vllm_xargs", BOTH, K_OBJ, true},
    {"max_repetition_pattern_size", BOTH, K_INT, false},
    {"min_repetition_pattern_size", BOTH, K_INT, false},
    {"repetition_min_count", BOTH, K_INT, false},
};

static int fault(struct pdx_oai_fault *f, const char *param, const char *fmt,
		 ...) __attribute__((format(printf, 3, 4)));

static int fault(struct pdx_oai_fault *f, const char *param, const char *fmt,
		 ...)
{
	va_list ap;

	snprintf(f->param, sizeof(f->param), "%s", param);
	va_start(ap, fmt);
	vsnprintf(f->message, sizeof(f->message), fmt, ap);
	va_end(ap);
	return -1;
}

static bool each_is(const json_t *arr, int (*is)(const json_t *))
{
	size_t i;
	const json_t *v;

	json_array_foreach(arr, i, v) if (!is(v)) return false;
	return true;
}

static int is_string(const json_t *v)
{
	return json_is_string(v);
}
static int is_integer(const json_t *v)
{
	return json_is_integer(v);
}
static int is_object(const json_t *v)
{
	return json_is_object(v);
}

static bool kind_ok(const json_t *v, enum kind k)
{
	switch (k) {
	case K_ANY:
		return true;
	case K_BOOL:
		return json_is_boolean(v);
	case K_INT:
		return json_is_integer(v);
	case K_NUM:
		return json_is_number(v);
	case K_STR:
		return json_is_string(v);
	case K_OBJ:
		return json_is_object(v);
	case K_ARR:
		return json_is_array(v);
	case K_STOP:
		return json_is_string(v) ||
		       (json_is_array(v) && each_is(v, is_string));
	case K_INTS:
		return json_is_array(v) && each_is(v, is_integer);
	case K_STRS:
		return json_is_array(v) && each_is(v, is_string);
	}
	return false;
}

static int check_types(const json_t *b, bool chat, struct pdx_oai_fault *f)
{
	unsigned api = chat ? CHAT : CMPL;
	const json_t *v;

	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
		if (!(fields[i].api & api))
			continue;
		v = json_object_get(b, fields[i].name);
		if (!v || (json_is_null(v) && fields[i].nullable))
			continue;
		if (json_is_null(v))
			return fault(f, fields[i].name, "'%s' must not be null",
				     fields[i].name);
		if (!kind_ok(v, fields[i].kind))
			return fault(f, fields[i].name, "'%s' must be %s",
				     fields[i].name, kind_name[fields[i].kind]);
	}
	return 0;
}

/* The value under key, NULL when absent or null (vLLM's default). */
static const json_t *val(const json_t *b, const char *key)
{
	const json_t *v = json_object_get(b, key);

	return json_is_null(v) ? NULL : v;
}

bool pdx_oai_truthy(const json_t *v)
{
	switch (v ? json_typeof(v) : JSON_NULL) {
	case JSON_TRUE:
		return true;
	case JSON_INTEGER:
		return json_integer_value(v) != 0;
	case JSON_REAL:
		return json_real_value(v) != 0;
	case JSON_STRING:
		return json_string_length(v) > 0;
	case JSON_ARRAY:
		return json_array_size(v) > 0;
	case JSON_OBJECT:
		return json_object_size(v) > 0;
	default:
		return false;
	}
}

/* A number's range: [lo, hi], an open end where lo_open / hi_open. */
struct range {
	const char *key;
	double lo, hi;
	bool lo_open, hi_open;
	const char *rule; /* e.g. "in (0, 1]" */
};

/* SamplingParams._verify_args on the fields that reach it as given. */
static const struct range ranges[] = {
    {"presence_penalty", -2, 2, false, false, "in [-2, 2]"},
    {"frequency_penalty", -2, 2, false, false, "in [-2, 2]"},
    {"repetition_penalty", 0, 1e308, true, false, "greater than zero"},
    {"temperature", 0, 1e308, false, false, "non-negative"},
    {"top_p", 0, 1, true, false, "in (0, 1]"},
    {"min_p", 0, 1, false, false, "in [0, 1]"},
    {"top_k", -1, 1e308, false, false, "0 (disable), or at least 1"},
    {"n", 1, 1e308, false, false, "at least 1"},
    {"min_tokens", 0, 1e308, false, false, "at least 0"},
};

static int check_ranges(const json_t *b, struct pdx_oai_fault *f)
{
	const json_t *v;
	double x;

	for (size_t i = 0; i < sizeof(ranges) / sizeof(ranges[0]); i++) {
		const struct range *r = &ranges[i];

		v = val(b, r->key);
		if (!v)
			continue;
		x = json_number_value(v);
		if (x < r->lo || (r->lo_open && x == r->lo) || x > r->hi ||
		    (r->hi_open && x == r->hi))
			return fault(f, r->key, "'%s' must be %s, got %g",
				     r->key, r->rule, x);
	}
	return 0;
}

/* max_tokens (chat: max_completion_tokens when not null) at least 1 and
 * not below min_tokens; completions' echo may ask for 0 (the prompt
 * alone). */
static int check_max_tokens(const json_t *b, bool chat, struct pdx_oai_fault *f)
{
	const char *key = "max_tokens";
	const json_t *v = NULL, *mt;
	json_int_t n;

	if (chat)
		v = val(b, "max_completion_tokens");
	if (v)
		key = "max_completion_tokens";
	else
		v = val(b, key);
	if (!v)
		return 0;
	n = json_integer_value(v);
	if (n < 1 && !(!chat && n == 0 && pdx_oai_truthy(val(b, "echo"))))
		return fault(f, key, "'%s' must be at least 1, got %lld", key,
			     (long long)n);
	mt = val(b, "min_tokens");
	if (mt && json_integer_value(mt) > n)
		return fault(f, "min_tokens",
			     "'min_tokens' must be less than or equal to "
			     "'%s' (%lld), got %lld",
			     key, (long long)n,
			     (long long)json_integer_value(mt));
	return 0;
}

static bool has_empty_string(const json_t *v)
{
	size_t i;
	const json_t *s;

	if (json_is_string(v))
		return json_string_length(v) == 0;
	json_array_foreach(v, i, s) if (json_string_length(s) == 0) return true;
	return false;
}

/* logit_bias: {"token id": bias}, as vLLM turns each key into an int. */
static int check_logit_bias(const json_t *b, struct pdx_oai_fault *f)
{
	const json_t *lb = val(b, "logit_bias"), *v;
	const char *k;
	char *end;

	json_object_foreach((json_t *)lb, k, v)
	{
		strtoll(k, &end, 10);
		if (end == k || *end)
			return fault(f, "logit_bias",
				     "'logit_bias' keys must be token ids, got "
				     "\"%.40s\"",
				     k);
		if (!json_is_number(v))
			return fault(f, "logit_bias",
				     "'logit_bias' values must be numbers");
	}
	return 0;
}

/* The other rules of _verify_args and of the request models' own
 * validators. */
static int check_sampling(const json_t *b, struct pdx_oai_fault *f)
{
	const json_t *v;
	json_int_t mx, mn;

	if (check_ranges(b, f))
		return -1;
	v = val(b, "stop");
	if (v && has_empty_string(v))
		return fault(f, "stop",
			     "'stop' cannot contain an empty string");
	v = val(b, "bad_words");
	if (v && has_empty_string(v))
		return fault(f, "bad_words",
			     "'bad_words' cannot contain an empty string");
	v = val(b, "truncate_prompt_tokens");
	if (v && json_integer_value(v) < 1 && json_integer_value(v) != -1)
		return fault(f, "truncate_prompt_tokens",
			     "'truncate_prompt_tokens' must be an integer >= 1 "
			     "or -1, got %lld",
			     (long long)json_integer_value(v));
	v = val(b, "allowed_token_ids");
	if (v && json_array_size(v) == 0)
		return fault(f, "allowed_token_ids",
			     "'allowed_token_ids' must not be empty");
	mx = json_integer_value(val(b, "max_repetition_pattern_size"));
	mn = json_integer_value(val(b, "min_repetition_pattern_size"));
	if (mx < 0 || mn < 0 || mn > mx)
		return fault(f, "max_repetition_pattern_size",
			     "'max_repetition_pattern_size' and "
			     "'min_repetition_pattern_size' must be >= 0, with "
			     "the min <= the max");
	if (mx > 0 && json_integer_value(val(b, "repetition_min_count")) < 2)
		return fault(f, "repetition_min_count",
			     "'repetition_min_count' must be >= 2 to detect "
			     "repetitive patterns");
	v = val(b, "cache_salt");
	if (v && json_string_length(v) == 0)
		return fault(f, "cache_salt",
			     "'cache_salt' must be a non-empty string if "
			     "provided");
	return check_logit_bias(b, f);
}

static int check_logprobs(const json_t *b, bool chat, struct pdx_oai_fault *f)
{
	const json_t *v = val(b, "prompt_logprobs");
	json_int_t n;

	if (v) {
		n = json_integer_value(v);
		if (pdx_oai_truthy(val(b, "stream")) && (n > 0 || n == -1))
			return fault(f, "prompt_logprobs",
				     "'prompt_logprobs' are not available when "
				     "'stream' is true");
		if (n < -1)
			return fault(f, "prompt_logprobs",
				     "'prompt_logprobs' must be a positive "
				     "value or -1");
	}
	if (!chat) {
		v = val(b, "logprobs");
		if (v && json_integer_value(v) < 0)
			return fault(f, "logprobs",
				     "'logprobs' must be a positive value");
		return 0;
	}
	v = val(b, "top_logprobs");
	if (!v)
		return 0;
	n = json_integer_value(v);
	if (n < -1)
		return fault(f, "top_logprobs",
			     "'top_logprobs' must be a positive value or -1");
	if ((n == -1 || n > 0) && !pdx_oai_truthy(val(b, "logprobs")))
		return fault(f, "top_logprobs",
			     "when using 'top_logprobs', 'logprobs' must be "
			     "set to true");
	return 0;
}

static int check_stream(const json_t *b, struct pdx_oai_fault *f)
{
	static const char *const opt[] = {"include_usage",
					  "continuous_usage_stats"};
	const json_t *so = val(b, "stream_options"), *v;

	if (pdx_oai_truthy(so) && !pdx_oai_truthy(val(b, "stream")))
		return fault(f, "stream_options",
			     "'stream_options' can only be defined when "
			     "'stream' is true");
	for (size_t i = 0; so && i < 2; i++) {
		v = val(so, opt[i]);
		if (v && !json_is_boolean(v))
			return fault(f, "stream_options",
				     "'stream_options.%s' must be a boolean",
				     opt[i]);
	}
	return 0;
}

static int check_formats(const json_t *b, struct pdx_oai_fault *f)
{
	const json_t *rf = val(b, "response_format"), *so, *js;
	const char *t;
	int n = 0;

	if (rf) {
		t = json_string_value(json_object_get(rf, "type"));
		if (!t ||
		    (strcmp(t, "text") && strcmp(t, "json_object") &&
		     strcmp(t, "json_schema") && strcmp(t, "structural_tag")))
			return fault(f, "response_format",
				     "'response_format.type' must be \"text\", "
				     "\"json_object\", \"json_schema\" or "
				     "\"structural_tag\"");
		js = json_object_get(rf, "json_schema");
		if (!strcmp(t, "json_schema") &&
		    !json_is_string(json_object_get(js, "name")))
			return fault(f, "response_format",
				     "'response_format.json_schema' must be an "
				     "object with a string 'name'");
	}
	so = val(b, "structured_outputs");
	n = !!val(so, "json") + !!val(so, "regex") + !!val(so, "choice");
	if (n > 1)
		return fault(f, "structured_outputs",
			     "'structured_outputs' may use only one kind of "
			     "constraint ('json', 'regex' or 'choice')");
	return 0;
}

static bool tool_named(const json_t *tools, const char *name)
{
	size_t i;
	const json_t *t;

	json_array_foreach(tools, i, t)
	{
		const char *s = json_string_value(
		    json_object_get(json_object_get(t, "function"), "name"));

		if (s && !strcmp(s, name))
			return true;
	}
	return false;
}

/* ChatCompletionRequest.check_tool_usage. */
static int check_tools(const json_t *b, struct pdx_oai_fault *f)
{
	const json_t *tools = val(b, "tools"), *tc = val(b, "tool_choice");
	const json_t *t, *fn;
	const char *s;
	size_t i;

	json_array_foreach(tools, i, t)
	{
		fn = json_object_get(t, "function");
		if (!json_is_string(json_object_get(fn, "name")))
			return fault(f, "tools",
				     "tools[%zu] must be an object with a "
				     "'function' that has a string 'name'",
				     i);
	}
	if (!tc ||
	    (json_is_string(tc) && !strcmp(json_string_value(tc), "none")))
		return 0;
	if (!tools)
		return fault(f, "tool_choice",
			     "when using 'tool_choice', 'tools' must be set");
	s = json_string_value(tc);
	if (s && (!strcmp(s, "auto") || !strcmp(s, "required")))
		return 0;
	if (!json_is_object(tc))
		return fault(f, "tool_choice",
			     "'tool_choice' must be \"none\", \"auto\", "
			     "\"required\" or a named tool");
	s = json_string_value(
	    json_object_get(json_object_get(tc, "function"), "name"));
	if (!s || !*s)
		return fault(f, "tool_choice",
			     "'tool_choice' must be {\"type\": \"function\", "
			     "\"function\": {\"name\": \"my_function\"}}");
	if (!tool_named(tools, s))
		return fault(f, "tool_choice",
			     "the tool in 'tool_choice' matches none of "
			     "'tools'");
	return 0;
}

static int check_chat(const json_t *b, struct pdx_oai_fault *f)
{
	const json_t *v;
	const char *s;

	if (!json_object_get(b, "messages"))
		return fault(f, "messages", "'messages' is required");
	if (pdx_oai_truthy(val(b, "continue_final_message")) &&
	    pdx_oai_truthy(val(b, "add_generation_prompt")))
		return fault(f, "continue_final_message",
			     "cannot set both 'continue_final_message' and "
			     "'add_generation_prompt' to true");
	v = val(b, "reasoning_effort");
	s = json_string_value(v);
	if (v && strcmp(s, "low") && strcmp(s, "medium") && strcmp(s, "high"))
		return fault(f, "reasoning_effort",
			     "'reasoning_effort' must be \"low\", \"medium\" "
			     "or \"high\"");
	v = val(b, "documents");
	if (v && !each_is(v, is_object))
		return fault(f, "documents",
			     "'documents' must be an array of objects");
	return check_tools(b, f);
}

/* A completion's prompt: a string, an array of token ids, or (a list of
 * prompts) an array of those. A list of one is that prompt, as vLLM
 * serves it (clients that batch, LangChain's among them, send one prompt
 * so); a longer list breaks pdx's rule of one sequence per request. */
static int check_prompt(const json_t *b, struct pdx_oai_fault *f)
{
	const json_t *p = val(b, "prompt"), *first;

	if (!pdx_oai_truthy(p) && !pdx_oai_truthy(val(b, "prompt_embeds")))
		return fault(f, "prompt",
			     "either 'prompt' or 'prompt_embeds' must be "
			     "provided and non-empty");
	if (!p || json_is_string(p))
		return 0;
	if (!json_is_array(p))
		return fault(f, "prompt",
			     "'prompt' must be a string, an array of token "
			     "ids, or an array of those");
	first = json_array_get(p, 0);
	if ((json_is_string(first) || json_is_array(first)) &&
	    json_array_size(p) > 1)
		return fault(f, "prompt",
			     "a list of prompts is not supported; send one "
			     "prompt per request");
	if (json_is_string(first))
		return 0;
	if (!each_is(json_is_array(first) ? first : p, is_integer))
		return fault(f, "prompt",
			     "'prompt' must be a string, an array of token "
			     "ids, or an array of those");
	return 0;
}

const json_t *pdx_oai_prompt(const json_t *body)
{
	const json_t *p = json_object_get(body, "prompt");
	const json_t *first = json_array_get(p, 0);

	if (json_array_size(p) == 1 &&
	    (json_is_string(first) || json_is_array(first)))
		return first;
	return p;
}

/* pdx's own rule: one sequence per request. A P/D transfer carries the
 * KV of one prompt to one decode, and pdx-engine's greedy decoding would
 * give n identical choices (vLLM refuses n > 1 under greedy sampling). */
static int check_one_sequence(const json_t *b, struct pdx_oai_fault *f)
{
	const json_t *v = val(b, "n");

	if (v && json_integer_value(v) > 1)
		return fault(f, "n",
			     "'n' > 1 is not supported: pdx serves one "
			     "sequence per request; send n requests");
	v = val(b, "best_of");
	if (v && (!json_is_integer(v) || json_integer_value(v) != 1))
		return fault(f, "best_of",
			     "'best_of' other than 1 is not supported: pdx "
			     "serves one sequence per request");
	return 0;
}

/* Does v hold a string with a NUL in it, at any depth (jansson's own
 * bound on nesting bounds the recursion)? */
static bool has_nul(const json_t *v)
{
	const char *k;
	size_t i;
	json_t *e;

	if (json_is_string(v))
		return strlen(json_string_value(v)) != json_string_length(v);
	json_object_foreach((json_t *)v, k, e) if (has_nul(e)) return true;
	json_array_foreach(v, i, e) if (has_nul(e)) return true;
	return false;
}

/* A NUL (JSON's \u0000) is text in a prompt or a message, as in vLLM's
 * Python strings; in any other field, read as a C string, it would cut
 * the value short and make it another one ("tiny\u0000x" the model
 * "tiny"), so it is refused there. */
static int check_nul(const json_t *root, struct pdx_oai_fault *f)
{
	const char *k;
	json_t *v;

	json_object_foreach((json_t *)root, k, v)
	{
		if (strcmp(k, "prompt") && strcmp(k, "messages") && has_nul(v))
			return fault(f, k,
				     "'%s' must not contain a NUL character "
				     "(\\u0000)",
				     k);
	}
	return 0;
}

json_t *pdx_oai_body_load(const char *body, size_t len, struct pdx_oai_fault *f)
{
	static const char bom[] = "\xef\xbb\xbf";
	json_error_t jerr;
	json_t *root;

	if (body && len >= 3 && !memcmp(body, bom, 3)) {
		body += 3;
		len -= 3;
	}
	if (!body || !len) {
		fault(f, "", "the body is empty: want a JSON object");
		return NULL;
	}
	root = json_loadb(body, len, JSON_ALLOW_NUL, &jerr);
	if (!root) {
		fault(f, "", "invalid JSON: %s (line %d, column %d)", jerr.text,
		      jerr.line, jerr.column);
		return NULL;
	}
	if (!json_is_object(root)) {
		json_decref(root);
		fault(f, "", "the body must be a JSON object");
		return NULL;
	}
	if (check_nul(root, f)) {
		json_decref(root);
		return NULL;
	}
	return root;
}

int pdx_oai_params_check(const json_t *body, bool chat, struct pdx_oai_fault *f)
{
	if (check_types(body, chat, f) ||
	    (chat ? check_chat(body, f) : check_prompt(body, f)) ||
	    check_sampling(body, f) || check_max_tokens(body, chat, f) ||
	    check_logprobs(body, chat, f) || check_stream(body, f) ||
	    check_formats(body, f) || check_one_sequence(body, f))
		return -1;
	/* vLLM's completion route refuses it before anything else */
	if (!chat && val(body, "suffix"))
		return fault(f, "suffix", "suffix is not currently supported");
	return 0;
}

bool pdx_oai_params_known(const char *name, bool chat)
{
	unsigned api = chat ? CHAT : CMPL;

	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
		if ((fields[i].api & api) && !strcmp(fields[i].name, name))
			return true;
	return false;
}
