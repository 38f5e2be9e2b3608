/* The worker's insides (transport/ucx.c), for the two files above it:
 * the endpoints (ucx_ep.c) and the operations on them (ucx_io.c).
 * Nothing outside transport/ reads it: ucx.h is the interface. */
#ifndef PDX_TRANSPORT_UCX_INTERNAL_H
#define PDX_TRANSPORT_UCX_INTERNAL_H

#include <stdbool.h>
#include <ucp/api/ucp.h>

#include "transport/ucx.h"

struct am_handler {
	pdx_ucx_am_cb cb;
	void *arg;
	struct pdx_ucx *u;
};

#define AM_IDS 8

struct pdx_ucx {
	ucp_context_h ctx;
	ucp_worker_h worker;
	ucp_address_t *addr;
	size_t addr_len;
	int efd;
	struct op *deferred; /* completed inline: fired by the next progress */
	struct op *pending;  /* requests UCX has not called back for yet */
	struct am_handler am[AM_IDS];
	int closing; /* endpoint closes in flight: the stop waits for them */
	/* The endpoints' records (ucx_ep.c), which UCX's callbacks may name
	 * as long as the worker lives: eps_free frees them once it is
	 * destroyed. The worker knows nothing else of its endpoints. */
	void *eps;
	void (*eps_free)(void *eps);
	bool abandoned; /* pdx_ucx_stop() left the worker to the exit */
	struct pdx_ucx *next_abandoned;
};

/* One user callback waiting on a UCX request. */
struct op {
	pdx_ucx_done_cb cb;
	void *arg;
	struct pdx_ucx *u;
	struct op *next; /* on the deferred list only */
	/* a request UCX holds: on the pending list until it calls back */
	struct op *pending_next, *pending_prev;
	/* UCX 1.13 reads an active message's header until the send completes
	 * (there is no copy-header flag yet), so it lives here. */
	uint8_t hdr[PDX_UCX_AM_HDR_MAX];
	void *payload; /* an eager send's copy, freed with the op */
};

struct pdx_ucx_mem {
	ucp_mem_h memh;
};

/* The one place UCX statuses become pdx statuses. */
static inline pdx_status_t from_ucs(ucs_status_t s)
{
	switch (s) {
	case UCS_OK:
		return PDX_OK;
	case UCS_ERR_NO_MEMORY:
		return PDX_ENOMEM;
	case UCS_ERR_CANCELED:
		return PDX_ECANCELED;
	case UCS_ERR_TIMED_OUT:
	case UCS_ERR_ENDPOINT_TIMEOUT:
		return PDX_ETIMEDOUT;
	case UCS_ERR_UNREACHABLE:
	case UCS_ERR_CONNECTION_RESET:
	case UCS_ERR_REJECTED:
		return PDX_EPEER;
	case UCS_ERR_INVALID_PARAM:
		return PDX_EINVAL;
	default:
		return s < 0 ? PDX_EIO : PDX_OK;
	}
}

/* An op for cb, on the pending list from the start, so that UCX's
 * callback, whenever it comes, finds it there; NULL without memory. */
struct op *ucx_op_new(struct pdx_ucx *u, pdx_ucx_done_cb cb, void *arg);

/* An op that never started: off the pending list, and freed. */
void ucx_op_drop(struct op *o);

/* Every non-blocking call's tail, given its request: an error (the op
 * freed), an inline completion (fired by the next progress, never
 * inside the call), or a pending request (fired by UCX's callback). */
pdx_status_t ucx_op_started(struct op *o, ucs_status_ptr_t req);

/* The request parameters of a send, put, get or flush for o, with the
 * memory handle of its local buffer if there is one. */
ucp_request_param_t ucx_op_param(struct op *o, struct pdx_ucx_mem *mem);

/* cb(arg, PDX_OK) from the next progress, never inside this call: for
 * work UCX's own callbacks may not do (closing an endpoint). */
pdx_status_t ucx_call_soon(struct pdx_ucx *u, pdx_ucx_done_cb cb, void *arg);

#endif
