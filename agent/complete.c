/* How a transfer's data operations finish: each one that ends is counted
 * off the transfer; the sender flushes and says "done" once every layer is
 * at the receiver (on the ipc lane by UCX, else on the peer link), and the
 * receiver succeeds once what "done" announced arrived. Every data path
 * (host and GPU) ends its operations here. */
#define PDX_LOG_TOPIC "push"
#include <string.h>

#include "agent/agent.h"
#include "common/log.h"

void push_op_done(struct xfer *x, pdx_status_t status)
{
	xfer_unhold(x);
	pdx_xfer_sm_op_finished(&x->sm);
	if (status && !x->finished)
		xfer_fail(x, status, true, "data operation to %s failed: %s",
			  x->peer_addr, pdx_status_str(status));
	push_maybe_flush(x);
	xfer_maybe_release(x);
}

void push_op_done_cb(void *arg, pdx_status_t status)
{
	push_op_done(arg, status);
}

/* "done" by UCX (AM_ID_DONE): the header, little-endian. */
#define DONE_HDR_BYTES 40

/* Nothing waits for it: like a ZeroMQ send, it is on its way. */
static void done_am_sent(void *arg, pdx_status_t status)
{
	(void)arg;
	if (status)
		log_warn("done by ucx: %s", pdx_status_str(status));
}

/* The ipc lane: the copies are in the receiver's memory already, and the
 * UCX endpoint wakes the receiver's loop itself, where a ZeroMQ message
 * passes through two I/O threads on its way (docs/benchmarking.md). */
static pdx_status_t send_done_am(struct xfer *x)
{
	uint8_t hdr[DONE_HDR_BYTES];

	memcpy(hdr, x->id.b, 16);
	memcpy(hdr + 16, &x->first_token, 8);
	memcpy(hdr + 24, &x->bytes, 8);
	memcpy(hdr + 32, &x->am_bytes, 8);
	return pdx_ucx_am_send(x->peer->ep, AM_ID_DONE, hdr, sizeof(hdr), NULL,
			       0, NULL, done_am_sent, NULL);
}

void done_am_handler(void *arg, const void *hdr, size_t hdr_len, void *data,
		     size_t len, bool rndv)
{
	struct agent *a = arg;
	const uint8_t *h = hdr;
	struct pdx_xfer_id id;
	uint64_t bytes, am_bytes;
	int64_t first_token;
	struct xfer *x;

	if (rndv)
		pdx_ucx_am_drop(a->ucx, data);
	if (hdr_len != DONE_HDR_BYTES || len) {
		log_warn("done by ucx with a %zu-byte header and %zu bytes: "
			 "dropped", hdr_len, len);
		return;
	}
	memcpy(id.b, h, 16);
	memcpy(&first_token, h + 16, 8);
	memcpy(&bytes, h + 24, 8);
	memcpy(&am_bytes, h + 32, 8);
	x = xfer_find(a, &id);
	if (!x || x->finished || x->role != XFER_RECV || !x->announced ||
	    !peer_known(x->peer)) {
		log_debug("done by ucx for no transfer awaiting it: ignored");
		return;
	}
	xfer_mark(x, MARK_DONE_HEARD);
	log_debug("done from %s by ucx: %llu bytes", x->peer_addr,
		  (unsigned long long)bytes);
	recv_done(x, bytes, am_bytes, first_token);
}

void recv_done(struct xfer *x, uint64_t bytes, uint64_t am_bytes,
	       int64_t first_token)
{
	x->first_token = first_token >= 0 && first_token <= UINT32_MAX
				 ? first_token
				 : -1;
	x->done_seen = true;
	x->am_expected = am_bytes;
	x->bytes = bytes;
	recv_try_complete(x);
}

/* Every byte is at the receiver: tell it. */
void push_send_done(struct xfer *x)
{
	struct pdx_mp_out o;

	xfer_mark(x, MARK_FLUSHED);
	if (x->peer->path == DATA_IPC && x->peer->done_ucx) {
		pdx_status_t st;

		xfer_mark(x, MARK_DONE_SENT);
		st = send_done_am(x);
		if (st)
			xfer_fail(x, st, true, "cannot send done to %s: %s",
				  x->peer_addr, pdx_status_str(st));
		else
			xfer_succeed(x);
		log_debug("done sent to %s by ucx", x->peer_addr);
		return;
	}
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, 6);
	pdx_mp_kv_str(&o.pk, "op", "done");
	pdx_mp_kv_i64(&o.pk, "first_token", x->first_token);
	pdx_mp_kv_str(&o.pk, "from", x->agent->peer_addr);
	pdx_mp_kv_xfer(&o.pk, "xfer", &x->id);
	pdx_mp_kv_u64(&o.pk, "bytes", x->bytes);
	pdx_mp_kv_u64(&o.pk, "am_bytes", x->am_bytes);
	xfer_mark(x, MARK_DONE_SENT);
	if (agent_zsend(x->peer->dealer, NULL, 0, o.buf.data, o.buf.size))
		xfer_fail(x, PDX_EPEER, false, "cannot send done to %s",
			  x->peer_addr);
	else
		xfer_succeed(x);
	log_debug("done sent to %s", x->peer_addr);
	pdx_mp_out_free(&o);
}

static void flush_done(void *arg, pdx_status_t status)
{
	struct xfer *x = arg;

	xfer_unhold(x);
	if (!x->finished && status)
		xfer_fail(x, status, true, "flush to %s failed: %s",
			  x->peer_addr, pdx_status_str(status));
	else if (!x->finished)
		push_send_done(x);
	xfer_maybe_release(x);
}

/* "done" only after every byte is at the receiver: UCX operations are
 * flushed first; ipc copies are complete when they return, cuda-ipc ones
 * when their stream callback ran. */
void push_maybe_flush(struct xfer *x)
{
	pdx_status_t st;

	if (x->finished || !pdx_xfer_sm_take_flush(&x->sm))
		return;
	if (x->peer->path == DATA_IPC || x->peer->path == DATA_CUDA_IPC) {
		push_send_done(x);
		return;
	}
	log_debug("flush to %s", x->peer_addr);
	st = pdx_ucx_flush(x->peer->ep, flush_done, x);
	if (st)
		xfer_fail(x, st, true, "flush to %s: %s", x->peer_addr,
			  pdx_status_str(st));
	else
		xfer_hold(x);
}

void recv_try_complete(struct xfer *x)
{
	if (x->finished || !x->done_seen || x->inflight)
		return;
	if (x->am_bytes == x->am_expected)
		xfer_succeed(x);
	else if (x->am_bytes > x->am_expected)
		xfer_fail(x, PDX_EINVAL, true, "received %llu bytes, sender sent %llu",
			  (unsigned long long)x->am_bytes,
			  (unsigned long long)x->am_expected);
}
