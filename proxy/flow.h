/* The flows: how one client completion request is spread over a prefill
 * (P) and a decode (D) instance. Each starts from a call whose c->body
 * holds the client's JSON object and c->path the route, and ends the call
 * in every case.
 *
 * sequential (vLLM-compatible; flow_sequential.c): P gets the request
 *   with max_tokens=1, stream=false and kv_transfer_params.do_remote_decode
 *   = true; P's returned kv_transfer_params go unchanged into D's request
 *   (opaque to the proxy, so real vLLM engines with vLLM's own connectors
 *   work behind it); D's response is relayed. P returning none sends D the
 *   client's request as it came, and D prefills itself.
 * concurrent (default; flow_concurrent.c): P and D get the request at
 *   once, each with kv_transfer_params naming the other's agent and the
 *   same xfer_id; P's agent pushes layer by layer while P computes, and
 *   D's stream is relayed. Needs both engines' agents (GET /v1/pdx/info);
 *   with either missing the request runs sequentially.
 * early-callback (flow_early.c; vllm-ascend's layer-wise shape): P gets
 *   the request with a kv_transfer_params.metaserver URL and posts its
 *   decode-side kv_transfer_params there when its prefill starts; D is
 *   dispatched with them at that moment. No post by P's answer: P's
 *   answer is used, as in the sequential flow.
 * sglang (flow_sglang.c; a pool of SGLang instances with a transfer
 *   backend, pdx's or another: --prefill-kind, --decode-kind): P and D
 *   get the client's request at once, an SGLang one with SGLang's
 *   bootstrap_host (P's host), bootstrap_port (P's bootstrap server, from
 *   its GET /get_server_info) and bootstrap_room (63 random bits), as
 *   SGLang's router sends it; D's answer is relayed, P's looked at only
 *   when it fails (as in the concurrent flow). Between two SGLang pools
 *   no kv_transfer_params, no agents asked: SGLang's backends pair by the
 *   room. A pdx pool on one side (pdx-engine beside pdx.sglang) gets
 *   kv_transfer_params for the transfer pdx.sglang makes of the room: a
 *   pdx D with P's agent from P's bootstrap server, a pdx P an open send
 *   while the proxy serves the bootstrap routes for it (sglang_boot.h).
 *
 * Retries (--retries): a leg that fails before the client got any byte
 * (no connection, a timeout, a 5xx; P's leg or D's) starts the whole
 * request over as a unit (pdx_flow_retry): every leg is cancelled, the
 * transfer is dropped, and D and P are picked again, the failed instance
 * avoided, under a fresh xfer_id. As a unit because the legs share one
 * transfer: in the concurrent flow D was dispatched with P's transfer
 * before P failed and waits for KV that will not come (or that a dead
 * process half wrote), and a failed D had P's KV pushed toward it, so
 * neither leg can be redone alone without reusing stale parameters.
 *
 * In every flow D is picked first and P's kv_transfer_params name D's
 * agent (remote_agent), so P's agent knows where to push; each transfer
 * is named by an xfer_id (32 hex digits, 128 random bits) the proxy
 * mints. What names a transfer and its sides in the client's own
 * kv_transfer_params (xfer_id, the agents, first_token, the flags, ...)
 * never reaches an engine: the proxy alone says it. An empty prefill pool
 * sends every request straight to D, and so does a failed prefill under
 * --on-prefill-failure local.
 *
 * One thread.
 */
#ifndef PDX_PROXY_FLOW_H
#define PDX_PROXY_FLOW_H

#include <event2/http.h>
#include <jansson.h>
#include <stdbool.h>
#include "common/oai_params.h"
#include "proxy/pool.h"

struct pdx_call;
struct pdx_inst;
struct pdx_proxy;
struct pdx_upstream;

/* Runs the proxy's configured flow. */
void pdx_flow_start(struct pdx_call *c);

void pdx_flow_sequential(struct pdx_call *c);
void pdx_flow_concurrent(struct pdx_call *c);
void pdx_flow_early_callback(struct pdx_call *c);
void pdx_flow_sglang(struct pdx_call *c);

/* The sequential flow from its prefill leg on (D picked, its agent
 * known): where the other flows fall back to it. */
void pdx_flow_sequential_prefill(struct pdx_call *c);

/* POST /v1/metaserver: a prefill engine's early callback. */
void pdx_flow_metaserver(struct pdx_proxy *px, struct evhttp_request *req);

/* What the flows share (flow_common.c). */

/* Picks D, and P when the prefill pool has instances (else c->prefill
 * stays NULL); sets c->xfer_id. -1: the call got its 503. */
int pdx_flow_pick(struct pdx_call *c);

/* Whether the role's pool holds SGLang instances (--prefill-kind,
 * --decode-kind). */
bool pdx_flow_sglang_pool(const struct pdx_call *c, enum pdx_pool_role r);

/* Runs c->next = next once D's and P's agents are known (each asked with
 * GET /v1/pdx/info the first time; "" when the engine has none; an
 * SGLang pool's instances are not asked): every
 * flow needs D's, the concurrent one P's, and every one P's TP size, so
 * that a TP prefill instance's transfer counts until all its ranks
 * reported it (transfers.h). */
void pdx_flow_learn_peers(struct pdx_call *c, void (*next)(struct pdx_call *c));

/* Names instance i's agent in kv: remote_agent, and for a tensor-parallel
 * instance every rank's (remote_agents, rank order) and remote_tp_size,
 * so each rank of the other side pairs with its own; any ranks kv named
 * before are dropped. -1: out of memory. */
int pdx_flow_set_agents(json_t *kv, const struct pdx_inst *i);

/* P's request body: the client's with max_tokens 1, no streaming, and
 * do_remote_decode, the xfer_id, D's agents (pdx_flow_set_agents; when D
 * has one) and metaserver (when not NULL) merged into what the client's
 * kv_transfer_params may say. NULL: out of memory. */
char *pdx_flow_prefill_body(struct pdx_call *c, const char *metaserver);

/* D's kv_transfer_params for a transfer from c->prefill: what the
 * client's may say, with do_remote_prefill, the xfer_id, P's agents
 * (pdx_flow_set_agents) and the failure policy merged in. NULL: out of
 * memory. */
json_t *pdx_flow_decode_kv(struct pdx_call *c);

/* P's leg to p is going out: its transfer counts in p's and D's load
 * until their agents report it (transfers.h). */
void pdx_flow_count_transfer(struct pdx_call *c, struct pdx_inst *p);

/* Relays D's request to c->decode: the client's body with kv as its
 * kv_transfer_params (copied unchanged), or, when kv is not an object,
 * byte for byte (but with the keys only the proxy says taken out of the
 * client's kv_transfer_params, when it has any). */
void pdx_flow_send_decode(struct pdx_call *c, json_t *kv);

/* Relays body to c->decode as D's request. */
void pdx_flow_relay_decode(struct pdx_call *c, const void *body, size_t len);

/* The concurrent flows' prefill side leg ended (pdx_upstream_cbs.on_end,
 * arg the call): nothing when P answered 200 or D already replies; else
 * a retry, or D cancelled and pdx_flow_prefill_failed(). */
void pdx_flow_side_prefill_end(struct pdx_upstream *u, int status,
			       struct evbuffer *body, int err_status,
			       const char *why, void *arg);

/* The one field of the client's kv_transfer_params the legs carry as
 * it is, on_failure, checked before any leg begins: 0, or -1 and *f
 * filled (a 400). A bad one reached D only, which refused it after P's
 * leg had begun, and P held that prompt's KV for its lease. */
int pdx_flow_check_client_kv(const json_t *body, struct pdx_oai_fault *f);

/* D's kv_transfer_params get the proxy's --on-transfer-failure as
 * on_failure, unless the client's request chose one. -1: out of memory. */
int pdx_flow_failure_policy(struct pdx_call *c, json_t *kv);

/* Leg u of c ended with status (0: no answer; why says what) before
 * the client got a byte: starts the call over (see above) and returns
 * true when pdx_call_may_retry() allows it, else returns false and the
 * caller ends the call as without retries. */
bool pdx_flow_retry(struct pdx_call *c, struct pdx_upstream *u, int status,
		    const char *why);
/* The same, the failure counted against instance failed. */
bool pdx_flow_retry_inst(struct pdx_call *c, struct pdx_inst *failed,
			 int status, const char *why);

/* A prefill leg failed (status 0: no answer) before D said anything:
 * D prefills itself under --on-prefill-failure local, else the client
 * gets P's error. */
void pdx_flow_prefill_failed(struct pdx_call *c, int status,
			     struct evbuffer *body, int err_status,
			     const char *why);

#endif
