/* kv_transfer_params: read from a request, written into the prefill
 * side's response. */
#include "engine/kv_params.h"

#include <stdio.h>
#include <string.h>

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static int parse_xfer(const char *s, struct pdx_kv_params *out)
{
	if (strlen(s) != 2 * PDX_XFER_ID_BYTES)
		return -1;
	for (int i = 0; i < PDX_XFER_ID_BYTES; i++) {
		int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return -1;
		out->xfer.b[i] = (uint8_t)(hi << 4 | lo);
	}
	pdx_xfer_id_hex(&out->xfer, out->xfer_hex);
	return 0;
}

static bool flag(json_t *o, const char *key)
{
	return json_is_true(json_object_get(o, key));
}

static int parse_decode_side(json_t *o, uint32_t vocab,
			     struct pdx_kv_params *out, char *msg,
			     size_t msglen)
{
	json_t *v = json_object_get(o, "first_token");

	if (v && !json_is_null(v)) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= vocab) {
			snprintf(msg, msglen,
				 "kv_transfer_params.first_token: want a token "
				 "id below %u",
				 vocab);
			return -1;
		}
		out->first_token = json_integer_value(v);
	}
	v = json_object_get(o, "on_failure");
	if (v && !json_is_null(v)) {
		const char *s = json_string_value(v);

		if (!s || (strcmp(s, "fail") && strcmp(s, "recompute"))) {
			snprintf(msg, msglen,
				 "kv_transfer_params.on_failure: want \"fail\" "
				 "or \"recompute\"");
			return -1;
		}
		out->recompute = !strcmp(s, "recompute");
	}
	return 0;
}

static int parse_prefill_side(json_t *o, struct pdx_kv_params *out,
			      char *msg, size_t msglen)
{
	json_t *v = json_object_get(o, "metaserver");
	const char *s = json_string_value(v);

	if (!v || json_is_null(v))
		return 0;
	if (!s || strncmp(s, "http://", 7) || strlen(s) >= PDX_KV_URL_MAX) {
		snprintf(msg, msglen,
			 "kv_transfer_params.metaserver: want an http:// URL "
			 "shorter than %d bytes",
			 PDX_KV_URL_MAX);
		return -1;
	}
	strcpy(out->metaserver, s);
	return 0;
}

static bool absent(json_t *v)
{
	return !v || json_is_null(v);
}

int pdx_kv_params_parse(json_t *o, uint32_t vocab, struct pdx_kv_params *out,
			char *msg, size_t msglen)
{
	const char *s;
	json_t *v;

	memset(out, 0, sizeof(*out));
	out->first_token = -1;
	if (!o || json_is_null(o))
		return 0;
	if (!json_is_object(o)) {
		snprintf(msg, msglen, "kv_transfer_params must be an object");
		return -1;
	}
	if (flag(o, "do_remote_prefill") && flag(o, "do_remote_decode")) {
		snprintf(msg, msglen,
			 "kv_transfer_params: do_remote_prefill and "
			 "do_remote_decode are exclusive");
		return -1;
	}
	if (flag(o, "do_remote_prefill"))
		out->role = PDX_KV_RECV;
	else if (flag(o, "do_remote_decode"))
		out->role = PDX_KV_SEND;
	else
		return 0; /* nothing to move: run here */
	/* The prefill side may be told neither (vLLM's proxies): it mints
	 * the id and leaves the receiver open (docs/security.md). */
	v = json_object_get(o, "xfer_id");
	s = json_string_value(v);
	if (!(out->role == PDX_KV_SEND && absent(v)) &&
	    (!s || parse_xfer(s, out))) {
		snprintf(msg, msglen,
			 "kv_transfer_params.xfer_id: want 32 hex digits");
		return -1;
	}
	v = json_object_get(o, "remote_agent");
	s = json_string_value(v);
	if (!(out->role == PDX_KV_SEND && absent(v)) &&
	    (!s || !*s || strlen(s) >= sizeof(out->remote_agent))) {
		snprintf(msg, msglen,
			 "kv_transfer_params.remote_agent: want the other "
			 "side's agent address");
		return -1;
	}
	if (s)
		strcpy(out->remote_agent, s);
	if (out->role == PDX_KV_RECV)
		return parse_decode_side(o, vocab, out, msg, msglen);
	return parse_prefill_side(o, out, msg, msglen);
}

int pdx_kv_params_mint(struct pdx_kv_params *p)
{
	if (p->xfer_hex[0])
		return 0;
	if (pdx_xfer_id_random(&p->xfer) != PDX_OK)
		return -1;
	pdx_xfer_id_hex(&p->xfer, p->xfer_hex);
	return 0;
}

json_t *pdx_kv_params_answer(const struct pdx_kv_params *p,
			     const char *own_agent, int64_t first_token)
{
	json_t *o = json_pack("{s:s, s:s, s:b, s:b}", "xfer_id", p->xfer_hex,
			      "remote_agent", own_agent, "do_remote_prefill",
			      1, "do_remote_decode", 0);

	if (o && first_token >= 0 &&
	    json_object_set_new(o, "first_token",
				json_integer((json_int_t)first_token))) {
		json_decref(o);
		return NULL;
	}
	return o;
}
