/* Request bodies and streamed chunks as vllm bench serve sends and reads
 * them. */
#include "bench/load_openai.h"
#include "tests/check.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>

static json_t *body(const struct pdx_load_body_params *bp)
{
	size_t len = 0;
	char *s = pdx_load_openai_body(bp, &len);
	json_t *j;

	if (!s)
		return NULL;
	CHECK_EQ(strlen(s), len);
	j = json_loads(s, 0, NULL);
	free(s);
	return j;
}

static void test_bodies(void)
{
	uint32_t ids[] = {3, 1, 4};
	struct pdx_load_body_params bp = {.model = "m",
					  .text = "a b c",
					  .max_tokens = 7,
					  .ignore_eos = true,
					  .temperature = NAN,
					  .top_p = NAN,
					  .top_k = -1};
	json_t *j, *so;

	j = body(&bp);
	CHECK(j != NULL);
	CHECK(!strcmp(json_string_value(json_object_get(j, "model")), "m"));
	CHECK(
	    !strcmp(json_string_value(json_object_get(j, "prompt")), "a b c"));
	CHECK_EQ(json_integer_value(json_object_get(j, "max_tokens")), 7);
	CHECK(json_is_true(json_object_get(j, "stream")));
	so = json_object_get(j, "stream_options");
	CHECK(json_is_true(json_object_get(so, "include_usage")));
	CHECK(json_is_true(json_object_get(j, "ignore_eos")));
	CHECK(json_object_get(j, "temperature") == NULL);
	CHECK(json_object_get(j, "messages") == NULL);
	json_decref(j);

	/* Token ids as an array; sampling parameters when given. */
	bp.text = NULL;
	bp.ids = ids;
	bp.n_ids = 3;
	bp.ignore_eos = false;
	bp.temperature = 0.0;
	bp.top_k = 5;
	j = body(&bp);
	CHECK(json_array_size(json_object_get(j, "prompt")) == 3);
	CHECK_EQ(
	    json_integer_value(json_array_get(json_object_get(j, "prompt"), 2)),
	    4);
	CHECK(json_object_get(j, "ignore_eos") == NULL);
	CHECK(json_real_value(json_object_get(j, "temperature")) == 0.0);
	CHECK_EQ(json_integer_value(json_object_get(j, "top_k")), 5);
	json_decref(j);

	/* Chat: one user message with a text part; max_completion_tokens. */
	bp.chat = true;
	CHECK(pdx_load_openai_body(&bp, NULL) == NULL); /* ids: no chat */
	bp.text = "hi there";
	j = body(&bp);
	CHECK(json_object_get(j, "prompt") == NULL);
	CHECK_EQ(
	    json_integer_value(json_object_get(j, "max_completion_tokens")), 7);
	{
		json_t *msg = json_array_get(json_object_get(j, "messages"), 0);
		json_t *part =
		    json_array_get(json_object_get(msg, "content"), 0);

		CHECK(!strcmp(json_string_value(json_object_get(msg, "role")),
			      "user"));
		CHECK(!strcmp(json_string_value(json_object_get(part, "text")),
			      "hi there"));
	}
	json_decref(j);
}

static int chunk(const char *s, bool chat, struct pdx_load_chunk *c,
		 char **text, size_t *tl)
{
	return pdx_load_openai_chunk(s, strlen(s), chat, c, text, tl);
}

static void test_chunks(void)
{
	struct pdx_load_chunk c;
	char *text = NULL;
	size_t tl = 0;

	CHECK_EQ(
	    chunk("{\"choices\":[{\"text\":\"Hel\"}]}", false, &c, &text, &tl),
	    0);
	CHECK(c.has_choices && !c.done);
	CHECK_EQ(c.completion_tokens, -1);
	/* Empty text is still a token chunk (a special token). */
	CHECK_EQ(
	    chunk("{\"choices\":[{\"text\":\"\"}]}", false, &c, &text, &tl), 0);
	CHECK(c.has_choices);
	CHECK_EQ(
	    chunk("{\"choices\":[{\"text\":\"lo\"}]}", false, &c, &text, &tl),
	    0);
	CHECK(!strcmp(text, "Hello"));
	CHECK_EQ(tl, 5);
	/* The usage chunk: no choices, token counts. */
	CHECK_EQ(chunk("{\"choices\":[],\"usage\":{\"prompt_tokens\":12,"
		       "\"completion_tokens\":3}}",
		       false, &c, &text, &tl),
		 0);
	CHECK(!c.has_choices);
	CHECK_EQ(c.completion_tokens, 3);
	CHECK_EQ(c.prompt_tokens, 12);
	CHECK_EQ(chunk("[DONE]", false, &c, &text, &tl), 0);
	CHECK(c.done && !c.has_choices);
	/* Chat deltas; a role-only first delta is a token chunk too. */
	CHECK_EQ(chunk("{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}",
		       true, &c, &text, &tl),
		 0);
	CHECK(c.has_choices);
	CHECK_EQ(chunk("{\"choices\":[{\"delta\":{\"content\":\"!\"}}]}", true,
		       &c, &text, &tl),
		 0);
	CHECK(!strcmp(text, "Hello!"));
	/* Not JSON, or not an object: the request fails. */
	CHECK_EQ(chunk("{\"choices\":[", false, &c, NULL, NULL), -1);
	CHECK_EQ(chunk("42", false, &c, NULL, NULL), -1);
	/* No text wanted. */
	CHECK_EQ(
	    chunk("{\"choices\":[{\"text\":\"x\"}]}", false, &c, NULL, NULL),
	    0);
	free(text);
}

int main(void)
{
	test_bodies();
	test_chunks();
	CHECK_DONE();
}
