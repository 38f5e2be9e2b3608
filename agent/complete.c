/* How a transfer's data operations finish: each one that ends is counted
 * off the transfer; the sender flushes and says "done" once every layer is
 * at the receiver (on the ipc lanes by UCX, else on the peer link), and the
 * receiver succeeds once what "done" announced arrived. Every data path
 * (host and GPU) ends its operations here. */
#define PDX_LOG_TOPIC "push"
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/am.h"
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

/* Nothing waits for it: like a ZeroMQ send, it is on its way. */
/* arg: the meta's copy, which the send used until now */
static void done_am_sent(void *arg, pdx_status_t status)
{
	if (status)
		log_warn("done by ucx: %s", pdx_status_str(status));
}

/* The ipc and cuda-ipc lanes: the copies are in the receiver's memory
 * already (cuda-ipc: our stream passed them), and the UCX endpoint wakes
 * the receiver's loop itself, where a ZeroMQ message passes through two
 * I/O threads on its way (docs/benchmarking.md). The
 * header, little-endian: xfer id, first_token, bytes, am_bytes; the
 * payload, eager, the meta (a copy: x may be gone before the send ends). */
static pdx_status_t send_done_am(struct xfer *x)
{
	uint8_t hdr[AM_DONE_BYTES];

	memcpy(hdr, x->id.b, 16);
	memcpy(hdr + 16, &x->first_token, 8);
	memcpy(hdr + 24, &x->bytes, 8);
	memcpy(hdr + 32, &x->am_bytes, 8);
	return pdx_ucx_am_send_eager(x->peer->ep, AM_DONE, hdr, sizeof(hdr),
				     x->meta, x->meta_len, done_am_sent, NULL);
}

void complete_on_done_am(void *arg, const void *hdr, size_t hdr_len,
			 void *data, size_t len, bool rndv)
{
	struct agent *a = arg;
	const uint8_t *h = hdr;
	struct pdx_xfer_id id;
	uint64_t bytes, am_bytes;
	int64_t first_token;
	struct xfer *x;

	if (rndv)
		pdx_ucx_am_drop(a->ucx, data);
	if (hdr_len != AM_DONE_BYTES || rndv || len > PDX_META_MAX) {
		log_warn("done by ucx with a %zu-byte header and %zu bytes%s: "
			 "dropped", hdr_len, len, rndv ? " by rendezvous" : "");
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
	if (xfer_set_meta(x, data, len)) {
		xfer_fail(x, PDX_ENOMEM, true, "out of memory for %zu bytes of "
			  "meta", len);
		return;
	}
	complete_done_heard(x, bytes, am_bytes, first_token);
}

void complete_done_heard(struct xfer *x, uint64_t bytes, uint64_t am_bytes,
			 int64_t first_token)
{
	x->first_token = first_token >= 0 && first_token <= UINT32_MAX
				 ? first_token
				 : -1;
	x->done_seen = true;
	x->am_expected = am_bytes;
	x->bytes = bytes;
	complete_try_received(x);
}

void complete_send_done(struct xfer *x)
{
	struct peer_msg pm;
	pdx_status_t st;

	bool by_ucx = (x->peer->path == DATA_IPC ||
		       x->peer->path == DATA_CUDA_IPC) &&
		      x->peer->done_ucx;

	xfer_mark(x, MARK_FLUSHED);
	xfer_mark(x, MARK_DONE_SENT);
	if (by_ucx) {
		st = send_done_am(x);
	} else {
		peer_msg_begin(&pm, x->agent, "done", &x->id, NULL);
		pdx_mp_msg_i64(&pm.m, "first_token", x->first_token);
		pdx_mp_msg_u64(&pm.m, "bytes", x->bytes);
		pdx_mp_msg_u64(&pm.m, "am_bytes", x->am_bytes);
		if (x->meta_len)
			pdx_mp_msg_bin(&pm.m, "meta", x->meta, x->meta_len);
		st = peer_msg_send(&pm, x->peer);
	}
	/* the peer link could not carry it: nothing more to tell the peer */
	if (st)
		xfer_fail(x, by_ucx ? st : PDX_EPEER, by_ucx,
			  "cannot send done to %s: %s", x->peer_addr,
			  pdx_status_str(st));
	else
		xfer_succeed(x);
	log_debug("done sent to %s%s", x->peer_addr, by_ucx ? " by ucx" : "");
}

static void flush_done(void *arg, pdx_status_t status)
{
	struct xfer *x = arg;

	xfer_unhold(x);
	if (!x->finished && status)
		xfer_fail(x, status, true, "flush to %s failed: %s",
			  x->peer_addr, pdx_status_str(status));
	else if (!x->finished)
		complete_send_done(x);
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

static void stop_flush_done(void *arg, pdx_status_t status)
{
	struct xfer *x = arg;

	xfer_unhold(x);
	if (status)
		log_debug("flush to %s before stopped: %s", x->peer_addr,
			  pdx_status_str(status));
	xfer_maybe_release(x);
}

/* A sender's "stopped" (or its own abort) tells the receiver that nothing
 * of ours lands in its blocks any more, and a receiver whose engine is
 * gone releases that memory at the word. Over TCP a put is an active
 * message that the receiver's UCX worker applies when it reads it: one
 * that ended here may still be on its way, and the decode agent wrote it
 * into the unmapped memory (SIGSEGV in ucp_put_handler; its engine killed
 * mid-push). A flush of the endpoint ends once the receiver applied every
 * put, so the word waits for it. Only on an endpoint that reports its
 * peer's failure (a flush to a dead peer without it never ends); a flush
 * that fails (the peer gone) lets the word go. */
bool complete_stop_flush(struct xfer *x)
{
	struct pdx_ucx_ep *ep;

	if (x->stop_flushed || x->role != XFER_SEND || x->pull || !x->bytes ||
	    !x->peer || !x->peer->ops || !x->peer->ops->flush)
		return false;
	x->stop_flushed = true;
	/* the endpoint its operations went on: kept for them, or its peer's */
	ep = x->ep_kept ? x->ep_kept->ep : x->peer->ep;
	if (!ep || !pdx_ucx_ep_reports_errors(ep) ||
	    pdx_ucx_flush(ep, stop_flush_done, x))
		return false;
	log_debug("flush to %s before stopped", x->peer_addr);
	xfer_hold(x);
	return true;
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
		complete_send_done(x);
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
