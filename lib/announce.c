/* What the engine says about its transfers: send and recv announce one
 * (it is in flight until its event), layer_done, token and meta feed a send,
 * hold and abort act on one by its id.
 */
#define PDX_LOG_TOPIC "engine"

#include "lib/client.h"

#include <stdlib.h>
#include <string.h>

/* A transfer id in hex, for reasons. */
struct hex33 {
	char s[33];
};

static struct hex33 hex(const struct pdx_xfer_id *x)
{
	struct hex33 h;

	pdx_xfer_id_hex(x, h.s);
	return h;
}

/* A peer address: not empty, shorter than PDX_ADDR_MAX. */
static bool peer_ok(const char *peer)
{
	size_t n;

	if (!peer)
		return false;
	n = strnlen(peer, PDX_ADDR_MAX);
	return n > 0 && n < PDX_ADDR_MAX;
}

/* Every message but register: after a reconnection, register first;
 * while the agent is away (or has not taken our register again), fail at
 * once. */
static pdx_status_t send_out(struct pdx_engine *e, struct pdx_mp_out *o)
{
	pdx_status_t st;

	/* the agent refuses any of these from an engine not registered:
	 * said here, where it was "not connected, or 100000 messages
	 * queued" (EPEER) while the connection came up */
	if (!e->reg) {
		pdx_mp_out_free(o);
		/* said at warn, as that was: a mistake of the engine's */
		return pdx__fail_log(e, PDX_LOG_WARN, PDX_ENOTREG,
				     "%s: this engine has not registered its "
				     "KV memory yet (pdx_engine_register "
				     "first)", e->call);
	}
	pdx__relink(e);
	if (e->up && e->registered)
		st = pdx__link_send(e, o->buf.data, o->buf.size, false);
	else
		st = pdx__fail(e, PDX_EPEER, "the agent is away: %s",
			       e->why_down);
	pdx_mp_out_free(o);
	return st;
}

static pdx_status_t announce(struct pdx_engine *e, const char *op,
			     const struct pdx_xfer_id *xfer, const char *peer,
			     const uint32_t *blocks, size_t n_blocks,
			     const struct pdx_recv_opts *ro)
{
	struct pdx_mp_out o;
	struct pdx__inflight *t;
	pdx_status_t st;

	if (!xfer || !blocks || n_blocks == 0 || n_blocks > UINT32_MAX)
		return pdx__fail(e, PDX_EINVAL, "%s: needs a transfer id and "
				 "1 to 2^32-1 blocks", op);
	if (ro && ro->n_peers) {
		if (!ro->peers || ro->n_peers > 0x7fff)
			return pdx__fail(e, PDX_EINVAL, "%s: n_peers %u needs "
					 "that many peers (at most 32767)", op,
					 ro->n_peers);
		for (uint32_t i = 0; i < ro->n_peers; i++)
			if (!peer_ok(ro->peers[i]))
				return pdx__fail(e, PDX_EINVAL, "%s: peers[%u] "
						 "needs an address of 1 to %d "
						 "bytes", op, i, PDX_ADDR_MAX - 1);
		peer = NULL; /* the agent picks among them */
	} else if (!(peer ? peer_ok(peer) : op[0] == 's')) {
		/* a send may leave its receiver open: the first to claim it */
		return pdx__fail(e, PDX_EINVAL,
				 "%s: needs a peer address of 1 to %d bytes",
				 op, PDX_ADDR_MAX - 1);
	}
	if (pdx__inflight_has(e, xfer) && !pdx__inflight_held(e, xfer))
		return pdx__fail(e, PDX_EEXIST,
				 "%s: transfer %s is in flight already", op,
				 hex(xfer).s); /* the one in flight goes on */
	if (ro && ro->mode != PDX_XFER_DEFAULT && ro->mode != PDX_XFER_PUSH &&
	    ro->mode != PDX_XFER_PULL)
		return pdx__fail(e, PDX_EINVAL, "%s: mode %d is not a "
				 "pdx_xfer_mode", op, (int)ro->mode);
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, 3 + (peer != NULL) +
				    (ro && ro->skip_tokens ? 1 : 0) +
				    (ro && ro->mode ? 1 : 0) +
				    (ro && ro->n_peers ? 1 : 0) +
				    (e->xfer_timeout_ms ? 1 : 0));
	pdx_mp_kv_str(&o.pk, "op", op);
	pdx_mp_kv_xfer(&o.pk, "xfer", xfer);
	if (peer)
		pdx_mp_kv_str(&o.pk, "peer", peer);
	if (ro && ro->n_peers) {
		pdx_mp_str(&o.pk, "peers");
		msgpack_pack_array(&o.pk, ro->n_peers);
		for (uint32_t i = 0; i < ro->n_peers; i++)
			pdx_mp_str(&o.pk, ro->peers[i]);
	}
	pdx_mp_kv_u32s(&o.pk, "blocks", blocks, n_blocks);
	if (ro && ro->skip_tokens)
		pdx_mp_kv_u64(&o.pk, "skip_tokens", ro->skip_tokens);
	if (ro && ro->mode) {
		pdx_mp_str(&o.pk, "pull");
		if (ro->mode == PDX_XFER_PULL)
			msgpack_pack_true(&o.pk);
		else
			msgpack_pack_false(&o.pk);
	}
	if (e->xfer_timeout_ms)
		pdx_mp_kv_u64(&o.pk, "timeout_ms", e->xfer_timeout_ms);
	/* In flight only once it went out: send_out() may first find the
	 * link lost, which fails what is in flight (and this must not be:
	 * it fails here, by its return). */
	t = calloc(1, sizeof(*t));
	if (!t) {
		pdx_mp_out_free(&o);
		return pdx__fail(e, PDX_ENOMEM, "%s: no memory", op);
	}
	st = send_out(e, &o);
	if (st != PDX_OK || pdx__inflight_announced(e, t, xfer))
		free(t);
	return st;
}

pdx_status_t pdx_engine_send(struct pdx_engine *e,
			     const struct pdx_xfer_id *xfer, const char *peer,
			     const uint32_t *blocks, size_t n_blocks)
{
	pdx_status_t st = pdx__enter(e, "send");

	if (st == PDX_OK)
		st = pdx__leave(e, announce(e, "send", xfer, peer, blocks,
					    n_blocks, NULL));
	return st;
}

pdx_status_t pdx_engine_recv(struct pdx_engine *e,
			     const struct pdx_xfer_id *xfer, const char *peer,
			     const uint32_t *blocks, size_t n_blocks,
			     uint32_t skip_tokens)
{
	struct pdx_recv_opts ro = { .skip_tokens = skip_tokens };
	pdx_status_t st = pdx__enter(e, "recv");

	if (st == PDX_OK)
		st = pdx__leave(e, announce(e, "recv", xfer, peer, blocks,
					    n_blocks, &ro));
	return st;
}

pdx_status_t pdx_engine_recv_opts(struct pdx_engine *e,
				  const struct pdx_xfer_id *xfer,
				  const char *peer, const uint32_t *blocks,
				  size_t n_blocks,
				  const struct pdx_recv_opts *opts)
{
	struct pdx_recv_opts ro = opts ? *opts : (struct pdx_recv_opts){ 0 };
	pdx_status_t st = pdx__enter(e, "recv_opts");

	if (st == PDX_OK)
		st = pdx__leave(e, announce(e, "recv", xfer, peer, blocks,
					    n_blocks, &ro));
	return st;
}

pdx_status_t pdx_engine_layer_done(struct pdx_engine *e, uint32_t layer,
				   const struct pdx_xfer_id *xfers, size_t n)
{
	pdx_status_t st = pdx__enter(e, "layer_done");

	if (st == PDX_OK)
		st = pdx__leave(e, pdx__layer_done(e, layer, UINT32_MAX, xfers,
						   n));
	return st;
}

pdx_status_t pdx_engine_layer_done_slot(struct pdx_engine *e, uint32_t layer,
					uint32_t slot,
					const struct pdx_xfer_id *xfers,
					size_t n)
{
	pdx_status_t st = pdx__enter(e, "layer_done_slot");

	if (st == PDX_OK)
		st = pdx__leave(e, pdx__layer_done(e, layer, slot, xfers, n));
	return st;
}

/* slot UINT32_MAX: no event to wait on. */
pdx_status_t pdx__layer_done(struct pdx_engine *e, uint32_t layer,
			     uint32_t slot, const struct pdx_xfer_id *xfers,
			     size_t n)
{
	struct pdx_mp_out o;
	bool with_slot = slot != UINT32_MAX;

	if (!xfers || n == 0 || n > UINT32_MAX || layer >= PDX_MAX_LAYERS)
		return pdx__fail(e, PDX_EINVAL,
				 "layer_done: needs 1 to 2^32-1 transfers and "
				 "a layer below %d (%zu transfers, layer %u)",
				 PDX_MAX_LAYERS, n, layer);
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, with_slot ? 4 : 3);
	pdx_mp_kv_str(&o.pk, "op", "layer_done");
	pdx_mp_kv_u64(&o.pk, "layer", layer);
	if (with_slot)
		pdx_mp_kv_u64(&o.pk, "slot", slot);
	pdx_mp_str(&o.pk, "xfers");
	msgpack_pack_array(&o.pk, n);
	for (size_t i = 0; i < n; i++)
		pdx_mp_bin(&o.pk, xfers[i].b, sizeof(xfers[i].b));
	return send_out(e, &o);
}

static pdx_status_t send_token(struct pdx_engine *e,
			       const struct pdx_xfer_id *xfer, uint32_t token)
{
	struct pdx_mp_out o;

	if (!xfer)
		return pdx__fail(e, PDX_EINVAL, "token: needs a transfer id");
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, 3);
	pdx_mp_kv_str(&o.pk, "op", "token");
	pdx_mp_kv_xfer(&o.pk, "xfer", xfer);
	pdx_mp_kv_u64(&o.pk, "token", token);
	return send_out(e, &o);
}

pdx_status_t pdx_engine_token(struct pdx_engine *e,
			      const struct pdx_xfer_id *xfer, uint32_t token)
{
	pdx_status_t st = pdx__enter(e, "token");

	if (st == PDX_OK)
		st = pdx__leave(e, send_token(e, xfer, token));
	return st;
}

static pdx_status_t send_meta(struct pdx_engine *e,
			      const struct pdx_xfer_id *xfer, const void *data,
			      size_t len)
{
	struct pdx_mp_out o;

	if (!xfer || (!data && len) || len > PDX_META_MAX)
		return pdx__fail(e, PDX_EINVAL,
				 "meta: needs a transfer id and at most %d "
				 "bytes (%zu)",
				 PDX_META_MAX, len);
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, 3);
	pdx_mp_kv_str(&o.pk, "op", "meta");
	pdx_mp_kv_xfer(&o.pk, "xfer", xfer);
	pdx_mp_kv_bin(&o.pk, "data", len ? data : "", len);
	return send_out(e, &o);
}

pdx_status_t pdx_engine_meta(struct pdx_engine *e,
			     const struct pdx_xfer_id *xfer, const void *data,
			     size_t len)
{
	pdx_status_t st = pdx__enter(e, "meta");

	if (st == PDX_OK)
		st = pdx__leave(e, send_meta(e, xfer, data, len));
	return st;
}

/* {op, xfer, peer?}: the messages about a transfer by id alone; call
 * names the public call. A peer given must be an address (an empty one
 * was taken for "none"); hold needs one. */
static pdx_status_t send_xfer_op(struct pdx_engine *e, const char *call,
				 const char *op,
				 const struct pdx_xfer_id *xfer,
				 const char *peer)
{
	struct pdx_mp_out o;

	if (!xfer)
		return pdx__fail(e, PDX_EINVAL, "%s: needs a transfer id",
				 call);
	if ((peer || !strcmp(call, "hold")) && !peer_ok(peer))
		return pdx__fail(e, PDX_EINVAL,
				 "%s: needs the peer address (1 to %d bytes)",
				 call, PDX_ADDR_MAX - 1);
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, peer ? 3 : 2);
	pdx_mp_kv_str(&o.pk, "op", op);
	pdx_mp_kv_xfer(&o.pk, "xfer", xfer);
	if (peer)
		pdx_mp_kv_str(&o.pk, "peer", peer);
	return send_out(e, &o);
}

pdx_status_t pdx_engine_hold(struct pdx_engine *e,
			     const struct pdx_xfer_id *xfer, const char *peer)
{
	pdx_status_t st = pdx__enter(e, "hold");

	if (st == PDX_OK) {
		st = send_xfer_op(e, "hold", "hold", xfer, peer);
		if (st == PDX_OK) /* its failure while held comes as an event */
			pdx__inflight_hold(e, xfer);
		st = pdx__leave(e, st);
	}
	return st;
}

pdx_status_t pdx_engine_abort(struct pdx_engine *e,
			      const struct pdx_xfer_id *xfer)
{
	pdx_status_t st = pdx__enter(e, "abort");

	if (st == PDX_OK) {
		st = send_xfer_op(e, "abort", "abort", xfer, NULL);
		if (st == PDX_OK)
			pdx__inflight_unhold(e, xfer);
		st = pdx__leave(e, st);
	}
	return st;
}

pdx_status_t pdx_engine_abort_at(struct pdx_engine *e,
				 const struct pdx_xfer_id *xfer,
				 const char *peer)
{
	pdx_status_t st = pdx__enter(e, "abort_at");

	if (st == PDX_OK) {
		st = send_xfer_op(e, "abort_at", "abort", xfer, peer);
		if (st == PDX_OK)
			pdx__inflight_unhold(e, xfer);
		st = pdx__leave(e, st);
	}
	return st;
}
