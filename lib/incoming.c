/* What the agent says, taken off the link while nobody waits for one
 * thing in particular: events go to the queue (inflight.c), a refused
 * announcement becomes its transfer's event here, and the answer to a
 * register sent again (liveness.c) settles the link. The readers that do
 * wait for something (register.c, events.c) hand their other messages
 * here too.
 */
#define PDX_LOG_TOPIC "engine"

#include "lib/client.h"

#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"

/* The answer to the register pdx__relink() sent again. */
static void relinked(struct pdx_engine *e, pdx_status_t st, const char *was)
{
	e->registering = false;
	if (st != PDX_OK) {
		log_error("registering again: %s", pdx_status_str(st));
		snprintf(e->why_down, sizeof(e->why_down),
			 "the agent is back but registering again failed: %s",
			 pdx_status_str(st));
		return;
	}
	e->registered = e->up;
	e->displaced = false;
	e->relink_ns = 0; /* the next restart is met at once */
	log_info("registered again with the agent");
	if (strcmp(was, e->peer) != 0)
		log_warn("the agent's peer address is now %s (was %s)", e->peer,
			 was);
}

/* Takes whatever is already waiting: events go to the queue, and so does
 * the event made of a refused announcement (pdx__on_other); anything
 * else (a late answer to an earlier register) is dropped. */
pdx_status_t pdx__drain(struct pdx_engine *e)
{
	for (;;) {
		struct pdx_engine_event ev;
		msgpack_unpacked up;
		struct pdx__frame f;
		char op[32];
		int rc = pdx__link_recv(e, &f);

		if (rc < 0)
			return PDX_EIO;
		if (rc == 0)
			return PDX_OK;
		switch (pdx__classify(&f, &up, op, sizeof(op), &ev)) {
		case PDX__MSG_EVENT:
			pdx__event_keep(e, &up.data, &ev);
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
		pdx__frame_close(&f);
	}
}

/* The agent said another engine registered since ours (why): link_status
 * says so, the transfers in flight fail (PDX_ENOTREG). */
static void displaced(struct pdx_engine *e, const char *why)
{
	/* a register of ours still out keeps its answer coming: taken,
	 * it makes us the served one again (relinked) */
	e->registered = false;
	e->displaced = true;
	e->down_ns = pdx_now_ns();
	snprintf(e->why_down, sizeof(e->why_down), "not registered: %s", why);
	log_error("%s", e->why_down);
	/* the agent sends their events to the other engine */
	pdx__inflight_fail_all(e, PDX_ENOTREG);
}

/* A message that is not an event: the answer to a register sent again,
 * or an error refusing an announcement, which ends that transfer (its one
 * event, made here: true with *ev set), or refusing the hold of one not
 * announced yet (a peer address that is none: it failed without a word,
 * and the engine waited for the transfer's bound). Anything else is
 * dropped (a refused hold of an announced transfer leaves it to run). */
bool pdx__on_other(struct pdx_engine *e, const msgpack_object *m,
		   const char *op, struct pdx_engine_event *ev)
{
	char refused[16] = "", was[PDX_ADDR_MAX];
	pdx_status_t st;
	int64_t status;

	if (!strcmp(op, "displaced")) {
		char why[PDX_REASON_MAX];

		if (pdx__get_str_trunc(m, "reason", why, sizeof(why)))
			snprintf(why, sizeof(why), "another engine registered "
				 "with the agent");
		displaced(e, why);
		return false;
	}
	if (e->registering) {
		memcpy(was, e->peer, sizeof(was));
		if (pdx__register_answer(m, op, e->peer, sizeof(e->peer),
					 &st, NULL, 0)) {
			struct pdx__lane_offer offer;

			pdx__lane_offer_read(m, &offer);
			if (st == PDX_OK)
				pdx__kv_dtype_heard(m, e->kv_dtype);
			relinked(e, st, was);
			/* pdx__relink() read the monitor before it sent */
			if (st == PDX_OK)
				pdx__link_lane_open(e, &offer);
			return false;
		}
	}
	if (strcmp(op, "error") != 0 ||
	    pdx_mp_get_str(m, "refused", refused, sizeof(refused)) ||
	    (strcmp(refused, "send") != 0 && strcmp(refused, "recv") != 0 &&
	     strcmp(refused, "hold") != 0) ||
	    pdx_mp_get_xfer(m, "xfer", &ev->xfer) ||
	    !pdx__inflight_has(e, &ev->xfer) ||
	    (!strcmp(refused, "hold") && !pdx__inflight_held(e, &ev->xfer))) {
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
