/* The request field kv_transfer_params: what pairs a prefill engine's
 * request with a decode engine's (docs/engine.md, "Disaggregated roles").
 * Proxies pass the object through unchanged; the engine reads
 *
 *   xfer_id            32 hex digits, minted by whoever pairs the two;
 *                      prefill side: absent or null, minted by it
 *   remote_agent       the other side's agent peer address; prefill
 *                      side: absent or null, the receiver is left open
 *                      (the first agent to present the id claims it)
 *   remote_agents      optional: the other side's agents, one per rank
 *                      of its tensor-parallel instance, rank order (the
 *                      first is remote_agent)
 *   remote_tp_size     optional: the other side's TP size
 *   do_remote_prefill  true: decode side, the prompt's KV is received
 *   do_remote_decode   true: prefill side, the prompt's KV is sent
 *   first_token        decode side, optional: the prefill's first token,
 *                      used when the agents carry none with the KV
 *   on_failure         decode side, optional: "fail" (default) or
 *                      "recompute" (prefill here)
 *   metaserver         prefill side, optional: an http:// URL to post
 *                      the decode side's object to when the prefill
 *                      starts (the early-callback flow)
 *
 * and a prefill engine answers (and posts to metaserver) the object a
 * decode request needs: xfer_id, remote_agent (its own agent),
 * do_remote_prefill: true, do_remote_decode: false, first_token (in the
 * answer; not known yet when the prefill starts), and from a TP instance
 * remote_agents and remote_tp_size (pdx_kv_params_answer_ranks()).
 *
 * Pure (jansson only) but for pdx_kv_params_mint(); any thread.
 */
#ifndef PDX_ENGINE_KV_PARAMS_H
#define PDX_ENGINE_KV_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <pdx/engine.h>

#include "engine/kv_peers.h"

#define PDX_KV_URL_MAX 256

enum pdx_kv_role {
	PDX_KV_NONE = 0, /* no transfer: the request runs here, colocated */
	PDX_KV_RECV,	 /* do_remote_prefill */
	PDX_KV_SEND,	 /* do_remote_decode */
};

struct pdx_kv_params {
	enum pdx_kv_role role;
	struct pdx_xfer_id xfer;
	char xfer_hex[33];
	char remote_agent[PDX_ADDR_MAX];
	struct pdx_kv_peers remote_agents; /* n 0: not given */
	uint32_t remote_tp;		   /* remote_tp_size; 0: not given */
	int64_t first_token; /* -1: not given */
	bool recompute;	     /* on_failure "recompute" */
	char metaserver[PDX_KV_URL_MAX]; /* "" when not given */
	/* role, xfer and the remote agents were read and are valid: set
	 * also when a later field (on_failure, first_token ...) failed */
	bool peer_read;
};

/* Reads o (NULL or null: role NONE). 0, or -1 with the reason in msg
 * (and peer_read when only a side's own field was wrong). Keys it does
 * not read (vLLM's remote_engine_id, ...) are ignored. A prefill side
 * given no xfer_id has xfer_hex "" and remote_agent "". */
int pdx_kv_params_parse(json_t *o, uint32_t vocab, struct pdx_kv_params *out,
			char *msg, size_t msglen);

/* Mints p's xfer_id (128 random bits) unless it was given. 0, or -1 when
 * the system has no random bytes. */
int pdx_kv_params_mint(struct pdx_kv_params *p);

/* The prefill side's answer (first_token < 0: left out, for the early
 * callback): a new object, NULL when out of memory. */
json_t *pdx_kv_params_answer(const struct pdx_kv_params *p,
			     const char *own_agent, int64_t first_token);

/* peers' addresses as a JSON array, rank order (a new one; NULL: out of
 * memory): /v1/pdx/info's peer_addrs, an answer's remote_agents. */
json_t *pdx_kv_peers_json(const struct pdx_kv_peers *peers);

/* What pdx_kv_peers_join() may write, its NUL included: each address is
 * shorter than PDX_ADDR_MAX, and a comma or the NUL follows it. */
#define PDX_KV_PEERS_JOIN_MAX (PDX_TP_MAX * PDX_ADDR_MAX)

/* The same addresses joined by commas, rank order, into out ("" for
 * none; cut at outlen): /health's X-PDX-Agent. */
void pdx_kv_peers_join(const struct pdx_kv_peers *peers, char *out,
		       size_t outlen);

/* Adds a TP instance's own rank agents (own->n > 1) to an answer:
 * remote_agents and remote_tp_size. 0, or -1 when out of memory. */
int pdx_kv_params_answer_ranks(json_t *answer, const struct pdx_kv_peers *own);

/* 0 when p's ranks add up: remote_agents lists remote_tp_size agents
 * where both are given, and a decode side knows every prefill rank's
 * agent. Any two TP sizes may pair: the agents reshard the KV heads
 * (docs/protocol.md, "TP legs"; a split that cannot work, they refuse
 * saying why). Else -1 and why in msg. */
int pdx_kv_params_check_tp(const struct pdx_kv_params *p,
			   char *msg, size_t msglen);

#endif
