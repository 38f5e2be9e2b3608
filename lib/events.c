/* The event API: pdx_engine_next_event() takes the next event, queued
 * (inflight.c) or off the link, with its meta (meta.c), and
 * pdx_engine_wait_event() waits for one. Every event handed out ends a transfer in flight; one for a
 * transfer not in flight (its event was made here when the link was lost)
 * is dropped.
 */
#define PDX_LOG_TOPIC "engine"

#include "lib/client.h"

#include <errno.h>

#include "common/clock.h"
#include "common/log.h"

static pdx_status_t next_event(struct pdx_engine *e,
			       struct pdx_engine_event *ev)
{
	if (!ev)
		return pdx__fail(e, PDX_EINVAL, "next_event: no event to fill");
	/* a new connection wakes the link's fd too: a restarted agent gets
	 * the registration at once, before its peers ask it for our KV */
	pdx__meta_hand_out(e, NULL);
	pdx__relink(e);
	if (pdx__queue_pop(e, ev)) {
		pdx__meta_hand_out(e, &ev->xfer);
		return PDX_OK;
	}
	for (;;) {
		msgpack_unpacked up;
		struct pdx__frame f;
		char op[32];
		enum pdx__msg k;
		bool made;
		int rc = pdx__link_recv(e, &f);

		if (rc < 0)
			return PDX_EIO;
		if (rc == 0)
			return PDX_EAGAIN;
		k = pdx__classify(&f, &up, op, sizeof(op), ev);
		if (k == PDX__MSG_EVENT)
			pdx__meta_shelve(e, &up.data, ev);
		made =
		    k == PDX__MSG_OTHER && pdx__on_other(e, &up.data, op, ev);
		msgpack_unpacked_destroy(&up);
		pdx__frame_close(&f);
		if (made ||
		    (k == PDX__MSG_EVENT && pdx__inflight_take(e, &ev->xfer))) {
			pdx__meta_hand_out(e, &ev->xfer);
			return PDX_OK;
		}
		if (k == PDX__MSG_EVENT)
			log_debug(
			    "dropped an event for a transfer not in flight");
	}
}

pdx_status_t pdx_engine_next_event(struct pdx_engine *e,
				   struct pdx_engine_event *ev)
{
	pdx_status_t st = pdx__enter(e, "next_event");

	if (st == PDX_OK)
		st = pdx__leave(e, next_event(e, ev));
	return st;
}

static pdx_status_t wait_event(struct pdx_engine *e, int timeout_ms,
			       struct pdx_engine_event *ev)
{
	uint64_t deadline = 0;

	if (!ev || timeout_ms < -1)
		return pdx__fail(e, PDX_EINVAL,
				 "wait_event: needs an event to fill and a "
				 "timeout of -1 or more ms (%d)",
				 timeout_ms);
	if (timeout_ms >= 0)
		deadline = pdx_now_ns() + (uint64_t)timeout_ms * 1000000ULL;
	for (;;) {
		pdx_status_t st = next_event(e, ev);
		int left = -1;

		if (st != PDX_EAGAIN)
			return st;
		if (pdx__freed(e))
			return pdx__freed_fail(e, "wait_event");
		if (timeout_ms >= 0) {
			left = pdx__ms_left(deadline);
			if (left == 0)
				return pdx__fail(e, PDX_ETIMEDOUT,
						 "wait_event: no event in %d ms",
						 timeout_ms);
		}
		if (pdx__link_wait(e, left, true) < 0 && errno != EINTR) {
			log_error("poll agent socket: %s", zmq_strerror(errno));
			return pdx__fail(e, PDX_EIO, "poll agent socket: %s",
					 zmq_strerror(errno));
		}
	}
}

pdx_status_t pdx_engine_wait_event(struct pdx_engine *e, int timeout_ms,
				   struct pdx_engine_event *ev)
{
	pdx_status_t st = pdx__enter(e, "wait_event");

	if (st == PDX_OK)
		st = pdx__leave(e, wait_event(e, timeout_ms, ev));
	return st;
}
