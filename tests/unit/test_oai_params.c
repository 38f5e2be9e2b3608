/* Request validation: vLLM's rules (common/oai_params.c), which pdx-proxy
 * and pdx-engine both apply, and pdx-engine's refusals of what it does
 * not implement (engine/openai.c). Each row is a body, its route, the
 * parameter vLLM's rules name ("" when the body meets them), and the one
 * pdx-engine names ("" when it serves the body). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/http_error.h"
#include "common/oai_params.h"
#include "engine/openai.h"
#include "tests/check.h"

#define OK ""

static const struct row {
	bool chat;
	const char *body;
	const char *vllm;   /* param named by pdx_oai_params_check, or OK */
	const char *engine; /* param named by pdx_oai_parse, or OK */
} rows[] = {
    /* accepted everywhere */
    {0, "{\"prompt\":\"hi\"}", OK, OK},
    {0,
     "{\"prompt\":[1,2,3],\"max_tokens\":4,\"temperature\":0.7,"
     "\"top_p\":1,\"top_k\":-1,\"min_p\":0.5,\"seed\":-3,"
     "\"repetition_penalty\":1.0,\"logprobs\":null,\"user\":\"u\","
     "\"ignore_eos\":true,\"min_tokens\":4,\"n\":1,\"best_of\":1}",
     OK, OK},
    {0,
     "{\"prompt\":\"a\",\"temperature\":0,\"presence_penalty\":0,"
     "\"frequency_penalty\":0.0,\"stop\":[],\"logit_bias\":{}}",
     OK, OK},
    {0,
     "{\"prompt\":\"a\",\"stream\":true,\"stream_options\":"
     "{\"include_usage\":false}}",
     OK, OK},
    {0, "{\"prompt\":\"a\",\"stream_options\":{}}", OK, OK},
    {0, "{\"prompt\":\"a b c\",\"truncate_prompt_tokens\":2}", OK, OK},
    {1,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
     "\"max_completion_tokens\":3,\"logprobs\":false,\"top_logprobs\":0,"
     "\"tool_choice\":\"none\",\"response_format\":{\"type\":\"text\"},"
     "\"reasoning_effort\":\"low\",\"chat_template_kwargs\":{\"a\":1},"
     "\"add_generation_prompt\":false}",
     OK, OK},
    {1,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
     "\"continue_final_message\":true}",
     OK, OK},
    /* vLLM's ranges */
    {0, "{\"prompt\":\"a\",\"temperature\":-1}", "temperature", "temperature"},
    {0, "{\"prompt\":\"a\",\"top_p\":0}", "top_p", "top_p"},
    {0, "{\"prompt\":\"a\",\"top_p\":1.5}", "top_p", "top_p"},
    {1, "{\"messages\":[],\"top_k\":-2}", "top_k", "top_k"},
    {0, "{\"prompt\":\"a\",\"min_p\":1.1}", "min_p", "min_p"},
    {0, "{\"prompt\":\"a\",\"presence_penalty\":2.5}", "presence_penalty",
     "presence_penalty"},
    {1, "{\"messages\":[],\"frequency_penalty\":-3}", "frequency_penalty",
     "frequency_penalty"},
    {0, "{\"prompt\":\"a\",\"repetition_penalty\":0}", "repetition_penalty",
     "repetition_penalty"},
    {0, "{\"prompt\":\"a\",\"max_tokens\":0}", "max_tokens", "max_tokens"},
    {0, "{\"prompt\":\"a\",\"max_tokens\":-5}", "max_tokens", "max_tokens"},
    {1, "{\"messages\":[],\"max_completion_tokens\":0,\"max_tokens\":5}",
     "max_completion_tokens", "max_completion_tokens"},
    {0, "{\"prompt\":\"a\",\"max_tokens\":4,\"min_tokens\":5}", "min_tokens",
     "min_tokens"},
    {0, "{\"prompt\":\"a\",\"min_tokens\":-1}", "min_tokens", "min_tokens"},
    {0, "{\"prompt\":\"a\",\"n\":0}", "n", "n"},
    {0, "{\"prompt\":\"a\",\"logprobs\":-1}", "logprobs", "logprobs"},
    {1, "{\"messages\":[],\"top_logprobs\":3}", "top_logprobs", "top_logprobs"},
    {1, "{\"messages\":[],\"top_logprobs\":-2,\"logprobs\":true}",
     "top_logprobs", "top_logprobs"},
    {0, "{\"prompt\":\"a\",\"prompt_logprobs\":1,\"stream\":true}",
     "prompt_logprobs", "prompt_logprobs"},
    {0, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}",
     "stream_options", "stream_options"},
    {0,
     "{\"prompt\":\"a\",\"stream\":true,\"stream_options\":"
     "{\"include_usage\":1}}",
     "stream_options", "stream_options"},
    {0, "{\"prompt\":\"a\",\"stop\":[\"x\",\"\"]}", "stop", "stop"},
    {0, "{\"prompt\":\"a\",\"truncate_prompt_tokens\":0}",
     "truncate_prompt_tokens", "truncate_prompt_tokens"},
    {0, "{\"prompt\":\"a\",\"logit_bias\":{\"abc\":1}}", "logit_bias",
     "logit_bias"},
    {0, "{\"prompt\":\"a\",\"allowed_token_ids\":[]}", "allowed_token_ids",
     "allowed_token_ids"},
    {0, "{\"prompt\":\"a\",\"cache_salt\":\"\"}", "cache_salt", "cache_salt"},
    {0, "{\"prompt\":\"a\",\"max_repetition_pattern_size\":2}",
     "repetition_min_count", "repetition_min_count"},
    {0, "{\"prompt\":\"a\",\"suffix\":\"z\"}", "suffix", "suffix"},
    {0, "{\"prompt\":\"a\",\"response_format\":{\"type\":\"xml\"}}",
     "response_format", "response_format"},
    {1, "{\"messages\":[],\"tool_choice\":\"auto\"}", "tool_choice",
     "tool_choice"},
    {1,
     "{\"messages\":[],\"tools\":[{\"type\":\"function\",\"function\":"
     "{\"name\":\"f\"}}],\"tool_choice\":{\"function\":{\"name\":\"g\"}}}",
     "tool_choice", "tool_choice"},
    {1,
     "{\"messages\":[],\"continue_final_message\":true,"
     "\"add_generation_prompt\":true}",
     "continue_final_message", "continue_final_message"},
    {1, "{\"messages\":[],\"reasoning_effort\":\"max\"}", "reasoning_effort",
     "reasoning_effort"},
    /* types, and null where vLLM's field is not Optional */
    {0, "{\"prompt\":\"a\",\"temperature\":\"0.5\"}", "temperature",
     "temperature"},
    {0, "{\"prompt\":\"a\",\"max_tokens\":2.5}", "max_tokens", "max_tokens"},
    {0, "{\"prompt\":\"a\",\"stream\":1}", "stream", "stream"},
    {0, "{\"prompt\":\"a\",\"n\":null}", "n", "n"},
    {1, "{\"messages\":[],\"n\":null}", OK, "messages"},
    {0, "{\"prompt\":\"a\",\"stop\":[1]}", "stop", "stop"},
    {0, "{\"prompt\":\"a\",\"seed\":1.5}", "seed", "seed"},
    {1, "{\"messages\":{}}", "messages", "messages"},
    {1, "{\"prompt\":\"a\"}", "messages", "messages"},
    {0, "{\"prompt\":\"\"}", "prompt", "prompt"},
    {0, "{\"max_tokens\":3}", "prompt", "prompt"},
    {0, "{\"prompt\":[1,\"a\"]}", "prompt", "prompt"},
    /* pdx: one sequence per request */
    {0, "{\"prompt\":\"a\",\"n\":2}", "n", "n"},
    {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":3}", "n",
     "n"},
    {0, "{\"prompt\":\"a\",\"best_of\":2}", "best_of", "best_of"},
    {0, "{\"prompt\":[\"a\",\"b\"]}", "prompt", "prompt"},
    {0, "{\"prompt\":[[1],[2]]}", "prompt", "prompt"},
    /* a list of one prompt is that prompt (LangChain sends one so) */
    {0, "{\"prompt\":[\"a b\"]}", OK, OK},
    {0, "{\"prompt\":[[1,2,3]],\"max_tokens\":4}", OK, OK},
    {0, "{\"prompt\":[[1,\"a\"]]}", "prompt", "prompt"},
    {0, "{\"prompt\":[[\"a\"]]}", "prompt", "prompt"},
    {0, "{\"prompt\":[[]]}", OK, "prompt"},
    {0, "{\"prompt\":[\"\"]}", OK, "prompt"},
    /* vLLM serves them; pdx-engine does not implement them */
    {0, "{\"prompt\":\"a\",\"logprobs\":5}", OK, "logprobs"},
    {0, "{\"prompt\":\"a\",\"logprobs\":0}", OK, "logprobs"},
    {1,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
     "\"logprobs\":true,\"top_logprobs\":2}",
     OK, "logprobs"},
    {0, "{\"prompt\":\"a\",\"prompt_logprobs\":0}", OK, "prompt_logprobs"},
    {0, "{\"prompt\":\"a\",\"echo\":true}", OK, "echo"},
    {0, "{\"prompt\":\"a\",\"echo\":true,\"max_tokens\":0}", OK, "echo"},
    {0, "{\"prompt\":\"a\",\"stop\":\"x\"}", OK, "stop"},
    {1,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
     "\"stop\":[\"x\"]}",
     OK, "stop"},
    {0, "{\"prompt\":\"a\",\"stop_token_ids\":[3]}", OK, "stop_token_ids"},
    {0, "{\"prompt\":\"a\",\"presence_penalty\":0.5}", OK, "presence_penalty"},
    {0, "{\"prompt\":\"a\",\"frequency_penalty\":-1}", OK, "frequency_penalty"},
    {0, "{\"prompt\":\"a\",\"repetition_penalty\":1.2}", OK,
     "repetition_penalty"},
    {0, "{\"prompt\":\"a\",\"logit_bias\":{\"5\":-100}}", OK, "logit_bias"},
    {0, "{\"prompt\":\"a\",\"allowed_token_ids\":[1]}", OK,
     "allowed_token_ids"},
    {1,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
     "\"bad_words\":[\"x\"]}",
     OK, "bad_words"},
    {0, "{\"prompt\":\"a\",\"use_beam_search\":true}", OK, "use_beam_search"},
    {0, "{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_object\"}}", OK,
     "response_format"},
    {0, "{\"prompt\":\"a\",\"structured_outputs\":{\"regex\":\"a+\"}}", OK,
     "structured_outputs"},
    {1,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":"
     "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
     OK, "tools"},
    {1,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
     "\"chat_template\":\"{{x}}\"}",
     OK, "chat_template"},
    {0, "{\"prompt\":\"a\",\"priority\":1}", OK, "priority"},
    {0, "{\"prompt\":\"a\",\"return_token_ids\":true}", OK, "return_token_ids"},
    {0, "{\"prompt\":\"a\",\"logits_processors\":[\"m.P\"]}", OK,
     "logits_processors"},
    {0,
     "{\"prompt\":\"a\",\"max_repetition_pattern_size\":2,"
     "\"repetition_min_count\":2}",
     OK, "max_repetition_pattern_size"},
    {0,
     "{\"prompt\":\"a\",\"stream\":true,\"stream_options\":"
     "{\"continuous_usage_stats\":true}}",
     OK, "stream_options"},
    /* pdx-engine's own limits: vocabulary and context length */
    {0, "{\"prompt\":[300]}", OK, "prompt"},
    {0, "{\"prompt\":\"a\",\"max_tokens\":100000}", OK, "max_tokens"},
};

static const struct pdx_oai_limits lim = {"m", 256, 64};

/* The param of an error body, "" when null. */
static const char *body_param(char *s)
{
	static char out[64];
	json_t *o = json_loads(s, 0, NULL);
	const char *p = json_string_value(
	    json_object_get(json_object_get(o, "error"), "param"));

	snprintf(out, sizeof(out), "%s", p ? p : "");
	json_decref(o);
	free(s);
	return out;
}

static void check_row(const struct row *r)
{
	json_t *b = json_loads(r->body, 0, NULL);
	struct pdx_oai_fault f;
	struct pdx_oai_error err = {0};
	struct pdx_oai_req req;
	int rc;

	memset(&f, 0, sizeof(f));

	if (!b) {
		fprintf(stderr, "bad test body %s\n", r->body);
		check_failures++;
		return;
	}
	rc = pdx_oai_params_check(b, r->chat, &f);
	if (strcmp(rc ? f.param : OK, r->vllm)) {
		fprintf(stderr,
			"%s: vLLM's rules named \"%s\" (%s), want "
			"\"%s\"\n",
			r->body, rc ? f.param : OK, rc ? f.message : "passed",
			r->vllm);
		check_failures++;
	}
	json_decref(b);
	rc = pdx_oai_parse(r->body, strlen(r->body), r->chat, &lim, &req, &err);
	if (strcmp(rc ? err.param : OK, r->engine)) {
		fprintf(stderr,
			"%s: pdx-engine named \"%s\" (%s), want "
			"\"%s\"\n",
			r->body, rc ? err.param : OK,
			rc ? err.message : "served", r->engine);
		check_failures++;
	}
	if (rc) {
		CHECK_EQ(err.status, 400);
		CHECK_STR_CONTAINS(err.message, err.param);
		/* the error body carries it as OpenAI's "param" */
		CHECK(
		    !strcmp(body_param(pdx_http_error_body(
				err.status, err.type, err.param, err.message)),
			    err.param));
	} else {
		pdx_oai_req_clear(&req);
	}
}

/* What the implemented parameters do to the prompt and the stream. */
static void check_effects(void)
{
	struct pdx_oai_error err;
	struct pdx_oai_req a, b;
	const char *full = "{\"prompt\":[1,2,3,4,5]}";
	const char *cut =
	    "{\"prompt\":[1,2,3,4,5],\"truncate_prompt_tokens\":2}";
	const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":"
			   "\"hi\"}]}";
	const char *open_end = "{\"messages\":[{\"role\":\"user\",\"content\":"
			       "\"hi\"}],\"continue_final_message\":true}";
	const char *no_gen = "{\"messages\":[{\"role\":\"user\",\"content\":"
			     "\"hi\"}],\"add_generation_prompt\":false}";
	const char *one_ids = "{\"prompt\":[[1,2,3,4,5]]}";
	const char *text = "{\"prompt\":\"a b c\"}";
	const char *one_text = "{\"prompt\":[\"a b c\"]}";
	const char *usage = "{\"prompt\":\"a\",\"stream\":true,"
			    "\"stream_options\":{},\"whatever\":1,\"x\":2}";

	CHECK(!pdx_oai_parse(cut, strlen(cut), false, &lim, &a, &err));
	CHECK_EQ(a.n_prompt, 2);
	CHECK(a.n_prompt == 2 && a.prompt[0] == 4 && a.prompt[1] == 5);
	pdx_oai_req_clear(&a);
	CHECK(!pdx_oai_parse(full, strlen(full), false, &lim, &a, &err));
	CHECK_EQ(a.n_prompt, 5);
	pdx_oai_req_clear(&a);

	CHECK(!pdx_oai_parse(chat, strlen(chat), true, &lim, &a, &err));
	CHECK(!pdx_oai_parse(open_end, strlen(open_end), true, &lim, &b, &err));
	CHECK(b.n_prompt < a.n_prompt); /* no "\n<|assistant|>\n" */
	pdx_oai_req_clear(&b);
	CHECK(!pdx_oai_parse(no_gen, strlen(no_gen), true, &lim, &b, &err));
	CHECK(b.n_prompt < a.n_prompt);
	pdx_oai_req_clear(&b);
	pdx_oai_req_clear(&a);

	/* a list of one prompt gives the prompt's own tokens */
	CHECK(!pdx_oai_parse(full, strlen(full), false, &lim, &a, &err));
	CHECK(!pdx_oai_parse(one_ids, strlen(one_ids), false, &lim, &b, &err));
	CHECK(a.n_prompt == b.n_prompt &&
	      !memcmp(a.prompt, b.prompt, sizeof(*a.prompt) * a.n_prompt));
	pdx_oai_req_clear(&b);
	pdx_oai_req_clear(&a);
	CHECK(!pdx_oai_parse(text, strlen(text), false, &lim, &a, &err));
	CHECK(
	    !pdx_oai_parse(one_text, strlen(one_text), false, &lim, &b, &err));
	CHECK(a.n_prompt == 3 && a.n_prompt == b.n_prompt &&
	      !memcmp(a.prompt, b.prompt, sizeof(*a.prompt) * a.n_prompt));
	pdx_oai_req_clear(&b);
	pdx_oai_req_clear(&a);

	/* vLLM: include_usage is true once stream_options is given */
	CHECK(!pdx_oai_parse(usage, strlen(usage), false, &lim, &a, &err));
	CHECK(a.stream && a.include_usage);
	CHECK(!strcmp(a.ignored, "whatever, x"));
	pdx_oai_req_clear(&a);
}

/* A body as vLLM's server reads it (Python's json.loads): what
 * pdx_oai_body_load() takes, and what it refuses with which param. */
static void check_body_load(void)
{
	static const struct {
		const char *body;
		bool ok;	   /* loaded */
		const char *param; /* when refused */
	} cases[] = {
	    {"\xef\xbb\xbf{\"prompt\":\"a\"}", true, ""},
	    {"{\"prompt\":\"a\"} \r\n", true, ""},
	    {"{\"max_tokens\":2,\"max_tokens\":3}", true, ""},
	    {"{\"prompt\":\"a\\u0000b\"}", true, ""},
	    {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
	     "\"text\",\"text\":\"\\u0000\"}]}]}",
	     true, ""},
	    {"", false, ""},
	    {"\xef\xbb\xbf", false, ""},
	    {"{\"prompt\":\"a\"} x", false, ""},
	    {"[1]", false, ""},
	    {"{\"model\":\"m\\u0000x\"}", false, "model"},
	    {"{\"kv_transfer_params\":{\"xfer_id\":\"\\u0000\"}}", false,
	     "kv_transfer_params"},
	};
	struct pdx_oai_fault f;
	struct pdx_oai_error err;
	struct pdx_oai_req r;
	const char *nul = "{\"prompt\":\"a\\u0000b\"}";
	const char *twice = "{\"n\":2,\"n\":1}";
	json_t *b;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		memset(&f, 0, sizeof(f));
		b = pdx_oai_body_load(cases[i].body, strlen(cases[i].body), &f);
		if (!b != !cases[i].ok ||
		    (!b && strcmp(f.param, cases[i].param))) {
			fprintf(stderr, "%s: %s (param \"%s\"), want %s\n",
				cases[i].body, b ? "loaded" : f.message,
				f.param, cases[i].ok ? "loaded" : "refused");
			check_failures++;
		}
		if (!b)
			CHECK(f.message[0]);
		json_decref(b);
	}
	b = pdx_oai_body_load(NULL, 0, &f);
	CHECK(!b && strstr(f.message, "empty"));
	/* the last of a key given twice counts, as in Python */
	b = pdx_oai_body_load(twice, strlen(twice), &f);
	CHECK(b && json_integer_value(json_object_get(b, "n")) == 1);
	json_decref(b);
	/* a NUL in the prompt is text: "a", NUL, "b" */
	CHECK(!pdx_oai_parse(nul, strlen(nul), false, &lim, &r, &err));
	CHECK_EQ(r.n_prompt, 3);
	pdx_oai_req_clear(&r);
}

int main(void)
{
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		check_row(&rows[i]);
	check_effects();
	check_body_load();
	CHECK(pdx_oai_params_known("temperature", true));
	CHECK(pdx_oai_params_known("suffix", false));
	CHECK(!pdx_oai_params_known("suffix", true));
	CHECK(!pdx_oai_params_known("best_of", false));
	CHECK_DONE();
}
