/* An endpoint's structure (transport/ucx_ep.c), for the operations on it
 * (ucx_io.c). Nothing outside transport/ reads it: ucx.h is the
 * interface. */
#ifndef PDX_TRANSPORT_UCX_EP_H
#define PDX_TRANSPORT_UCX_EP_H

#include <stdbool.h>
#include <ucp/api/ucp.h>

#include "transport/ucx.h"

/* One user's endpoint: on a kept UCX endpoint (slot set) or a shared one
 * (sh set). */
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

#endif
