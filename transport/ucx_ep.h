/* An endpoint's structure (transport/ucx_ep.c), for the operations on it
 * (ucx_io.c). Nothing outside transport/ reads it: ucx.h is the
 * interface. */
#ifndef PDX_TRANSPORT_UCX_EP_H
#define PDX_TRANSPORT_UCX_EP_H

#include <stdbool.h>
#include <ucp/api/ucp.h>

#include "transport/ucx.h"

/* One user's endpoint: on the UCX endpoint to its peer's worker that
 * every user to that worker shares (struct worker_ep). */
struct pdx_ucx_ep {
	struct pdx_ucx *u;
	ucp_ep_h ep; /* w's, as it was when this one was made */
	struct worker_ep *w;
	pdx_ucx_ep_error_cb err_cb;
	void *arg;
	struct pdx_ucx_ep *next_user; /* on w->users */
	bool told; /* w's failure was passed on */
};

#endif
