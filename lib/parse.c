/* What the agent's messages say, read from their bytes: a frame
 * classified (an event parsed, anything else left parsed for its reader),
 * an answer to register. No engine, no socket: the fuzz target
 * engine_client feeds them any bytes (tests/fuzz).
 */
#define PDX_LOG_TOPIC "engine"

#include "lib/client.h"

#include <stdio.h>
#include <string.h>

#include "common/log.h"

/* Copies a str field, truncating it to outlen - 1 bytes. */
int pdx__get_str_trunc(const msgpack_object *map, const char *key, char *out,
		       size_t outlen)
{
	const msgpack_object *o = pdx_mp_get(map, key);
	size_t n;

	if (!o || o->type != MSGPACK_OBJECT_STR || outlen == 0)
		return -1;
	n = o->via.str.size < outlen - 1 ? o->via.str.size : outlen - 1;
	memcpy(out, o->via.str.ptr, n);
	out[n] = '\0';
	return 0;
}

/* Reads an "event" map into *ev; -1 when a required field is missing. */
static int parse_event(const msgpack_object *m, struct pdx_engine_event *ev)
{
	char kind[16];
	int64_t status;

	memset(ev, 0, sizeof(*ev));
	if (pdx_mp_get_xfer(m, "xfer", &ev->xfer) ||
	    pdx_mp_get_str(m, "kind", kind, sizeof(kind)) ||
	    pdx_mp_get_i64(m, "status", &status) ||
	    pdx__get_str_trunc(m, "reason", ev->reason, sizeof(ev->reason)) ||
	    pdx_mp_get_u64(m, "bytes", &ev->bytes) ||
	    pdx_mp_get_u64(m, "t_first", &ev->t_first_ns) ||
	    pdx_mp_get_u64(m, "t_last", &ev->t_last_ns))
		return -1;
	if (strcmp(kind, "sent") == 0)
		ev->kind = PDX_EVENT_SENT;
	else if (strcmp(kind, "received") == 0)
		ev->kind = PDX_EVENT_RECEIVED;
	else if (strcmp(kind, "failed") == 0)
		ev->kind = PDX_EVENT_FAILED;
	else
		return -1;
	if (status < -100000 || status > 0)
		return -1;
	ev->status = (pdx_status_t)status;
	if (pdx_mp_get_i64(m, "first_token", &ev->first_token) ||
	    ev->first_token < 0 || ev->first_token > UINT32_MAX)
		ev->first_token = -1; /* optional; older agents lack it */
	/* a failure always carries a failure status */
	if (ev->kind == PDX_EVENT_FAILED && ev->status == PDX_OK)
		ev->status = PDX_EIO;
	return 0;
}

/* Classifies a received frame. For "event" fills *ev; whatever parses,
 * an event too, is left parsed in *up (caller destroys), its op in op. */
enum pdx__msg pdx__classify(const struct pdx__frame *f, msgpack_unpacked *up,
			    char *op, size_t oplen, struct pdx_engine_event *ev)
{
	if (pdx_mp_parse(f->data, f->len, up, op, oplen)) {
		log_warn(
		    "skipped a malformed message from the agent (%zu bytes)",
		    f->len);
		return PDX__MSG_SKIP;
	}
	if (strcmp(op, "event") == 0) {
		if (parse_event(&up->data, ev)) {
			log_warn("skipped a malformed event from the agent");
			return PDX__MSG_SKIP;
		}
		return PDX__MSG_EVENT;
	}
	return PDX__MSG_OTHER;
}

void pdx__kv_dtype_heard(const msgpack_object *m, const char *kv_dtype)
{
	char heard[PDX_KV_DTYPE_MAX];

	if (!kv_dtype[0])
		return;
	if (pdx_mp_get_str(m, "kv_dtype", heard, sizeof(heard)))
		log_warn("register: the agent did not say back kv_dtype %s: "
			 "an older agent, which may not compare KV element "
			 "types (one from before libpdx 0.6 pairs engines of "
			 "any two types): upgrade it",
			 kv_dtype);
	else if (strcmp(heard, kv_dtype))
		log_warn("register: the agent took kv_dtype %s, not %s",
			 heard, kv_dtype);
}

/* Reads an answer to register: returns 1 with *st set for "registered" and
 * "error" (why it failed in why, when why), 0 for anything else (a
 * message register does not wait for). */
int pdx__register_answer(const msgpack_object *m, const char *op,
			 char *peer_addr, size_t peer_addr_len,
			 pdx_status_t *st, char *why, size_t why_len)
{
	char peer[PDX_ADDR_MAX], reason[PDX_REASON_MAX];
	int64_t status;

	if (strcmp(op, "registered") == 0) {
		if (pdx_mp_get_str(m, "peer", peer, sizeof(peer)) || !peer[0]) {
			log_error("register: answer without a peer address");
			*st = PDX_EIO;
			if (why)
				snprintf(why, why_len, "register: the agent "
					 "answered without a peer address");
		} else if (peer_addr && strlen(peer) >= peer_addr_len) {
			*st = PDX_ETOOBIG;
			if (why)
				snprintf(why, why_len, "register: the agent's "
					 "peer address is over %zu bytes",
					 peer_addr_len - 1);
		} else {
			if (peer_addr)
				memcpy(peer_addr, peer, strlen(peer) + 1);
			*st = PDX_OK;
		}
		return 1;
	}
	if (strcmp(op, "error") == 0) {
		char refused[32];

		/* an answer to something else (older agents name nothing) */
		if (!pdx_mp_get_str(m, "refused", refused, sizeof(refused)) &&
		    strcmp(refused, "register") != 0) {
			log_debug("register: ignored an error about \"%s\"",
				  refused);
			return 0;
		}
		if (pdx__get_str_trunc(m, "reason", reason, sizeof(reason)))
			snprintf(reason, sizeof(reason), "(no reason)");
		if (pdx_mp_get_i64(m, "status", &status) || status >= 0 ||
		    status < -100000)
			status = PDX_EIO;
		log_error("register refused by the agent: %s (%s)", reason,
			  pdx_status_str((pdx_status_t)status));
		*st = (pdx_status_t)status;
		if (why)
			snprintf(why, why_len, "register refused by the agent: %s",
				 reason);
		return 1;
	}
	log_debug("register: ignored \"%s\" from the agent", op);
	return 0;
}

void pdx__lane_offer_read(const msgpack_object *m, struct pdx__lane_offer *o)
{
	const void *tok;
	size_t len;

	o->given = !pdx_mp_get_str(m, "direct", o->name, sizeof(o->name)) &&
		   o->name[0] &&
		   !pdx_mp_get_bin(m, "direct_token", &tok, &len) &&
		   len == sizeof(o->token);
	if (o->given)
		memcpy(o->token, tok, len);
}
