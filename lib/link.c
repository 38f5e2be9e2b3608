/* The engine client's link: the engine side of the engine link
 * (docs/protocol.md, section 1), a ZeroMQ DEALER carrying one msgpack map
 * per frame, and the PAIR that reads its socket monitor. This file opens
 * and closes them and moves frames; what the frames and the monitor's
 * events mean is read above it (incoming.c, liveness.c).
 *
 * The socket is created with ZMQ_IMMEDIATE, so a message is queued only on
 * a completed connection: a register made while the agent is away waits
 * (up to timeout_ms) for it, and any other call fails at once (PDX_EPEER),
 * instead of parking the message in a pipe that a later agent would read.
 * A register that timed out therefore cannot be answered by a stale
 * "registered" much later, except when the agent got it but answered too
 * late; pdx_engine_register() drains such leftovers first (register.c).
 *
 * ZMTP heartbeats (liveness_ms / 4 apart, a connection whose pings go
 * unanswered for the rest of liveness_ms is closed) and the monitor are
 * how a frozen or exited agent is noticed (liveness.c).
 */
#define PDX_LOG_TOPIC "engine"

#include "lib/client.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/lane_frame.h"
#include "common/log.h"

/* No bound on what the agent says (RCVHWM 0): at a bound, ZeroMQ's I/O
 * thread stops reading the connection, heartbeat answers included, and an
 * engine that left 100000 events unread lost its link as if its agent had
 * hung (every transfer in flight failed EAGENT, the register sent again
 * ended the rest). What the agent sends is bounded by what the engine
 * announced: an event or a refusal each. */
#define RCV_HWM 0
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

/* Sends one frame. register waits up to timeout_ms for room (or a
 * connection); everything else returns at once, PDX_EPEER when the agent
 * is away: an engine calls these on its event loop, which must not stop
 * for timeout_ms per message while its agent is dead. */
void pdx__link_lane_close(struct pdx_engine *e, const char *why)
{
	if (e->lane.fd < 0)
		return;
	if (e->lane.tx || e->lane.rx)
		log_info("the direct lane to the agent closed (%s): the link "
			 "goes by ZeroMQ", why);
	pdx__direct_close(e, false);
}

void pdx__link_lane_open(struct pdx_engine *e,
			 const struct pdx__lane_offer *o)
{
	if (!o->given || !e->up)
		return; /* none, or for a connection already lost */
	pdx__link_lane_close(e, "the agent offered another");
	if (pdx__direct_open(e, o->name, o->token, sizeof(o->token)))
		log_info("no direct lane to the agent (%s): the link goes by "
			 "ZeroMQ", strerror(errno));
}

pdx_status_t pdx__link_send(struct pdx_engine *e, const void *buf, size_t len,
			    bool wait)
{
	uint64_t deadline = pdx_now_ns() + (uint64_t)e->timeout_ms * 1000000ULL;

	if (e->lane.tx) {
		int rc = pdx__direct_write(e, buf, len);

		if (rc == 0)
			return PDX_OK;
		if (rc == -2)
			return pdx__fail_log(e, PDX_LOG_WARN, PDX_EPEER,
					     "send to agent: the direct lane "
					     "holds too much unsent (a stuck "
					     "agent)");
		pdx__link_lane_close(e, strerror(errno));
	}
	for (;;) {
		/* the wake-up: pdx_engine_free() from another thread */
		zmq_pollitem_t it[2] = {{e->sock, 0, ZMQ_POLLOUT, 0},
					{NULL, e->wake, ZMQ_POLLIN, 0}};
		int left;

		if (zmq_send(e->sock, buf, len, ZMQ_DONTWAIT) >= 0)
			return PDX_OK;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN) {
			return pdx__fail_log(e, PDX_LOG_ERROR, PDX_EIO,
					     "send to agent: %s",
					     zmq_strerror(errno));
		}
		if (!wait) {
			return pdx__fail_log(e, PDX_LOG_WARN, PDX_EPEER,
					     "send to agent: not connected, or "
					     "%d messages queued", SND_HWM);
		}
		if (pdx__freed(e))
			return pdx__freed_fail(e, "send to agent");
		left = pdx__ms_left(deadline);
		if (left == 0 && !e->up) /* say where, and what to check */
			return pdx__fail_log(e, PDX_LOG_WARN, PDX_ETIMEDOUT,
					     "send to agent: not connected "
					     "after %d ms: %s (is a pdx-agent "
					     "running with that --engine?)",
					     e->timeout_ms, e->why_down);
		if (left == 0) {
			return pdx__fail_log(e, PDX_LOG_WARN, PDX_ETIMEDOUT,
					     "send to agent: queue full after "
					     "%d ms",
					     e->timeout_ms);
		}
		if (zmq_poll(it, 2, left) < 0 && errno != EINTR) {
			return pdx__fail_log(e, PDX_LOG_ERROR, PDX_EIO,
					     "poll agent socket: %s",
					     zmq_strerror(errno));
		}
	}
}

/* Receives one whole ZeroMQ message without waiting: 1 with *msg set
 * (the caller closes it), 0 when nothing is there, -1 on a socket
 * failure. A message of more than one frame is dropped (and 0 or the next
 * one is tried): the protocol has single-frame messages only. */
static int zmq_take(struct pdx_engine *e, zmq_msg_t *msg)
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
			pdx__fail_log(e, PDX_LOG_ERROR, PDX_EIO,
				      "receive from agent: %s", zmq_strerror(err));
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

/* The agent's {"op": "direct"}, its last message on ZeroMQ: the lane is
 * read from now on, and (once ours went out, the last of ours on ZeroMQ)
 * written. Taken here: nothing above sees it. */
static bool lane_marker(struct pdx_engine *e, const void *data, size_t len)
{
	msgpack_unpacked up;
	char op[16];
	bool is;

	/* cheap first: a marker is a map of one key */
	if (len > 16 || !len || ((const uint8_t *)data)[0] != 0x81)
		return false;
	is = !pdx_mp_parse(data, len, &up, op, sizeof(op)) &&
	     !strcmp(op, "direct");
	msgpack_unpacked_destroy(&up);
	if (!is)
		return false;
	if (e->lane.fd < 0 || e->lane.rx) {
		log_debug("a direct marker with no lane waiting: ignored");
		return true;
	}
	e->lane.rx = true;
	pdx__direct_rearm(e);
	/* refused, the agent keeps reading ZeroMQ: so do our sends */
	e->lane.tx = zmq_send(e->sock, PDX_LANE_MARKER, PDX_LANE_MARKER_BYTES,
			      ZMQ_DONTWAIT) == (int)PDX_LANE_MARKER_BYTES;
	log_debug("the direct lane to the agent is up (sending on it: %s)",
		  e->lane.tx ? "yes" : "no");
	return true;
}

/* Receives one whole message without waiting: the lane's first, once it
 * is read. Returns 1 with *f set (the caller closes it), 0 when nothing is
 * there, -1 on a socket failure. */
int pdx__link_recv(struct pdx_engine *e, struct pdx__frame *f)
{
	for (;;) {
		bool held = e->zheld_ok;
		int rc;

		if (e->lane.fd >= 0 && pdx__direct_flush(e))
			pdx__link_lane_close(e, strerror(errno));
		if (e->lane.fd >= 0 && e->lane.rx) {
			rc = pdx__direct_read(e, &f->data, &f->len);
			if (rc == 1) {
				f->zmq = false;
				return 1;
			}
			if (rc < 0)
				pdx__link_lane_close(e, "the agent closed it");
		} else if (e->lane.fd >= 0) {
			char c;

			/* not read before the agent's marker: what came is
			 * left there, but its end (a token the agent refused)
			 * closes it */
			if (recv(e->lane.fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
				pdx__link_lane_close(e, "the agent refused it");
		}
		if (held) {
			zmq_msg_init(&f->msg);
			zmq_msg_move(&f->msg, &e->zheld);
			zmq_msg_close(&e->zheld);
			e->zheld_ok = false;
			rc = 1;
		} else {
			rc = zmq_take(e, &f->msg);
		}
		if (rc <= 0)
			return rc;
		f->zmq = true;
		f->data = zmq_msg_data(&f->msg);
		f->len = zmq_msg_size(&f->msg);
		if (!held && lane_marker(e, f->data, f->len)) {
			zmq_msg_close(&f->msg);
			continue;
		}
		/* The agent sends on ZeroMQ while we read the lane only once
		 * it dropped the lane: what it wrote there before is in our
		 * socket by now, and goes first. */
		if (!held && e->lane.fd >= 0 && e->lane.rx) {
			zmq_msg_init(&e->zheld);
			zmq_msg_move(&e->zheld, &f->msg);
			zmq_msg_close(&f->msg);
			e->zheld_ok = true;
			continue;
		}
		return 1;
	}
}

void pdx__frame_close(struct pdx__frame *f)
{
	if (f->zmq)
		zmq_msg_close(&f->msg);
	f->zmq = false;
}

int pdx__link_wait(struct pdx_engine *e, int timeout_ms, bool monitor)
{
	/* and the wake-up: pdx_engine_free() from another thread */
	zmq_pollitem_t it[4] = {{e->sock, 0, ZMQ_POLLIN, 0},
				{NULL, e->wake, ZMQ_POLLIN, 0}};
	int n = 2;

	if (monitor)
		it[n++] = (zmq_pollitem_t){e->mon, 0, ZMQ_POLLIN, 0};
	if (e->lane.fd >= 0) {
		short ev = (short)((e->lane.rx ? ZMQ_POLLIN : 0) |
				   (e->lane.out_len > e->lane.out_off
					? ZMQ_POLLOUT
					: 0));

		if (ev)
			it[n++] = (zmq_pollitem_t){NULL, e->lane.fd, ev, 0};
	}
	return zmq_poll(it, n, timeout_ms);
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

/* Opens the link's sockets and connects to the agent at agent (the
 * connection itself comes later, in ZeroMQ's I/O thread). On failure
 * what was opened stays in e, for pdx__link_close(). */
pdx_status_t pdx__link_open(struct pdx_engine *e, const char *agent)
{
	int linger = 0, immediate = 1, hwm = RCV_HWM, shwm = SND_HWM,
	    unbounded = 0;
	int hb_ivl, hb_timeout;
	char mon[64];

	/* a ping every quarter; one unanswered for the rest closes the link */
	hb_ivl = e->liveness_ms / 4 ? e->liveness_ms / 4 : 1;
	hb_timeout = e->liveness_ms - hb_ivl ? e->liveness_ms - hb_ivl : 1;
	e->ctx = zmq_ctx_new();
	if (!e->ctx)
		return PDX_ENOMEM;
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
		return PDX_EIO;
	}
	if (watch_both(e)) {
		log_error("engine link fd: %s", strerror(errno));
		return PDX_EIO;
	}
	if (zmq_connect(e->sock, agent)) {
		log_error("connect to agent at %s: %s", agent,
			  zmq_strerror(errno));
		return errno == EINVAL || errno == EPROTONOSUPPORT ? PDX_EINVAL
								   : PDX_EIO;
	}
	return PDX_OK;
}

/* Closes what pdx__link_open() opened, whatever it got to. */
void pdx__link_close(struct pdx_engine *e)
{
	/* The monitor stops before its reader closes: ZeroMQ's I/O thread
	 * sends a monitor event holding the monitor's lock and waits while
	 * the reader is gone, and stopping the monitor takes that lock (a
	 * hang when the agent left just as we free). */
	pdx__direct_close(e, false);
	if (e->zheld_ok)
		zmq_msg_close(&e->zheld);
	e->zheld_ok = false;
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
}

int pdx_engine_fd(const struct pdx_engine *e)
{
	return e ? e->efd : -1;
}
