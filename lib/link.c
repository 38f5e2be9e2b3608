/* The engine client's link: the engine side of the engine link
 * (docs/protocol.md, section 1), a ZeroMQ DEALER carrying one msgpack map
 * per frame, its socket monitor and its liveness.
 *
 * The socket is created with ZMQ_IMMEDIATE, so a message is queued only on
 * a completed connection: a register made while the agent is away waits
 * (up to timeout_ms) for it, and any other call fails at once (PDX_EPEER),
 * instead of parking the message in a pipe that a later agent would read.
 * A register that timed out therefore cannot be answered by a stale
 * "registered" much later, except when the agent got it but answered too
 * late; pdx_engine_register() drains such leftovers first (register.c).
 *
 * The link's own liveness. ZMTP heartbeats (liveness_ms / 4 apart, a
 * connection whose pings go unanswered for the rest of liveness_ms is
 * closed) and a socket monitor tell us when the agent goes away: its
 * process exits (the ipc connection closes at once) or freezes (stopped,
 * a stuck host: the heartbeat closes it; ZeroMQ's own thread answers
 * pings, so an agent whose loop is busy or stuck while its process runs
 * is not "away"). Either way what the agent said before it went is read
 * first, then every transfer in flight fails at once (inflight.c).
 *
 * The monitor also reports each connection whose handshake completed: an
 * agent that restarted (same address) has forgotten the registration,
 * and the next call registers again (register.c).
 */
#define PDX_LOG_TOPIC "engine"

#include "lib/client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"

#define DEFAULT_TIMEOUT_MS 10000
#define DEFAULT_LIVENESS_MS 1000
#define RCV_HWM 100000
#define SND_HWM 100000 /* a full queue means a stuck agent, not a burst */

/* Milliseconds to deadline_ns, rounded up; 0 once it passed. */
int pdx__ms_left(uint64_t deadline_ns)
{
	uint64_t now = pdx_now_ns();
	uint64_t left;

	if (now >= deadline_ns)
		return 0;
	left = (deadline_ns - now + 999999) / 1000000;
	return left > (uint64_t)INT32_MAX ? INT32_MAX : (int)left;
}

/* The agent went away: what it said before it went was read; every
 * transfer in flight fails now, by an event of ours. */
static void link_lost(struct pdx_engine *e)
{
	e->up = false;
	e->registered = false;
	e->registering = false;
	e->down_ns = pdx_now_ns();
	snprintf(e->why_down, sizeof(e->why_down),
		 "the link to the agent was lost (the agent exited, restarted "
		 "or did not answer heartbeats for %d ms)",
		 e->liveness_ms);
	pdx__inflight_fail_all(e);
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
			snprintf(e->why_down, sizeof(e->why_down),
				 "the agent is back; registering again");
		} else if (ev == ZMQ_EVENT_DISCONNECTED && e->up) {
			/* what it said before it went still counts */
			pdx__drain(e);
			link_lost(e);
		}
	}
}

/* Sends one frame. register waits up to timeout_ms for room (or a
 * connection); everything else returns at once, PDX_EPEER when the agent
 * is away: an engine calls these on its event loop, which must not stop
 * for timeout_ms per message while its agent is dead. */
pdx_status_t pdx__link_send(struct pdx_engine *e, const void *buf, size_t len,
			    bool wait)
{
	uint64_t deadline = pdx_now_ns() + (uint64_t)e->timeout_ms * 1000000ULL;

	for (;;) {
		zmq_pollitem_t it = {e->sock, 0, ZMQ_POLLOUT, 0};
		int left;

		if (zmq_send(e->sock, buf, len, ZMQ_DONTWAIT) >= 0)
			return PDX_OK;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN) {
			log_error("send to agent: %s", zmq_strerror(errno));
			return pdx__fail(e, PDX_EIO, "send to agent: %s",
					 zmq_strerror(errno));
		}
		if (!wait) {
			log_warn("send to agent: not connected, or %d messages "
				 "queued",
				 SND_HWM);
			return pdx__fail(e, PDX_EPEER,
					 "send to agent: not connected, or %d "
					 "messages queued",
					 SND_HWM);
		}
		left = pdx__ms_left(deadline);
		if (left == 0) {
			log_warn("send to agent: not connected or queue full "
				 "after %d ms",
				 e->timeout_ms);
			return pdx__fail(e, PDX_ETIMEDOUT,
					 "send to agent: not connected or "
					 "queue full after %d ms",
					 e->timeout_ms);
		}
		if (zmq_poll(&it, 1, left) < 0 && errno != EINTR) {
			log_error("poll agent socket: %s", zmq_strerror(errno));
			return pdx__fail(e, PDX_EIO, "poll agent socket: %s",
					 zmq_strerror(errno));
		}
	}
}

/* Receives one whole message without waiting. Returns 1 with *msg set (the
 * caller closes it), 0 when nothing is there, -1 on a socket failure. A
 * message of more than one frame is dropped (and 0 or the next one is
 * tried): the protocol has single-frame messages only. */
int pdx__link_recv(struct pdx_engine *e, zmq_msg_t *msg)
{
	for (;;) {
		int more = 0;
		size_t sz = sizeof(more);

		zmq_msg_init(msg);
		if (zmq_msg_recv(msg, e->sock, ZMQ_DONTWAIT) < 0) {
			int err = errno;

			zmq_msg_close(msg);
			if (err == EAGAIN)
				return 0;
			if (err == EINTR)
				continue;
			log_error("receive from agent: %s", zmq_strerror(err));
			pdx__fail(e, PDX_EIO, "receive from agent: %s",
				  zmq_strerror(err));
			return -1;
		}
		if (zmq_getsockopt(e->sock, ZMQ_RCVMORE, &more, &sz) == 0 &&
		    more) {
			/* drain and drop the rest of a multi-frame message */
			do {
				zmq_msg_close(msg);
				zmq_msg_init(msg);
				if (zmq_msg_recv(msg, e->sock, 0) < 0)
					break;
				sz = sizeof(more);
				if (zmq_getsockopt(e->sock, ZMQ_RCVMORE, &more,
						   &sz))
					more = 0;
			} while (more);
			zmq_msg_close(msg);
			log_warn(
			    "dropped a multi-frame message from the agent");
			continue;
		}
		return 1;
	}
}

/* One fd for the engine's loop: readable when either socket (messages,
 * or the monitor's connection events) may have something. */
static int watch_both(struct pdx_engine *e)
{
	void *socks[2] = {e->sock, e->mon};

	e->efd = epoll_create1(EPOLL_CLOEXEC);
	if (e->efd < 0)
		return -1;
	for (int i = 0; i < 2; i++) {
		struct epoll_event ev = {.events = EPOLLIN};
		int fd = -1;
		size_t sz = sizeof(fd);

		if (zmq_getsockopt(socks[i], ZMQ_FD, &fd, &sz) ||
		    epoll_ctl(e->efd, EPOLL_CTL_ADD, fd, &ev))
			return -1;
	}
	return 0;
}

pdx_status_t pdx_engine_connect(const struct pdx_engine_params *params,
				struct pdx_engine **out)
{
	struct pdx_engine *e;
	int linger = 0, immediate = 1, hwm = RCV_HWM, shwm = SND_HWM, unbounded = 0;
	int hb_ivl, hb_timeout;
	char mon[64];

	if (!out)
		return PDX_EINVAL;
	*out = NULL;
	if (!params || !params->agent || !params->agent[0] ||
	    strnlen(params->agent, PDX_ADDR_MAX) >= PDX_ADDR_MAX ||
	    params->timeout_ms < 0 || params->liveness_ms < 0)
		return PDX_EINVAL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return PDX_ENOMEM;
	e->efd = -1;
	e->timeout_ms =
	    params->timeout_ms ? params->timeout_ms : DEFAULT_TIMEOUT_MS;
	e->liveness_ms =
	    params->liveness_ms ? params->liveness_ms : DEFAULT_LIVENESS_MS;
	/* a ping every quarter; one unanswered for the rest closes the link */
	hb_ivl = e->liveness_ms / 4 ? e->liveness_ms / 4 : 1;
	hb_timeout = e->liveness_ms - hb_ivl ? e->liveness_ms - hb_ivl : 1;
	snprintf(e->why_down, sizeof(e->why_down),
		 "no connection to the agent at %s yet", params->agent);
	e->xfer_timeout_ms = params->xfer_timeout_ms;
	e->ctx = zmq_ctx_new();
	if (!e->ctx) {
		free(e);
		return PDX_ENOMEM;
	}
	e->sock = zmq_socket(e->ctx, ZMQ_DEALER);
	if (!e->sock ||
	    zmq_setsockopt(e->sock, ZMQ_LINGER, &linger, sizeof(linger)) ||
	    zmq_setsockopt(e->sock, ZMQ_IMMEDIATE, &immediate,
			   sizeof(immediate)) ||
	    zmq_setsockopt(e->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm)) ||
	    zmq_setsockopt(e->sock, ZMQ_SNDHWM, &shwm, sizeof(shwm)) ||
	    zmq_setsockopt(e->sock, ZMQ_HEARTBEAT_IVL, &hb_ivl,
			   sizeof(hb_ivl)) ||
	    zmq_setsockopt(e->sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout,
			   sizeof(hb_timeout))) {
		log_error("engine socket: %s", zmq_strerror(errno));
		pdx_engine_free(e);
		return PDX_EIO;
	}
	snprintf(mon, sizeof(mon), "inproc://pdx-engine-monitor-%p", (void *)e);
	e->mon = zmq_socket(e->ctx, ZMQ_PAIR);
	/* No bound on the monitor's queue (RCVHWM 0): the I/O thread must
	 * never wait on us to read it (it holds the monitor's lock then). */
	if (!e->mon ||
	    zmq_setsockopt(e->mon, ZMQ_LINGER, &linger, sizeof(linger)) ||
	    zmq_setsockopt(e->mon, ZMQ_RCVHWM, &unbounded, sizeof(unbounded)) ||
	    zmq_socket_monitor(e->sock, mon,
			       ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
				   ZMQ_EVENT_DISCONNECTED) ||
	    zmq_connect(e->mon, mon)) {
		log_error("engine socket monitor: %s", zmq_strerror(errno));
		pdx_engine_free(e);
		return PDX_EIO;
	}
	if (watch_both(e)) {
		log_error("engine link fd: %s", strerror(errno));
		pdx_engine_free(e);
		return PDX_EIO;
	}
	if (zmq_connect(e->sock, params->agent)) {
		log_error("connect to agent at %s: %s", params->agent,
			  zmq_strerror(errno));
		pdx_engine_free(e);
		return errno == EINVAL || errno == EPROTONOSUPPORT ? PDX_EINVAL
								   : PDX_EIO;
	}
	*out = e;
	return PDX_OK;
}

void pdx_engine_free(struct pdx_engine *e)
{
	if (!e)
		return;
	/* The monitor stops before its reader closes: ZeroMQ's I/O thread
	 * sends a monitor event holding the monitor's lock and waits while
	 * the reader is gone, and stopping the monitor takes that lock (a
	 * hang when the agent left just as we free). */
	if (e->sock) {
		zmq_socket_monitor(e->sock, NULL, 0);
		zmq_close(e->sock);
	}
	if (e->mon)
		zmq_close(e->mon);
	if (e->ctx)
		zmq_ctx_term(e->ctx);
	if (e->efd >= 0)
		close(e->efd);
	pdx__inflight_free(e);
	pdx__cuda_free(e->cuda);
	free(e->reg);
	free(e);
}

int pdx_engine_fd(const struct pdx_engine *e)
{
	return e ? e->efd : -1;
}

pdx_status_t pdx_engine_link_status(const struct pdx_engine *e, char *reason,
				    size_t reason_len)
{
	uint64_t ago_ms;

	if (!e)
		return PDX_EINVAL;
	if (e->up && (e->registered || !e->reg))
		return PDX_OK;
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
