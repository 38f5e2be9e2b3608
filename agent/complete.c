/* How a transfer's data operations finish: each one that ends is counted
 * off the transfer; the sender flushes and says "done" once every layer is
 * at the receiver, and the receiver succeeds once what "done" announced
 * arrived. Every data path (host and GPU) ends its operations here. */
#define PDX_LOG_TOPIC "push"
#include "agent/agent.h"
#include "common/log.h"

void complete_op_ended(struct xfer *x, pdx_status_t status)
{
	xfer_unhold(x);
	pdx_xfer_sm_op_finished(&x->sm);
	if (status && !x->finished)
		xfer_fail(x, status, true, "data operation to %s failed: %s",
			  x->peer_addr, pdx_status_str(status));
	complete_try_flush(x);
	xfer_maybe_release(x);
}

void complete_op_ended_cb(void *arg, pdx_status_t status)
{
	complete_op_ended(arg, status);
}

/* Every byte is at the receiver: tell it. */
static void send_done(struct xfer *x)
{
	struct peer_msg pm;
	pdx_status_t st;

	peer_msg_begin(&pm, x->agent, "done", &x->id, NULL);
	pdx_mp_msg_i64(&pm.m, "first_token", x->first_token);
	pdx_mp_msg_u64(&pm.m, "bytes", x->bytes);
	pdx_mp_msg_u64(&pm.m, "am_bytes", x->am_bytes);
	st = peer_msg_send(&pm, x->peer);
	if (st)
		xfer_fail(x, PDX_EPEER, false, "cannot send done to %s: %s",
			  x->peer_addr, pdx_status_str(st));
	else
		xfer_succeed(x);
	log_debug("done sent to %s", x->peer_addr);
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

pdx_status_t complete_flush_ucx(struct xfer *x)
{
	pdx_status_t st;

	log_debug("flush to %s", x->peer_addr);
	st = pdx_ucx_flush(x->peer->ep, flush_done, x);
	if (!st)
		xfer_hold(x);
	return st;
}

/* "done" only after every byte is at the receiver: UCX operations are
 * flushed first (the path's flush); ipc copies are complete when they
 * return, cuda-ipc ones when their stream callback ran. */
void complete_try_flush(struct xfer *x)
{
	pdx_status_t st;

	if (x->finished || !pdx_xfer_sm_take_flush(&x->sm))
		return;
	if (!x->peer->ops->flush) {
		send_done(x);
		return;
	}
	st = x->peer->ops->flush(x);
	if (st)
		xfer_fail(x, st, true, "flush to %s: %s", x->peer_addr,
			  pdx_status_str(st));
}

void complete_try_received(struct xfer *x)
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
