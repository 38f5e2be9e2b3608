/* The peers we know: one DEALER each for what we send them (our ROUTER
 * takes what they send), found by address, and what their handshake
 * left here, dropped by peer_reset(). See docs/protocol.md section 2;
 * handshake.c fills a peer in, peer_dispatch.c reads its messages. */
#define PDX_LOG_TOPIC "peer"
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <zmq.h>

#include "agent/agent.h"
#include "common/log.h"

void peer_reset(struct agent *a, struct peer *p)
{
	for (uint32_t i = 0; i < p->n_regions; i++) {
		pdx_ucx_rkey_free(p->regions[i].rkey);
		if (p->regions[i].map)
			munmap(p->regions[i].map, p->regions[i].size);
		if (p->regions[i].dptr)
			gpu_mem_close(p->agent->gpu, p->regions[i].dptr);
	}
	free(p->regions);
	p->regions = NULL;
	p->n_regions = 0;
	staged_peer_gone(a, p);
	staged_peer_unmap(a, p);
	p->staged_shared = false;
	pdx_ucx_ep_close(p->ep);
	p->ep = NULL;
	p->ep_failed = false;
	free(p->layout.layer);
	p->layout.layer = NULL;
	p->state = PEER_NEW;
	p->instance = 0;
}

struct peer *peer_lookup(struct agent *a, const char *addr, bool create)
{
	struct peer *p = NULL;
	int linger = 0, hwm = 10000;

	HASH_FIND_STR(a->peers, addr, p);
	if (p || !create)
		return p;
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	snprintf(p->addr, sizeof(p->addr), "%s", addr);
	p->agent = a;
	p->dealer = zmq_socket(a->zctx, ZMQ_DEALER);
	if (!p->dealer)
		goto free_p;
	zmq_setsockopt(p->dealer, ZMQ_LINGER, &linger, sizeof(linger));
	zmq_setsockopt(p->dealer, ZMQ_SNDHWM, &hwm, sizeof(hwm));
	if (a->curve && pdx_curve_client(a->curve, p->dealer, addr)) {
		zmq_close(p->dealer);
		goto free_p;
	}
	if (zmq_connect(p->dealer, addr) < 0) {
		log_warn("cannot connect to peer %s: %s", addr,
			 zmq_strerror(zmq_errno()));
		zmq_close(p->dealer);
		goto free_p;
	}
	HASH_ADD_STR(a->peers, addr, p);
	return p;

free_p:
	free(p);
	return NULL;
}

void peer_send_to_addr(struct agent *a, const char *addr, const char *op,
		       const struct pdx_xfer_id *xfer, const char *reason)
{
	struct peer *p = peer_lookup(a, addr, true);

	if (p)
		peer_send(a, p, op, xfer, reason);
}

void peers_free(struct agent *a)
{
	struct peer *p, *tmp;

	HASH_ITER(hh, a->peers, p, tmp) {
		peer_reset(a, p);
		zmq_close(p->dealer);
		HASH_DEL(a->peers, p);
		free(p);
	}
}
