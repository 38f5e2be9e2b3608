/* Completion notifications to a collector (the proxy): never blocking a
 * transfer, dropped and counted when the collector is away. */
#include <zmq.h>

#include "agent/agent.h"
#include "common/mp.h"

void notify_xfer(struct agent *a, struct xfer *x, const char *kind)
{
	struct pdx_mp_out o;

	if (!a->notify_sock)
		return;
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, 4 + XFER_OUTCOME_FIELDS);
	pdx_mp_kv_str(&o.pk, "op", "xfer_event");
	pdx_mp_kv_str(&o.pk, "agent", a->peer_addr);
	pdx_mp_kv_str(&o.pk, "peer", x->peer_addr);
	/* how the bytes moved: the proxy's /metrics counts by it */
	pdx_mp_kv_str(&o.pk, "path",
		      x->peer && peer_known(x->peer) ? data_path_key(x->peer->path)
						     : "");
	xfer_pack_outcome(&o.pk, x, kind);
	if (zmq_send(a->notify_sock, o.buf.data, o.buf.size, ZMQ_DONTWAIT) < 0)
		a->notify_dropped++;
	pdx_mp_out_free(&o);
}
