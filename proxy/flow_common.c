/* What the flows share (see flow.h): picking the instances, learning their
 * agents, building the legs' bodies, and a failed prefill. */
#define PDX_LOG_TOPIC "flow"
#include "proxy/flow.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdx/engine.h>

#include "common/fnv.h"
#include "common/log.h"
#include "proxy/call.h"

static int xfer_id_mint(struct pdx_call *c)
{
	struct pdx_xfer_id x;

	if (pdx_xfer_id_random(&x) != PDX_OK)
		return -1;
	pdx_xfer_id_hex(&x, c->xfer_id);
	return 0;
}

/* What only the proxy says in a leg's kv_transfer_params: which transfer,
 * between which agents, which side each leg is, and the first token.
 * Taken from a client, they let any client fail or falsify requests,
 * its own and others': its remote_agent made P push to an agent of its
 * choosing (five requests naming a dead one opened P's circuit breaker
 * for every client), one xfer_id in two requests failed both engines
 * with 5xx (both breakers open), and its first_token became D's first
 * token, whatever P's was. */
static const char *const proxy_only[] = {
    "xfer_id",	   "remote_agent", "remote_agents",	"remote_tp_size",
    "first_token", "metaserver",   "do_remote_prefill", "do_remote_decode",
};

#define N_PROXY_ONLY (sizeof(proxy_only) / sizeof(*proxy_only))

/* The client's kv_transfer_params, if an object. */
static json_t *client_kv_own(const struct pdx_call *c)
{
	json_t *own = json_object_get(c->body, "kv_transfer_params");

	return json_is_object(own) ? own : NULL;
}

/* Whether the client's kv_transfer_params say what only the proxy may. */
static bool client_kv_oversteps(const struct pdx_call *c)
{
	json_t *own = client_kv_own(c);

	for (size_t i = 0; own && i < N_PROXY_ONLY; i++)
		if (json_object_get(own, proxy_only[i]))
			return true;
	return false;
}

/* A leg's kv_transfer_params to start from: the client's own (its
 * on_failure, keys for other connectors) less what only the proxy says;
 * a new object, NULL when out of memory. */
static json_t *client_kv(const struct pdx_call *c)
{
	json_t *own = client_kv_own(c);
	json_t *kv = own ? json_deep_copy(own) : json_object();

	for (size_t i = 0; kv && i < N_PROXY_ONLY; i++)
		json_object_del(kv, proxy_only[i]);
	return kv;
}

/* Feeds at most *left bytes of p into the key. */
static uint64_t key_add(uint64_t h, const void *p, size_t n, size_t *left)
{
	n = n < *left ? n : *left;
	*left -= n;
	return pdx_fnv1a64(h, p, n);
}

static uint64_t key_add_str(uint64_t h, const json_t *s, size_t *left)
{
	return json_is_string(s) ? key_add(h, json_string_value(s),
					   json_string_length(s), left)
				 : h;
}

/* The start of a prompt: text, token ids (4 bytes each, little-endian)
 * or, in a batch, its first prompt. */
static uint64_t key_prompt(uint64_t h, const json_t *prompt, size_t *left)
{
	size_t k;
	json_t *v;

	if (!json_is_array(prompt))
		return key_add_str(h, prompt, left);
	v = json_array_get(prompt, 0);
	if (json_is_string(v) || json_is_array(v))
		return key_prompt(h, v, left);
	json_array_foreach(prompt, k, v) {
		uint32_t id = (uint32_t)json_integer_value(v);
		unsigned char le[4] = {id, id >> 8, id >> 16, id >> 24};

		if (!*left)
			break;
		h = key_add(h, le, sizeof(le), left);
	}
	return h;
}

/* prefix-aware's key: the first --prefix-len bytes of the prompt, or of
 * the chat's roles and texts in order. */
static uint64_t prefix_key(const json_t *body, size_t len)
{
	const json_t *msgs = json_object_get(body, "messages");
	uint64_t h = PDX_FNV1A64_INIT;
	size_t k, left = len;
	json_t *m;

	if (!json_is_array(msgs))
		return key_prompt(h, json_object_get(body, "prompt"), &left);
	json_array_foreach(msgs, k, m) {
		const json_t *content = json_object_get(m, "content");
		size_t j;
		json_t *part;

		h = key_add_str(h, json_object_get(m, "role"), &left);
		if (!json_is_array(content)) {
			h = key_add_str(h, content, &left);
			continue;
		}
		json_array_foreach(content, j, part)
			h = key_add_str(h, json_object_get(part, "text"), &left);
	}
	return h;
}

int pdx_flow_pick(struct pdx_call *c)
{
	struct pdx_pool *p = &c->px->pool[PDX_POOL_PREFILL];
	struct pdx_pool *d = &c->px->pool[PDX_POOL_DECODE];
	uint64_t key = p->policy == PDX_POLICY_PREFIX_AWARE ||
			       d->policy == PDX_POLICY_PREFIX_AWARE
			   ? prefix_key(c->body, c->px->o->prefix_len)
			   : 0;
	const char *model = pdx_call_model(c);

	/* no usable prefill instance (of the model, where one named it: its
	 * instances down), and no falling back to D alone: 503 before D is
	 * picked, which counts a request there (that never went) and may
	 * take its breaker's one trial (that never ends) */
	if (p->n && !c->px->o->prefill_fallback &&
	    pdx_pool_has_usable(d, c->avoid[PDX_POOL_DECODE], NULL, true) &&
	    !pdx_pool_has_usable(p, c->avoid[PDX_POOL_PREFILL], model, true)) {
		pdx_call_reply_no_instance(c, PDX_POOL_PREFILL);
		return -1;
	}
	c->decode = pdx_pool_pick(d, key, c->avoid[PDX_POOL_DECODE], model,
				  true);
	if (!c->decode) {
		pdx_call_reply_no_instance(c, PDX_POOL_DECODE);
		return -1;
	}
	if (p->n) {
		/* D serves the model: a prefill instance of another one
		 * would only answer 404 (none: as if none were usable) */
		c->prefill = pdx_pool_pick(
		    p, key, c->avoid[PDX_POOL_PREFILL], model,
		    !pdx_served_models_take_known(&c->decode->models, model));
		if (!c->prefill && !c->px->o->prefill_fallback) {
			pdx_call_reply_no_instance(c, PDX_POOL_PREFILL);
			return -1;
		}
		if (!c->prefill)
			log_info("%s: no usable prefill instance; decode "
				 "prefills itself",
				 c->req_id);
	}
	for (int r = 0; r < 2; r++) {
		c->pair[r] = r == PDX_POOL_DECODE ? c->decode : c->prefill;
		if (c->pair[r])
			pdx_pool_ref(c->pair[r]);
	}
	if (!c->xfer_id[0] && xfer_id_mint(c)) { /* a retry has its own */
		pdx_call_reply_error(c, 500, "internal_error",
				     "no random bytes for an xfer_id");
		return -1;
	}
	return 0;
}

/* A tensor-parallel instance's info: every rank's agent (peer_addrs,
 * rank order, the first peer_addr) and tp_size. Anything else leaves i
 * at TP 1, with the reason logged. */
static void info_ranks(struct pdx_inst *i, const json_t *j)
{
	const json_t *a = json_object_get(j, "peer_addrs");
	json_int_t tp = json_integer_value(json_object_get(j, "tp_size"));
	size_t r, n = json_array_size(a);

	if (!a && tp <= 1)
		return; /* TP 1 */
	if (n < 2 || n > PDX_POOL_TP_MAX || tp != (json_int_t)n)
		goto bad;
	for (r = 0; r < n; r++) {
		const char *s = json_string_value(json_array_get(a, r));

		if (!s || !*s || strlen(s) >= sizeof(i->peers[r]) ||
		    (!r && strcmp(s, i->peer)))
			goto bad;
		strcpy(i->peers[r], s);
	}
	i->tp = (unsigned)n;
	return;
bad:
	log_warn("%s instance %s: /v1/pdx/info: want peer_addrs of tp_size "
		 "agents (2 to %d, the first peer_addr); taken as TP 1",
		 pdx_pool_role_name(i->role), i->url, PDX_POOL_TP_MAX);
}

bool pdx_flow_sglang_pool(const struct pdx_call *c, enum pdx_pool_role r)
{
	return (r == PDX_POOL_PREFILL ? c->px->o->kind_p : c->px->o->kind_d) ==
	       PDX_KIND_SGLANG;
}

static void learn_next(struct pdx_call *c);

/* GET /v1/pdx/info answered: the instance's agent peer address, if it
 * has one, and a tensor-parallel instance's every rank's. An engine
 * without the route (404, e.g. vLLM) has none. One that did not answer
 * (down, hung) fails the request, or has it retried elsewhere, as its
 * real leg would have after as long again (a hung engine cost two
 * --first-byte-timeout). */
static void info_end(struct pdx_upstream *u, int status, struct evbuffer *body,
		     int err_status, const char *why, void *arg)
{
	struct pdx_call *c = arg;
	struct pdx_inst *i = c->inst;

	if (!status) {
		pdx_call_leg_done(c);
		if (c->retry && c->retry(c, u, 0, why))
			return;
		if (i->role == PDX_POOL_PREFILL) { /* --on-prefill-failure */
			pdx_pool_put(c->prefill); /* nothing goes there */
			c->prefill = NULL;
			pdx_flow_prefill_failed(c, 0, NULL, err_status, why);
		} else
			pdx_call_reply_leg_error(c, err_status, why);
		return;
	}
	if (status == 200) {
		json_t *j = json_loadb((const char *)evbuffer_pullup(body, -1),
				       evbuffer_get_length(body), 0, NULL);
		const char *peer =
		    json_string_value(json_object_get(j, "peer_addr"));

		const char *role =
		    json_string_value(json_object_get(j, "role"));

		snprintf(i->peer, sizeof(i->peer), "%s", peer ? peer : "");
		snprintf(i->engine_role, sizeof(i->engine_role), "%s",
			 role ? role : "");
		i->no_agent = json_is_null(json_object_get(j, "agent"));
		i->tp = 1;
		if (peer)
			info_ranks(i, j);
		json_decref(j);
	}
	i->peer_known = true;
	log_debug("%s: %s instance %s: agent %s, TP %u", c->req_id,
		  pdx_pool_role_name(i->role), i->url,
		  i->peer[0] ? i->peer : "none", i->tp ? i->tp : 1);
	pdx_call_leg_done(c);
	learn_next(c);
}

/* P's and D's agents advertise one address (each host's agent left at
 * a loopback --listen, the one-machine example moved to two hosts): D's
 * engine would take P's for its own and answer every request 400, "this
 * engine's own agent", blaming the client, with both instances healthy.
 * Refused here with what to fix, logged at warn (once per P/D pair in a
 * row). */
/* A refusal that comes back with each request is logged once in a row:
 * msg (and more) at warn unless the last one said was about key (the
 * instance's or the pair's URLs). */
static void warn_once_in_a_row(const char *key, const char *msg,
			       const char *more)
{
	static char last[2 * PDX_POOL_ADDR_MAX + 32];

	if (!strcmp(key, last))
		return;
	log_warn("%s%s", msg, more);
	snprintf(last, sizeof(last), "%s", key);
}

static bool one_agent(struct pdx_call *c)
{
	const struct pdx_inst *p = c->prefill, *d = c->decode;
	char msg[3 * PDX_ADDR_MAX + 2 * PDX_POOL_ADDR_MAX];
	char pair[2 * PDX_POOL_ADDR_MAX + 32];

	if (!p || !d || !p->peer[0] || strcmp(p->peer, d->peer) != 0)
		return false;
	snprintf(msg, sizeof(msg), "prefill instance %s and decode instance "
		 "%s advertise one agent address, %s: give each agent an "
		 "--advertise address (or --listen) the other hosts reach "
		 "(docs/deployment.md, \"Across hosts\")", p->url, d->url,
		 p->peer);
	snprintf(pair, sizeof(pair), "%s %s", p->url, d->url);
	warn_once_in_a_row(pair, msg, "");
	pdx_call_reply_error(c, 502, "upstream_error", msg);
	return true;
}

/* An instance in the wrong pool, by its own /v1/pdx/info: a decode
 * engine listed with --prefill (or the other way: the two swapped), or
 * one without an agent in a P/D pair. Its engine refused each request
 * with a 400 that blamed the client ("do_remote_decode: this is a
 * decode engine", "kv_transfer_params: this engine has no --agent")
 * while /ready said 200. Refused here with what to fix, logged at warn
 * (once per instance in a row); under --on-prefill-failure local only
 * said, as the decode instance prefills what P refuses (colocated
 * engines behind a sequential proxy run so). Else the instance leaves
 * the picks (misplaced, until its engine is seen started again or a
 * check fails) and the request starts over on another one where
 * --retries allows (before: it stayed in, healthy, and every other
 * request got the 502 for good). */
static bool wrong_pool(struct pdx_call *c)
{
	struct pdx_inst *pair[2] = {c->prefill, c->decode};
	char msg[2 * PDX_POOL_ADDR_MAX + 160];

	if (!c->prefill || !c->decode)
		return false;
	for (int k = 0; k < 2; k++) {
		struct pdx_inst *i = pair[k];
		const char *other = k ? "prefill" : "decode";

		if (!strcmp(i->engine_role, other))
			snprintf(msg, sizeof(msg),
				 "%s instance %s is a %s engine (its "
				 "/v1/pdx/info says role %s): are --prefill "
				 "and --decode swapped?",
				 pdx_pool_role_name(i->role), i->url, other,
				 other);
		else if (i->no_agent)
			snprintf(msg, sizeof(msg),
				 "%s instance %s has no agent (its "
				 "/v1/pdx/info says agent null): a colocated "
				 "engine takes no part in a KV transfer; start "
				 "it with --agent, or list it in no P/D pool",
				 pdx_pool_role_name(i->role), i->url);
		else
			continue;
		warn_once_in_a_row(i->url, msg,
				   c->px->o->prefill_fallback
				       ? " (--on-prefill-failure local: the "
					 "decode instance prefills what P "
					 "refuses)"
				       : "");
		if (c->px->o->prefill_fallback)
			return false;
		i->peer_known = false; /* asked again: it may be mended */
		i->misplaced = true;
		if (!pdx_flow_retry_inst(c, i, 502, msg))
			pdx_call_reply_error(c, 502, "upstream_error", msg);
		return true;
	}
	return false;
}

/* Asks D, then P, what it does not know yet; then c->next. */
static void learn_next(struct pdx_call *c)
{
	static const struct pdx_upstream_cbs info = {.on_end = info_end};
	struct pdx_upstream_cbs cbs = info;

	while (c->learned < 2) {
		struct pdx_inst *inst = c->learned++ ? c->prefill : c->decode;

		if (!inst || inst->peer_known ||
		    pdx_flow_sglang_pool(c, inst->role))
			continue;
		cbs.arg = c;
		pdx_pool_hold(inst);
		pdx_call_leg(c, inst, inst->role, "/v1/pdx/info", NULL, 0,
			     &cbs);
		return;
	}
	if (!wrong_pool(c) && !one_agent(c))
		c->next(c);
}

void pdx_flow_learn_peers(struct pdx_call *c, void (*next)(struct pdx_call *c))
{
	c->next = next;
	c->learned = 0;
	learn_next(c);
}

static int set_str(json_t *o, const char *key, const char *v)
{
	return json_object_set_new(o, key, json_string(v));
}

int pdx_flow_set_agents(json_t *kv, const struct pdx_inst *i)
{
	json_t *a;

	json_object_del(kv, "remote_agents");
	json_object_del(kv, "remote_tp_size");
	if (set_str(kv, "remote_agent", i->peer))
		return -1;
	if (i->tp <= 1)
		return 0;
	a = json_array();
	for (unsigned r = 0; a && r < i->tp; r++)
		if (json_array_append_new(a, json_string(i->peers[r]))) {
			json_decref(a);
			a = NULL;
		}
	return json_object_set_new(kv, "remote_agents", a) ||
	       json_object_set_new(kv, "remote_tp_size", json_integer(i->tp));
}

char *pdx_flow_prefill_body(struct pdx_call *c, const char *metaserver)
{
	/* shallow: the prompt (maybe thousands of ids) is shared, not
	 * copied; only top-level keys and the kv object are new */
	json_t *p = json_copy(c->body), *kv;
	const char *d_peer = c->decode->peer;
	char *s = NULL;

	if (!p)
		return NULL;
	kv = client_kv(c);
	if (!kv || json_object_set_new(p, "kv_transfer_params", kv))
		goto out;
	if (set_str(kv, "xfer_id", c->xfer_id) ||
	    (*d_peer && pdx_flow_set_agents(kv, c->decode)) ||
	    (metaserver && set_str(kv, "metaserver", metaserver)) ||
	    json_object_set_new(kv, "do_remote_decode", json_true()) ||
	    json_object_set_new(p, "max_tokens", json_integer(1)) ||
	    json_object_set_new(p, "stream", json_false()))
		goto out;
	if (json_object_get(p, "max_completion_tokens"))
		json_object_set_new(p, "max_completion_tokens",
				    json_integer(1));
	json_object_del(p, "stream_options");
	json_object_del(p, "min_tokens"); /* would contradict max_tokens 1 */
	s = json_dumps(p, JSON_COMPACT);
out:
	json_decref(p);
	return s;
}

int pdx_flow_check_client_kv(const json_t *body, struct pdx_oai_fault *f)
{
	const json_t *kv = json_object_get(body, "kv_transfer_params");
	const json_t *v = json_object_get(kv, "on_failure");
	const char *s = json_string_value(v);

	if (!v || json_is_null(v) ||
	    (s && (!strcmp(s, "fail") || !strcmp(s, "recompute"))))
		return 0;
	snprintf(f->param, sizeof(f->param), "kv_transfer_params.on_failure");
	snprintf(f->message, sizeof(f->message),
		 "kv_transfer_params.on_failure: want \"fail\" or "
		 "\"recompute\"");
	return -1;
}

int pdx_flow_failure_policy(struct pdx_call *c, json_t *kv)
{
	json_t *own = json_object_get(client_kv_own(c), "on_failure");
	json_t *v = json_object_get(kv, "on_failure");

	/* null is no choice (the engine reads it so): the proxy's policy,
	 * in every flow alike */
	if (v && !json_is_null(v))
		return 0; /* the client chose (kv is its own, copied) */
	if (own && !json_is_null(own)) /* kv is P's: the client chose */
		return json_object_set(kv, "on_failure", own);
	return set_str(kv, "on_failure",
		       c->px->o->transfer_recompute ? "recompute" : "fail");
}

json_t *pdx_flow_decode_kv(struct pdx_call *c)
{
	json_t *kv = client_kv(c);

	if (kv && !json_object_set_new(kv, "do_remote_prefill", json_true()) &&
	    !json_object_set_new(kv, "xfer_id", json_string(c->xfer_id)) &&
	    !pdx_flow_set_agents(kv, c->prefill) &&
	    !pdx_flow_failure_policy(c, kv))
		return kv;
	json_decref(kv);
	return NULL;
}

void pdx_flow_count_transfer(struct pdx_call *c, struct pdx_inst *p)
{
	pdx_transfers_start(&c->px->xfers, c->xfer_id, p,
			    c->decode->peer[0] ? c->decode : NULL);
}

/* D is used once: its reference moves to the relayed leg. */
static struct pdx_inst *decode_take(struct pdx_call *c)
{
	struct pdx_inst *d = c->decode;

	c->decode = NULL;
	return d;
}

void pdx_flow_relay_decode(struct pdx_call *c, const void *body, size_t len)
{
	pdx_call_relay(c, decode_take(c), PDX_POOL_DECODE, EVHTTP_REQ_POST,
		       c->path, body, len);
}

/* D's body: the client's with kv for its kv_transfer_params. */
static void relay_decode_with(struct pdx_call *c, json_t *kv)
{
	json_t *d = json_copy(c->body); /* shallow: kv replaces a top key */
	char *s = d && !json_object_set(d, "kv_transfer_params", kv)
		      ? json_dumps(d, JSON_COMPACT)
		      : NULL;

	json_decref(d);
	if (!s) {
		pdx_call_reply_error(c, 500, "internal_error", "out of memory");
		return;
	}
	pdx_flow_relay_decode(c, s, strlen(s));
	free(s);
}

void pdx_flow_send_decode(struct pdx_call *c, json_t *kv)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(c->req);

	if (json_is_object(kv)) {
		relay_decode_with(c, kv);
		return;
	}
	/* D prefills: no transfer */
	pdx_transfers_forget(&c->px->xfers, c->xfer_id);
	/* nor a pair: D's answer vouches for no prefill instance (one that
	 * failed every prefill kept its breaker shut) */
	pdx_call_unpair(c, PDX_POOL_PREFILL);
	if (client_kv_oversteps(c)) {
		/* a transfer of the client's making fails against D alone
		 * (no partner to blame): its breaker, everyone's */
		kv = client_kv(c);
		if (kv)
			relay_decode_with(c, kv);
		else
			pdx_call_reply_error(c, 500, "internal_error",
					     "out of memory");
		json_decref(kv);
		return;
	}
	pdx_flow_relay_decode(c, evbuffer_pullup(in, -1),
			      evbuffer_get_length(in));
}

bool pdx_flow_retry(struct pdx_call *c, struct pdx_upstream *u, int status,
		    const char *why)
{
	/* no descriptor here: another instance's leg would fail alike (each
	 * such request was retried, counted and logged) */
	if (pdx_upstream_out_of_fds(u))
		return false;
	return pdx_flow_retry_inst(c, pdx_call_blamed(c, u), status, why);
}

bool pdx_flow_retry_inst(struct pdx_call *c, struct pdx_inst *failed,
			 int status, const char *why)
{
	enum pdx_pool_role r = failed->role;
	char old[sizeof(c->xfer_id)], said[PDX_POOL_ADDR_MAX + 48];

	if (!pdx_call_may_retry(c, failed, status))
		return false;
	/* the old transfer is over everywhere: its legs are cancelled (each
	 * engine sees its client leave, aborts, and frees the KV it wrote or
	 * waited for) and it counts in no load; a fresh xfer_id keeps any
	 * late write or notification of it apart from the new one */
	pdx_transfers_forget(&c->px->xfers, c->xfer_id);
	pdx_call_reset(c);
	snprintf(old, sizeof(old), "%s", c->xfer_id);
	if (xfer_id_mint(c)) {
		pdx_call_reply_error(c, 500, "internal_error",
				     "no random bytes for an xfer_id");
		return true;
	}
	if (c->avoid[r])
		pdx_pool_unref(c->avoid[r]);
	pdx_pool_ref(failed);
	c->avoid[r] = failed;
	c->retries++;
	c->px->metrics.retries[r]++;
	/* failed may be the partner of the leg that answered (its 502 said
	 * the other side failed): "failed", not "answered" */
	snprintf(said, sizeof(said), "%s instance %s failed (%d)",
		 pdx_pool_role_name(r), failed->url, status);
	log_warn("%s: %s; retry %u of %u on other instances, transfer %s "
		 "(was %s)",
		 c->req_id, status ? said : why, c->retries,
		 c->px->o->retries, c->xfer_id, old[0] ? old : "none");
	c->flow(c);
	return true;
}

void pdx_flow_prefill_failed(struct pdx_call *c, int status,
			     struct evbuffer *body, int err_status,
			     const char *why)
{
	pdx_transfers_forget(&c->px->xfers, c->xfer_id);
	if (c->px->o->prefill_fallback) {
		log_info("%s: prefill failed (%d%s%s); decode prefills itself",
			 c->req_id, status ? status : err_status,
			 why ? ": " : "", why ? why : "");
		pdx_flow_send_decode(c, NULL);
	} else if (!status) {
		pdx_call_reply_leg_error(c, err_status, why);
	} else { /* the engine's own error, e.g. a bad prompt */
		pdx_call_say_failed(c, status, "the prefill instance's answer",
				    "");
		pdx_call_reply(c, status, body);
	}
}
