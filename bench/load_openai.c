#include "bench/load_openai.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static json_t *prompt_value(const struct pdx_load_body_params *bp)
{
	json_t *arr;
	size_t i;

	if (bp->text)
		return json_string(bp->text);
	arr = json_array();
	if (!arr)
		return NULL;
	for (i = 0; i < bp->n_ids; i++)
		if (json_array_append_new(arr, json_integer(bp->ids[i]))) {
			json_decref(arr);
			return NULL;
		}
	return arr;
}

static json_t *chat_messages(const char *text)
{
	return json_pack("[{s:s, s:[{s:s, s:s}]}]", "role", "user", "content",
			 "type", "text", "text", text);
}

char *pdx_load_openai_body(const struct pdx_load_body_params *bp,
			   size_t *len_out)
{
	json_t *o = NULL, *v;
	char *s = NULL;
	int err = 0;

	if (bp->chat && !bp->text)
		return NULL;
	o = json_object();
	if (!o)
		return NULL;
	err |= json_object_set_new(o, "model",
				   json_string(bp->model ? bp->model : ""));
	if (bp->chat) {
		v = chat_messages(bp->text);
		err |= !v || json_object_set_new(o, "messages", v);
		err |= json_object_set_new(o, "max_completion_tokens",
					   json_integer(bp->max_tokens));
	} else {
		v = prompt_value(bp);
		err |= !v || json_object_set_new(o, "prompt", v);
		err |= json_object_set_new(o, "repetition_penalty",
					   json_real(1.0));
		err |= json_object_set_new(o, "max_tokens",
					   json_integer(bp->max_tokens));
		err |= json_object_set_new(o, "logprobs", json_null());
	}
	err |= json_object_set_new(o, "stream", json_true());
	err |= json_object_set_new(o, "stream_options",
				   json_pack("{s:b}", "include_usage", 1));
	if (bp->ignore_eos)
		err |= json_object_set_new(o, "ignore_eos", json_true());
	if (!isnan(bp->temperature))
		err |= json_object_set_new(o, "temperature",
					   json_real(bp->temperature));
	if (!isnan(bp->top_p))
		err |= json_object_set_new(o, "top_p", json_real(bp->top_p));
	if (bp->top_k >= 0)
		err |= json_object_set_new(o, "top_k", json_integer(bp->top_k));
	if (!err)
		s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (s && len_out)
		*len_out = strlen(s);
	return s;
}

static void append_text(char **text, size_t *text_len, const char *s)
{
	size_t n = strlen(s);
	char *nt;

	if (!n)
		return;
	nt = realloc(*text, *text_len + n + 1);
	if (!nt)
		return;
	memcpy(nt + *text_len, s, n + 1);
	*text = nt;
	*text_len += n;
}

static long usage_field(json_t *usage, const char *key)
{
	json_t *v = json_object_get(usage, key);

	return json_is_integer(v) ? (long)json_integer_value(v) : -1;
}

int pdx_load_openai_chunk(const char *data, size_t len, bool chat,
			  struct pdx_load_chunk *out, char **text,
			  size_t *text_len)
{
	json_t *root, *choices, *c0, *t, *usage;

	memset(out, 0, sizeof(*out));
	out->completion_tokens = out->prompt_tokens = -1;
	if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
		out->done = true;
		return 0;
	}
	root = json_loadb(data, len, 0, NULL);
	if (!json_is_object(root)) {
		json_decref(root);
		return -1;
	}
	choices = json_object_get(root, "choices");
	if (json_is_array(choices) && json_array_size(choices) > 0) {
		/* Text may be empty (a special token): still a token chunk. */
		out->has_choices = true;
		c0 = json_array_get(choices, 0);
		t = chat ? json_object_get(json_object_get(c0, "delta"),
					   "content")
			 : json_object_get(c0, "text");
		if (text && json_is_string(t))
			append_text(text, text_len, json_string_value(t));
	} else {
		usage = json_object_get(root, "usage");
		if (json_is_object(usage)) {
			out->completion_tokens =
			    usage_field(usage, "completion_tokens");
			out->prompt_tokens =
			    usage_field(usage, "prompt_tokens");
		}
	}
	json_decref(root);
	return 0;
}
