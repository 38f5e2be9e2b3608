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

/* remote_agents and remote_tp_size, both optional; the list's first is
 * remote_agent (taken as it when that is absent), and remote_agent alone
 * is a list of one. */
static int parse_ranks(json_t *o, struct pdx_kv_params *out, char *msg,
		       size_t msglen)
{
	json_t *v = json_object_get(o, "remote_agents"), *a;
	size_t i;

	if (!absent(v)) {
		if (!json_is_array(v) || json_array_size(v) == 0 ||
		    json_array_size(v) > PDX_TP_MAX)
			goto bad;
		json_array_foreach(v, i, a)
		{
			const char *s = json_string_value(a);

			if (!s || strncmp(s, "tcp://", 6) ||
			    strlen(s) >= PDX_ADDR_MAX)
				goto bad;
			strcpy(out->remote_agents.addr[i], s);
		}
		out->remote_agents.n = (uint32_t)json_array_size(v);
		if (!out->remote_agent[0])
			strcpy(out->remote_agent, out->remote_agents.addr[0]);
		else if (strcmp(out->remote_agent, out->remote_agents.addr[0]))
			goto bad;
	} else if (out->remote_agent[0]) {
		strcpy(out->remote_agents.addr[0], out->remote_agent);
		out->remote_agents.n = 1;
	}
	v = json_object_get(o, "remote_tp_size");
	if (absent(v))
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 1 ||
	    json_integer_value(v) > PDX_TP_MAX) {
		snprintf(msg, msglen,
			 "kv_transfer_params.remote_tp_size: want an integer "
			 "in [1, %d]",
			 PDX_TP_MAX);
		return -1;
	}
	out->remote_tp = (uint32_t)json_integer_value(v);
	return 0;
bad:
	snprintf(msg, msglen,
		 "kv_transfer_params.remote_agents: want the other side's "
		 "agent addresses (tcp://HOST:PORT), one per rank (at most "
		 "%d), the first remote_agent",
		 PDX_TP_MAX);
	return -1;
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
	/* an agent's peer address is tcp:// (a bare HOST:PORT failed at
	 * the agent, and the client got a 500) */
	if (!absent(v) && (!s || strncmp(s, "tcp://", 6) ||
			   strlen(s) >= sizeof(out->remote_agent)))
		goto bad_agent;
	if (s)
		strcpy(out->remote_agent, s);
	if (parse_ranks(o, out, msg, msglen))
		return -1;
	/* the decode side must know its sender (remote_agents' first will
	 * do) */
	if (out->role == PDX_KV_RECV && !out->remote_agent[0])
		goto bad_agent;
	out->peer_read = true;
	if (out->role == PDX_KV_RECV)
		return parse_decode_side(o, vocab, out, msg, msglen);
	return parse_prefill_side(o, out, msg, msglen);
bad_agent:
	snprintf(msg, msglen,
		 "kv_transfer_params.remote_agent: want the other side's agent "
		 "address, tcp://HOST:PORT");
	return -1;
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

json_t *pdx_kv_peers_json(const struct pdx_kv_peers *peers)
{
	json_t *a = json_array();

	for (uint32_t r = 0; a && r < peers->n; r++)
		if (json_array_append_new(a, json_string(peers->addr[r]))) {
			json_decref(a);
			a = NULL;
		}
	return a;
}

void pdx_kv_peers_join(const struct pdx_kv_peers *peers, char *out,
		       size_t outlen)
{
	size_t at = 0;

	if (outlen)
		out[0] = '\0';
	for (uint32_t r = 0; r < peers->n && at < outlen; r++)
		at += (size_t)snprintf(out + at, outlen - at, "%s%s",
				       r ? "," : "", peers->addr[r]);
}

int pdx_kv_params_answer_ranks(json_t *answer, const struct pdx_kv_peers *own)
{
	if (own->n <= 1)
		return 0; /* TP 1: the answer is as it always was */
	if (json_object_set_new(answer, "remote_agents",
				pdx_kv_peers_json(own)) ||
	    json_object_set_new(answer, "remote_tp_size",
				json_integer(own->n)))
		return -1;
	return 0;
}

int pdx_kv_params_check_tp(const struct pdx_kv_params *p, char *msg,
			   size_t msglen)
{
	uint32_t n = p->remote_agents.n, other = p->remote_tp;

	if (p->role == PDX_KV_NONE)
		return 0;
	if ((other & (other - 1)) || (n & (n - 1))) {
		snprintf(msg, msglen,
			 "kv_transfer_params: a TP size is a power of two "
			 "(remote_tp_size %u, %u remote_agents)",
			 other, n);
		return -1;
	}
	if (n > 1 && other && n != other) {
		snprintf(msg, msglen,
			 "kv_transfer_params: %u remote_agents for a "
			 "remote_tp_size of %u",
			 n, other);
		return -1;
	}
	/* a decode rank takes its heads from the prefill ranks that hold
	 * them, whatever the two TP sizes (their agents reshard): it must
	 * know every one of them */
	if (p->role == PDX_KV_RECV && other > 1 && n != other) {
		snprintf(msg, msglen,
			 "kv_transfer_params.remote_agents: the prefill "
			 "instance has TP size %u; this decode instance needs "
			 "the agents of all %u ranks (a TP prefill instance's "
			 "answer has them)",
			 other, other);
		return -1;
	}
	return 0;
}
