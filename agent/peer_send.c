/* Every message to a peer (docs/protocol.md, section 2) is built here:
 * {"op", "from", "xfer" and "reason" when given} and the fields the caller
 * adds, all counted by the builder of common/mp.h, then sent on the peer's
 * DEALER (then told to a->peer_return, which reads what comes back on it).
 * It calls nothing in agent/ but zsend.c, so any file may send to
 * a peer without calling up. */
#define PDX_LOG_TOPIC "peer"
#include <zmq.h>

#include "agent/agent.h"
#include "common/log.h"

void peer_msg_begin(struct peer_msg *pm, const struct agent *a, const char *op,
		    const struct pdx_xfer_id *xfer, const char *reason)
{
	pm->op = op;
	pdx_mp_msg_init(&pm->m);
	pdx_mp_msg_str(&pm->m, "op", op);
	pdx_mp_msg_str(&pm->m, "from", a->peer_addr);
	if (xfer)
		pdx_mp_msg_xfer(&pm->m, "xfer", xfer);
	if (reason)
		pdx_mp_msg_str(&pm->m, "reason", reason);
}

static pdx_status_t msg_send(struct peer_msg *pm, void *sock,
			     const void *route, size_t route_len,
			     const char *addr)
{
	pdx_status_t st = PDX_OK;

	if (pdx_mp_msg_end(&pm->m)) {
		log_warn("%s to %s dropped: out of memory", pm->op, addr);
		st = PDX_ENOMEM;
	} else if (agent_zsend(sock, route, route_len, pm->m.buf.data,
			       pm->m.buf.size)) {
		log_warn("%s to %s dropped: %s", pm->op, addr,
			 zmq_strerror(zmq_errno()));
		st = PDX_EPEER;
	}
	pdx_mp_msg_free(&pm->m);
	return st;
}

pdx_status_t peer_msg_send_on(struct peer_msg *pm, void *dealer,
			     const char *addr)
{
	return msg_send(pm, dealer, NULL, 0, addr);
}

pdx_status_t peer_msg_reply(struct peer_msg *pm, void *router,
			    const void *route, size_t route_len,
			    const char *addr)
{
	return msg_send(pm, router, route, route_len, addr);
}

pdx_status_t peer_msg_send(struct peer_msg *pm, struct peer *p)
{
	pdx_status_t st = msg_send(pm, p->dealer, NULL, 0, p->addr);

	if (p->agent->peer_return)
		p->agent->peer_return->sent(p);
	return st;
}

pdx_status_t peer_send(struct agent *a, struct peer *p, const char *op,
		       const struct pdx_xfer_id *xfer, const char *reason)
{
	struct peer_msg pm;

	peer_msg_begin(&pm, a, op, xfer, reason);
	return peer_msg_send(&pm, p);
}

/* {"op": "gone", "instance"}: our engine's registration of instance
 * ended; a peer drops its handshake with us, and with it its maps of
 * that engine's memory (docs/protocol.md). */
void tell_gone(struct agent *a, struct peer *p)
{
	struct peer_msg pm;

	peer_msg_begin(&pm, a, "gone", NULL, NULL);
	pdx_mp_msg_u64(&pm.m, "instance", a->instance);
	peer_msg_send(&pm, p);
}
