/* A client request in flight ("call"): its request id, its lifetime, the
 * client watch that notices a client leaving, the one engine leg running
 * for it, and the relay of the final leg's response to
 * the client byte for byte as it arrives.
 *
 * One thread. A call ends exactly once: by pdx_call_reply_error(), by
 * the end of a relayed leg, or by the client leaving (then its leg is
 * cancelled, so the engine sees its client go). After that the call is
 * freed.
 */
#ifndef PDX_PROXY_CALL_H
#define PDX_PROXY_CALL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "proxy/proxy.h"
#include "proxy/upstream.h"

#define PDX_REQ_ID_MAX 64

struct pdx_call {
	LIST_ENTRY(pdx_call) link;
	struct pdx_proxy *px;
	struct evhttp_request *req;
	struct evhttp_connection *conn;
	struct event *watch;
	char req_id[PDX_REQ_ID_MAX + 1];
	char path[64];
	uint64_t t0_ns;
	json_t *body;		  /* the client's JSON body, or NULL */
	struct pdx_upstream *leg; /* the leg running now */
	struct pdx_inst *inst;	  /* its instance (a pool reference) */
	struct pdx_inst *decode;  /* D, chosen before P (a reference) */
	bool replying;		  /* the reply head went out */
	int status;
};

/* Takes a client request on: a request id (the client's X-Request-Id if
 * usable, else a fresh one), the watch, and an in-flight slot. NULL when
 * the proxy is full or out of memory: the client got its error already. */
struct pdx_call *pdx_call_new(struct pdx_proxy *px, struct evhttp_request *req);

/* Ends the call with this status and body (JSON), e.g. an engine's
 * error passed on. */
void pdx_call_reply(struct pdx_call *c, int status, struct evbuffer *body);

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
 * c->inst are set. Ends the call with 503 or 500 and returns -1 when it
 * cannot start. body NULL: a GET. */
int pdx_call_leg(struct pdx_call *c, struct pdx_inst *inst,
		 enum pdx_pool_role role, const char *path, const void *body,
		 size_t len, const struct pdx_upstream_cbs *cbs);

/* The leg set by pdx_call_leg() ended: drop it and its instance. */
void pdx_call_leg_done(struct pdx_call *c);

/* Aborts a call (proxy shutting down): cancels its leg, closes the
 * client's connection. */
void pdx_call_abort(struct pdx_call *c);

#endif
