/* The agent going away and coming back, as the engine client sees it.
 *
 * ZMTP heartbeats (link.c) and the socket monitor tell us when the agent
 * goes away: its process exits (the ipc connection closes at once) or
 * freezes (stopped, a stuck host: the heartbeat closes it; ZeroMQ's own
 * thread answers pings, so an agent whose loop is busy or stuck while its
 * process runs is not "away"). Either way what the agent said before it
 * went is read first, then every transfer in flight fails at once
 * (inflight.c).
 *
 * The monitor also reports each connection whose handshake completed: an
 * agent that restarted (same address) has forgotten the registration.
 * The first call after one (pdx_engine_next_event() included, which the
 * fd wakes for it) sends the last accepted register again, so the
 * restarted agent serves the engine's next transfer instead of failing it
 * "not registered". Its answer is taken by the next call, whichever it is
 * (incoming.c); until then announcements fail at once with PDX_EPEER and
 * pdx_engine_link_status() says why.
 */
#define PDX_LOG_TOPIC "engine"

#include "lib/client.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"

/* The agent went away: what it said before it went was read; every
 * transfer in flight fails now, by an event of ours. */
static void link_lost(struct pdx_engine *e)
{
	e->up = false;
	e->registered = false;
	e->registering = false;
	e->down_ns = pdx_now_ns();
	/* the lane belongs to the connection lost (an agent that froze
	 * keeps its socket open) */
	pdx__link_lane_close(e, "the ZeroMQ connection was lost");
	snprintf(e->why_down, sizeof(e->why_down),
		 "the link to the agent was lost (the agent exited, restarted "
		 "or did not answer heartbeats for %d ms)",
		 e->liveness_ms);
	pdx__inflight_fail_all(e, PDX_EAGENT);
}

/* Reads the link's monitor: a connection whose handshake completed
 * brings the link up (not registered on it yet), a closed one takes it
 * down. */
void pdx__link_watch(struct pdx_engine *e)
{
	for (;;) {
		zmq_msg_t msg;
		int more = 0;
		size_t sz = sizeof(more);
		uint16_t ev = 0;

		zmq_msg_init(&msg);
		if (zmq_msg_recv(&msg, e->mon, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&msg);
			if (errno == EINTR)
				continue;
			return;
		}
		if (zmq_msg_size(&msg) >= sizeof(ev))
			memcpy(&ev, zmq_msg_data(&msg), sizeof(ev));
		if (zmq_getsockopt(e->mon, ZMQ_RCVMORE, &more, &sz) == 0 &&
		    more)
			zmq_msg_recv(&msg, e->mon, 0); /* the endpoint */
		zmq_msg_close(&msg);
		if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
			e->up = true;
			e->registered = false;
			e->displaced = false;
			snprintf(e->why_down, sizeof(e->why_down),
				 "the agent is back; registering again");
		} else if (ev == ZMQ_EVENT_DISCONNECTED && e->up) {
			/* what it said before it went still counts */
			pdx__drain(e);
			link_lost(e);
		}
	}
}

/* Registers again on a new connection to the agent (it restarted): the
 * restarted agent has no registration, and would fail what we say next.
 * The register goes out without waiting (the engine's loop never waits
 * for its agent); its answer is taken by whichever call comes next
 * (pdx__on_other), until then announcements fail at once. */
void pdx__relink(struct pdx_engine *e)
{
	uint64_t now;

	pdx__link_watch(e);
	if (!e->reg || !e->up || e->registered || e->displaced)
		return;
	/* Its answer may be waiting: take it here, on every call, not only
	 * on those that read events. An engine that retried its announcement
	 * (PDX_EPEER) without reading events never took it, and every
	 * timeout_ms sent the register again, the answer waiting unread. */
	if (e->registering) {
		pdx__drain(e);
		if (!e->up || e->registered || e->displaced)
			return;
	}
	now = pdx_now_ns();
	if (e->registering &&
	    now - e->relink_ns < (uint64_t)e->timeout_ms * 1000000ULL)
		return; /* its answer is to come */
	if (e->registering)
		log_warn("registering again: no answer in %d ms",
			 e->timeout_ms);
	/* a refusal (or no answer) is not asked again at every call: once
	 * per liveness */
	else if (e->relink_ns &&
		 now - e->relink_ns < (uint64_t)e->liveness_ms * 1000000ULL)
		return;
	e->registering = false;
	e->relink_ns = now;
	if (pdx__drain(e) != PDX_OK ||
	    pdx__link_send(e, e->reg, e->reg_len, false) != PDX_OK)
		return;
	log_info("the agent link connected again: registering again");
	e->registering = true;
}

const char *pdx_engine_peer_addr(const struct pdx_engine *e)
{
	return e ? e->peer : "";
}

pdx_status_t pdx_engine_link_status(const struct pdx_engine *e, char *reason,
				    size_t reason_len)
{
	uint64_t ago_ms;

	if (!e)
		return PDX_EINVAL;
	if (e->up && (e->registered || !e->reg)) {
		if (reason && reason_len)
			reason[0] = '\0'; /* nothing of an earlier answer */
		return PDX_OK;
	}
	if (reason && reason_len) {
		if (e->up || !e->down_ns) {
			snprintf(reason, reason_len, "%s", e->why_down);
		} else {
			ago_ms = (pdx_now_ns() - e->down_ns) / 1000000;
			snprintf(reason, reason_len, "%s, %llu ms ago",
				 e->why_down, (unsigned long long)ago_ms);
		}
	}
	return PDX_EPEER;
}
