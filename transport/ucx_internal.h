/* What transport/ucx.c (context, worker, memory, operations) and
 * transport/ucx_ep.c (endpoints) share. Nothing outside transport/ reads
 * it: ucx.h is the interface. */
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
	int closing; /* endpoint closes in flight */
	struct ep_slot *slots; /* every endpoint's, freed with the worker */
	struct kept_ep *kept; /* endpoints without peer error handling */
	struct shared_ep *shared; /* those with, by worker address */
	struct worker_sn *sns; /* endpoints UCX numbered, per peer worker */
	bool reap; /* a shared endpoint no one uses failed: to close */
	bool abandoned; /* pdx_ucx_stop() left the worker to the exit */
	struct pdx_ucx *next_abandoned;
};

/* One user's endpoint: on a kept UCX endpoint (slot set) or a shared one
 * (sh set), ucx_ep.c. */
struct pdx_ucx_ep {
	struct pdx_ucx *u;
	ucp_ep_h ep;
	pdx_ucx_ep_error_cb err_cb;
	void *arg;
	struct ep_slot *slot; /* NULL for a shared one */
	struct shared_ep *sh; /* ep is a shared one: closed with sh */
	struct pdx_ucx_ep *next_user; /* on sh->users */
	bool told; /* its shared endpoint's failure was passed on */
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

/* ucx_ep.c, for the worker's progress: the shared endpoints no one uses
 * that failed or were cut since, closed (not from inside UCX's error
 * callback, which only marks u->reap). */
void ucx_eps_reap(struct pdx_ucx *u);

/* ucx_ep.c, once the worker is destroyed (its endpoints with it): the
 * records kept for UCX's callbacks, freed. */
void ucx_eps_forget(struct pdx_ucx *u);

#endif
