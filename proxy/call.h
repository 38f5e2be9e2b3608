/* A client request in flight ("call"): its request id, its lifetime, the
 * client watch that notices a client leaving, its engine legs, and the
 * relay of the final leg's response to the client byte for byte as it
 * arrives.
 *
 * A call has at most two legs at once: the main leg (c->leg: /v1/pdx/info,
 * a prefill whose answer the flow reads, or the relayed decode) and a side
 * leg (c->side: the prefill that runs beside the relayed decode in the
 * concurrent and early-callback flows).
 *
 * One thread. A call's reply ends exactly once: by pdx_call_reply_error(),
 * by the end of a relayed leg, or by the client leaving. The client
 * leaving or an error reply cancels every leg (so the engines see their
 * client go and free the KV), and so does a relayed leg whose engine
 * answers an error status (as soon as its head comes); a relay that ended
 * well lets a side leg still running finish first (cancelling it would
 * abort a transfer that served). Then the call is freed.
 */
#ifndef PDX_PROXY_CALL_H
#define PDX_PROXY_CALL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/req_id.h"
#include "proxy/proxy.h"
#include "proxy/upstream.h"

struct pdx_client_watch;

struct pdx_call {
	LIST_ENTRY(pdx_call) link;
	struct pdx_proxy *px;
	struct evhttp_request *req;
	struct evhttp_connection *conn;
	struct pdx_client_watch *watch;
	char req_id[PDX_REQ_ID_MAX + 1];
	char path[64];
	uint64_t t0_ns;
	json_t *body;		  /* the client's JSON body, or NULL */
	struct pdx_upstream *leg;  /* the main leg running now */
	struct pdx_inst *inst;	   /* its instance (a pool reference) */
	struct pdx_upstream *side; /* the side leg running now */
	struct pdx_inst *side_inst;
	struct pdx_upstream_cbs side_cbs;
	struct pdx_inst *decode;  /* D, picked first (a reference) */
	struct pdx_inst *prefill; /* P, picked up front (a reference) */
	/* the pair picked, [role], referenced until the call or its retry
	 * ends (decode and prefill move to their legs): a leg of one names
	 * the other as its partner (upstream.h) */
	struct pdx_inst *pair[2];
	void (*flow)(struct pdx_call *c); /* the flow it runs (flow_start.c) */
	void (*next)(struct pdx_call *c); /* after pdx_flow_learn_peers() */
	unsigned learned; /* of D and P, how many pdx_flow_learn_peers asked */
	char xfer_id[33];		  /* minted by the flow, or "" */
	bool awaiting_callback; /* early-callback: D waits for P's post */
	/* the relayed leg's response head, sent with its first body bytes
	 * (so a decode leg that fails before it says anything can still be
	 * replaced, or answered with an error) */
	int head_status;
	char *head[3];
	char *d_timing; /* D's Server-Timing, P's (from its answer's head) */
	char *p_timing;
	bool replying; /* the reply head went out */
	bool over;     /* replied; a side leg is finishing */
	int status;
	/* starting over (--retries): the flow's way to (flow.h,
	 * pdx_flow_retry; NULL: not retried), how often it did, and the
	 * instances that failed, one per role (references), which the next
	 * pick avoids */
	bool (*retry)(struct pdx_call *c, struct pdx_upstream *u, int status,
		      const char *why);
	unsigned retries;
	struct pdx_inst *avoid[2];
	bool discard; /* D answered a 5xx: dropped, the call starts over */
	struct pdx_call_grace *grace; /* flow_concurrent.c: D awaited */
};

/* The concurrent flow's P failure, kept while D is given a moment to say
 * why itself (flow_concurrent.c): what is done with it after. */
struct pdx_call_grace {
	struct event *ev;
	struct pdx_inst *failed; /* the instance blamed (a reference) */
	int status, err_status;
	struct evbuffer *body;
	char why[256];
};

/* Frees a grace (its timer, reference and body); NULL-safe. */
void pdx_call_grace_free(struct pdx_call_grace *g);

/* Takes a client request on: a request id (the client's X-Request-Id if
 * usable, else a fresh one), the watch, and an in-flight slot. NULL when
 * the proxy is full or out of memory: the client got its error already. */
struct pdx_call *pdx_call_new(struct pdx_proxy *px, struct evhttp_request *req);

/* Ends the call with this status and body (JSON), e.g. an engine's
 * error passed on. */
void pdx_call_reply(struct pdx_call *c, int status, struct evbuffer *body);

/* Ends the call with 503: the pool of this role has no instance, or
 * none usable (unhealthy, or its circuit breaker open). */
void pdx_call_reply_no_instance(struct pdx_call *c, enum pdx_pool_role role);

/* The instance a retry after leg u's failure avoids:
 * pdx_upstream_failed(), but for the agents' refusal to pair
 * (X-PDX-Failed-Side: both), which either may have caused: the one that
 * answered, unless no other of its role may serve and the partner's role
 * has another: then the partner (both engines answer so, in either
 * order: a lone prefill instance's 502 that came first failed the
 * request that another decode instance would serve). */
struct pdx_inst *pdx_call_blamed(const struct pdx_call *c,
				 const struct pdx_upstream *u);

/* May the call start over after a leg to failed ended with status (0:
 * no answer)? Only a failure (no answer, a timeout, a 5xx), before the
 * client got any byte, with retries left and another usable instance in
 * failed's pool. */
bool pdx_call_may_retry(const struct pdx_call *c,
			const struct pdx_inst *failed, int status);

/* Drops what the call started: cancels its legs (their engines see
 * their client leave, abort, and free the request's KV), gives back its
 * instances, forgets the head and timings of a response not relayed. The
 * call itself, its client and its body stay, for a new start. */
void pdx_call_reset(struct pdx_call *c);

/* Ends the call with a failed leg's error: err_status and why as the leg
 * said them (pdx_upstream_cbs.on_end); a 503 (this proxy had no
 * descriptor for the leg) is service_unavailable, the rest
 * upstream_error. */
void pdx_call_reply_leg_error(struct pdx_call *c, int err_status,
			      const char *why);

/* A request answered status: said at warn when 5xx, at most once a
 * second with how many more since (what, then url, say why). The
 * replies below say it themselves, but pdx_call_reply(). */
void pdx_call_say_failed(const struct pdx_call *c, int status,
			 const char *what, const char *url);

/* Ends the call with an OpenAI-style error. */
void pdx_call_reply_error(struct pdx_call *c, int status, const char *type,
			  const char *msg);

/* Relays one request to an instance (inst, a reference handed over, or
 * one picked from the pool when NULL); its response goes to the client as it
 * arrives and ends the call. Ends the call with 503 when the pool is empty. */
void pdx_call_relay(struct pdx_call *c, struct pdx_inst *inst,
		    enum pdx_pool_role role, enum evhttp_cmd_type method,
		    const char *path, const void *body, size_t len);

/* Starts a leg whose response the caller handles itself (stream_body
 * false) to inst (a reference handed over), or to one picked from the
 * pool when NULL; c->leg and
 * c->inst are set. Ends the call with 503, 413 (the body outgrew the
 * engines' limit, common/http_error.h) or 500 and returns -1 when it
 * cannot start. body NULL: a GET, a probe of the instance (upstream.h:
 * only its failure counts). */
int pdx_call_leg(struct pdx_call *c, struct pdx_inst *inst,
		 enum pdx_pool_role role, const char *path, const void *body,
		 size_t len, const struct pdx_upstream_cbs *cbs);

/* pdx_call_leg()'s GET of path on another port of inst's host (an SGLang
 * prefill instance's bootstrap server); the probe counts as inst's. */
int pdx_call_get_at(struct pdx_call *c, struct pdx_inst *inst, uint16_t port,
		    const char *path, const struct pdx_upstream_cbs *cbs);

/* The request no longer pairs an instance of role r (D prefills
 * itself): its legs name none as partner from now. */
void pdx_call_unpair(struct pdx_call *c, enum pdx_pool_role r);

/* The leg set by pdx_call_leg() ended: drop it and its instance. */
void pdx_call_leg_done(struct pdx_call *c);

/* Cancels the main leg (its engine sees its client go) and hands back its
 * instance reference; nothing fires. */
struct pdx_inst *pdx_call_leg_cancel(struct pdx_call *c);

/* Starts the side leg, a POST to inst (a reference handed over) whose
 * whole answer goes to cbs->on_end, unless the reply ended first: then
 * the call waits for it and frees itself. A relayed leg that answers an
 * error status cancels it at once. -1: the call ended (413: the body
 * outgrew the engines' limit; 500: out of memory), inst is put. */
int pdx_call_side(struct pdx_call *c, struct pdx_inst *inst, const char *path,
		  const void *body, size_t len,
		  const struct pdx_upstream_cbs *cbs);

/* Ends a call the proxy will not finish (shutting down): its client
 * gets a 503, or a stream it has begun ends with an error event saying
 * why; its legs are cancelled. */
void pdx_call_shut(struct pdx_call *c, const char *why);

/* The model the client's request names; NULL: none (or no body). */
const char *pdx_call_model(const struct pdx_call *c);

/* Aborts a call once the loop has ended: cancels its leg, closes the
 * client's connection. */
void pdx_call_abort(struct pdx_call *c);

#endif
