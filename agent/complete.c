/* How a transfer's data operations finish: each one that ends is counted
 * off the transfer; the sender flushes and says "done" once every layer is
 * at the receiver, and the receiver succeeds once what "done" announced
 * arrived. Every data path (host and GPU) ends its operations here. */
#define PDX_LOG_TOPIC "push"
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

/* Every byte is at the receiver: tell it. */
static void send_done(struct xfer *x)
{
	struct pdx_mp_out o;

	xfer_mark(x, MARK_FLUSHED);
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
		send_done(x);
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
		send_done(x);
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
