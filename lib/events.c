/* What the agent says to the engine client: events, refusals of an
 * announcement (each ends its transfer with an event made here), answers
 * to a register sent again; and the event API (next, wait).
 */
#define PDX_LOG_TOPIC "engine"

#include "lib/client.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"

/* Copies a str field, truncating it to outlen - 1 bytes. */
int pdx__get_str_trunc(const msgpack_object *map, const char *key, char *out,
		       size_t outlen)
{
	const msgpack_object *o = pdx_mp_get(map, key);
	size_t n;

	if (!o || o->type != MSGPACK_OBJECT_STR || outlen == 0)
		return -1;
	n = o->via.str.size < outlen - 1 ? o->via.str.size : outlen - 1;
	memcpy(out, o->via.str.ptr, n);
	out[n] = '\0';
	return 0;
}

/* Reads an "event" map into *ev; -1 when a required field is missing. */
static int parse_event(const msgpack_object *m, struct pdx_engine_event *ev)
{
	char kind[16];
	int64_t status;

	memset(ev, 0, sizeof(*ev));
	if (pdx_mp_get_xfer(m, "xfer", &ev->xfer) ||
	    pdx_mp_get_str(m, "kind", kind, sizeof(kind)) ||
	    pdx_mp_get_i64(m, "status", &status) ||
	    pdx__get_str_trunc(m, "reason", ev->reason, sizeof(ev->reason)) ||
	    pdx_mp_get_u64(m, "bytes", &ev->bytes) ||
	    pdx_mp_get_u64(m, "t_first", &ev->t_first_ns) ||
	    pdx_mp_get_u64(m, "t_last", &ev->t_last_ns))
		return -1;
	if (strcmp(kind, "sent") == 0)
		ev->kind = PDX_EVENT_SENT;
	else if (strcmp(kind, "received") == 0)
		ev->kind = PDX_EVENT_RECEIVED;
	else if (strcmp(kind, "failed") == 0)
		ev->kind = PDX_EVENT_FAILED;
	else
		return -1;
	if (status < -100000 || status > 0)
		return -1;
	ev->status = (pdx_status_t)status;
	if (pdx_mp_get_i64(m, "first_token", &ev->first_token) ||
	    ev->first_token < 0 || ev->first_token > UINT32_MAX)
		ev->first_token = -1; /* optional; older agents lack it */
	/* a failure always carries a failure status */
	if (ev->kind == PDX_EVENT_FAILED && ev->status == PDX_OK)
		ev->status = PDX_EIO;
	return 0;
}

/* Classifies a received frame. For "event" fills *ev; for anything else
 * that parses, leaves the parsed message in *up (caller destroys) and the op
 * in op. */
enum pdx__msg pdx__classify(zmq_msg_t *msg, msgpack_unpacked *up, char *op,
			    size_t oplen, struct pdx_engine_event *ev)
{
	if (pdx_mp_parse(zmq_msg_data(msg), zmq_msg_size(msg), up, op, oplen)) {
		log_warn(
		    "skipped a malformed message from the agent (%zu bytes)",
		    zmq_msg_size(msg));
		return PDX__MSG_SKIP;
	}
	if (strcmp(op, "event") == 0) {
		if (parse_event(&up->data, ev)) {
			log_warn("skipped a malformed event from the agent");
			return PDX__MSG_SKIP;
		}
		return PDX__MSG_EVENT;
	}
	return PDX__MSG_OTHER;
}

/* Takes whatever is already waiting: events go to the queue, and so does
 * the event made of a refused announcement (pdx__on_other); anything
 * else (a late answer to an earlier register) is dropped. */
pdx_status_t pdx__drain(struct pdx_engine *e)
{
	for (;;) {
		struct pdx_engine_event ev;
		msgpack_unpacked up;
		zmq_msg_t msg;
		char op[32];
		int rc = pdx__link_recv(e, &msg);

		if (rc < 0)
			return PDX_EIO;
		if (rc == 0)
			return PDX_OK;
		switch (pdx__classify(&msg, &up, op, sizeof(op), &ev)) {
		case PDX__MSG_EVENT:
			pdx__queue_keep(e, &ev);
			break;
		case PDX__MSG_OTHER:
			if (pdx__on_other(e, &up.data, op, &ev) &&
			    pdx__queue_push(e, &ev))
				log_error(
				    "event queue full: an event was lost");
			break;
		case PDX__MSG_SKIP:
			break;
		}
		msgpack_unpacked_destroy(&up);
		zmq_msg_close(&msg);
	}
}

/* A message that is not an event: the answer to a register sent again,
 * or an error refusing an announcement, which ends that transfer (its one
 * event, made here: true with *ev set). Anything else is dropped. */
bool pdx__on_other(struct pdx_engine *e, const msgpack_object *m,
		   const char *op, struct pdx_engine_event *ev)
{
	char refused[16] = "", was[PDX_ADDR_MAX];
	pdx_status_t st;
	int64_t status;

	if (e->registering) {
		memcpy(was, e->peer, sizeof(was));
		if (pdx__register_answer(m, op, e->peer, sizeof(e->peer),
					 &st, NULL, 0)) {
			pdx__relinked(e, st, was);
			return false;
		}
	}
	if (strcmp(op, "error") != 0 ||
	    pdx_mp_get_str(m, "refused", refused, sizeof(refused)) ||
	    (strcmp(refused, "send") != 0 && strcmp(refused, "recv") != 0) ||
	    pdx_mp_get_xfer(m, "xfer", &ev->xfer) ||
	    !pdx__inflight_has(e, &ev->xfer)) {
		log_debug("ignored \"%s\" from the agent", op);
		return false;
	}
	pdx__inflight_take(e, &ev->xfer);
	ev->kind = PDX_EVENT_FAILED;
	ev->status = pdx_mp_get_i64(m, "status", &status) || status >= 0 ||
			     status < -100000
			 ? PDX_EIO
			 : (pdx_status_t)status;
	ev->bytes = 0;
	ev->t_first_ns = ev->t_last_ns = pdx_now_ns();
	ev->first_token = -1;
	if (pdx__get_str_trunc(m, "reason", ev->reason, sizeof(ev->reason)))
		snprintf(ev->reason, sizeof(ev->reason),
			 "refused by the agent");
	return true;
}

pdx_status_t pdx_engine_next_event(struct pdx_engine *e,
				   struct pdx_engine_event *ev)
{
	if (!e)
		return PDX_EINVAL;
	pdx__why_clear(e);
	if (!ev)
		return pdx__fail(e, PDX_EINVAL, "next_event: no event to fill");
	/* a new connection wakes the link's fd too: a restarted agent gets
	 * the registration at once, before its peers ask it for our KV */
	pdx__relink(e);
	if (pdx__queue_pop(e, ev))
		return PDX_OK;
	for (;;) {
		msgpack_unpacked up;
		zmq_msg_t msg;
		char op[32];
		enum pdx__msg k;
		bool made;
		int rc = pdx__link_recv(e, &msg);

		if (rc < 0)
			return PDX_EIO;
		if (rc == 0)
			return PDX_EAGAIN;
		k = pdx__classify(&msg, &up, op, sizeof(op), ev);
		made =
		    k == PDX__MSG_OTHER && pdx__on_other(e, &up.data, op, ev);
		msgpack_unpacked_destroy(&up);
		zmq_msg_close(&msg);
		if (made ||
		    (k == PDX__MSG_EVENT && pdx__inflight_take(e, &ev->xfer)))
			return PDX_OK;
		if (k == PDX__MSG_EVENT)
			log_debug(
			    "dropped an event for a transfer not in flight");
	}
}

pdx_status_t pdx_engine_wait_event(struct pdx_engine *e, int timeout_ms,
				   struct pdx_engine_event *ev)
{
	uint64_t deadline = 0;

	if (!e)
		return PDX_EINVAL;
	pdx__why_clear(e);
	if (!ev || timeout_ms < -1)
		return pdx__fail(e, PDX_EINVAL,
				 "wait_event: needs an event to fill and a "
				 "timeout of -1 or more ms (%d)",
				 timeout_ms);
	if (timeout_ms >= 0)
		deadline = pdx_now_ns() + (uint64_t)timeout_ms * 1000000ULL;
	for (;;) {
		zmq_pollitem_t it[2] = {{e->sock, 0, ZMQ_POLLIN, 0},
					{e->mon, 0, ZMQ_POLLIN, 0}};
		pdx_status_t st = pdx_engine_next_event(e, ev);
		int left = -1;

		if (st != PDX_EAGAIN)
			return st;
		if (timeout_ms >= 0) {
			left = pdx__ms_left(deadline);
			if (left == 0)
				return pdx__fail(e, PDX_ETIMEDOUT,
						 "wait_event: no event in %d ms",
						 timeout_ms);
		}
		if (zmq_poll(it, 2, left) < 0 && errno != EINTR) {
			log_error("poll agent socket: %s", zmq_strerror(errno));
			return pdx__fail(e, PDX_EIO, "poll agent socket: %s",
					 zmq_strerror(errno));
		}
	}
}
