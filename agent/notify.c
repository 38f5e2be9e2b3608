/* Completion notifications to the collectors (proxies): never blocking a
 * transfer, dropped and counted when a collector is away. */
#include <zmq.h>

#include "agent/agent.h"
#include "common/mp.h"

void notify_xfer(struct agent *a, struct xfer *x, const char *kind)
{
	struct pdx_mp_msg m;

	if (!a->cfg.n_notify)
		return;
	pdx_mp_msg_init(&m);
	pdx_mp_msg_str(&m, "op", "xfer_event");
	pdx_mp_msg_str(&m, "agent", a->peer_addr);
	pdx_mp_msg_str(&m, "peer", x->peer_addr);
	/* how the bytes moved: the proxy's /metrics counts by it */
	pdx_mp_msg_str(&m, "path",
		       x->peer && peer_known(x->peer) ? data_path_key(x->peer->path)
						      : "");
	xfer_pack_outcome(&m, x, kind);
	if (pdx_mp_msg_end(&m))
		a->notify_dropped += a->cfg.n_notify;
	else
		for (unsigned i = 0; i < a->cfg.n_notify; i++)
			if (!a->notify[i].sock ||
			    zmq_send(a->notify[i].sock, m.buf.data, m.buf.size,
				     ZMQ_DONTWAIT) < 0)
				a->notify_dropped++;
	pdx_mp_msg_free(&m);
}
