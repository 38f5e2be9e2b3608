/* The engine link's direct lane: a plain Unix stream socket beside the
 * ZeroMQ link, which carries the same messages once both sides switched
 * to it (docs/protocol.md, "The direct lane").
 *
 * Why: a ZeroMQ message between two processes wakes four threads (the
 * sender's I/O thread, the receiver's I/O thread, then the receiver); a
 * socket wakes one. On one host that is most of a one-block transfer's
 * control path: layer_done in, the event out.
 *
 * The switch loses and reorders nothing. The registered engine connects
 * to the name its "registered" answer offered and says the token that
 * came with it. Then each side sends {"op": "direct"} as its last
 * message on ZeroMQ and everything after it on the lane, and reads the
 * lane only once the other side's marker came off ZeroMQ:
 *
 *   engine                        agent
 *   register             --zmq-->
 *                        <--zmq-- registered + direct, direct_token
 *   {direct, token}      --lane-> (checked; the agent sends on the lane)
 *                        <--zmq-- {direct}
 *   (the engine reads and sends on the lane)
 *   {direct}             --zmq--> (the agent reads the lane)
 *
 * A lane refused (a stale token) is closed before either side sent on it.
 * A lane lost (the engine gone, a frame over the bound) sends what follows
 * on ZeroMQ again; what it still held for the engine is lost with it, as
 * a ZeroMQ connection's queue is; what the engine sent before it closed
 * the lane is read first, and before any ZeroMQ message that came after.
 *
 * Anyone in the network namespace can connect to an abstract socket, so
 * a connection is taken only from our user (or root) and only with the
 * token, and the loop never reads more than a bounded amount from one
 * before that, nor from the lane before the engine's marker.
 */
#define _GNU_SOURCE /* accept4 */
#define PDX_LOG_TOPIC "engine"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>

#include "agent/agent.h"
#include "common/lane_frame.h"
#include "common/log.h"
#include "common/mp.h"

/* A hello is a map of two short keys and 16 bytes: anything longer is
 * not one. */
#define HELLO_MAX_BYTES 64
/* Read from a lane per turn of the loop at most: the loop goes round to
 * everything else between (the read event fires again while more is
 * there). */
#define READ_TURN_BYTES (256 << 10)

/* One connection to the lane's socket: its token not yet checked
 * (pending), or the registered engine's lane. */
struct lane {
	struct agent *a;
	int fd;
	struct event *rev, *wev;
	struct evbuffer *in, *out;
	int busy; /* frames being handed on: freed after, when lost meanwhile */
	bool delivering; /* in lane_deliver(): not entered again */
	bool lost;
	bool draining; /* the engine's end read: only what we owe it goes */
};

static void lane_free(struct lane *l)
{
	if (l->rev)
		event_free(l->rev);
	if (l->wev)
		event_free(l->wev);
	if (l->in)
		evbuffer_free(l->in);
	if (l->out)
		evbuffer_free(l->out);
	if (l->fd >= 0)
		close(l->fd);
	free(l);
}

/* The lane ends: the agent's messages go on ZeroMQ again. */
static void lane_lost(struct lane *l, const char *why)
{
	struct engine_direct *d = &l->a->direct;

	if (d->draining == l)
		d->draining = NULL;
	if (d->lane == l) {
		log_info("the engine's direct lane closed (%s): its messages "
			 "go by ZeroMQ", why);
		d->lane = NULL;
		d->tx = d->rx = false;
	}
	for (int i = 0; i < ENGINE_DIRECT_PENDING; i++)
		if (d->pending[i] == l)
			d->pending[i] = NULL;
	l->lost = true;
	if (!l->busy)
		lane_free(l);
}

/* Sends what the lane still holds; false when the lane broke. */
static bool lane_flush(struct lane *l)
{
	while (evbuffer_get_length(l->out)) {
		int n = evbuffer_write(l->out, l->fd);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			event_add(l->wev, NULL);
			return true;
		}
		if (n <= 0)
			return false;
	}
	event_del(l->wev);
	return true;
}

/* The engine reads no more (it closed the lane): what we say goes on
 * ZeroMQ from now on, and the lane is still read to its end, where what
 * the engine sent before is. */
static void lane_stop_sending(struct lane *l, const char *why)
{
	struct engine_direct *d = &l->a->direct;

	if (d->lane == l && d->tx)
		log_info("the engine's direct lane takes no more (%s): its "
			 "messages go by ZeroMQ", why);
	if (d->lane == l)
		d->tx = false;
	evbuffer_drain(l->out, evbuffer_get_length(l->out));
	event_del(l->wev);
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
	struct lane *l = arg;

	if (!lane_flush(l)) {
		if (l->draining)
			lane_lost(l, strerror(errno));
		else
			lane_stop_sending(l, strerror(errno));
	} else if (l->draining && !evbuffer_get_length(l->out)) {
		lane_lost(l, "the engine's end, and what we owed it sent");
	}
}

/* One frame out: written at once when nothing waits before it (the
 * common case, no loop turn in between), else queued behind. */
static int lane_write(struct lane *l, const void *buf, size_t len)
{
	uint8_t hdr[PDX_LANE_HDR];
	struct iovec iov[2] = {{hdr, sizeof(hdr)}, {(void *)buf, len}};
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
	ssize_t n = 0;

	pdx_lane_hdr_put(hdr, (uint32_t)len);
	if (evbuffer_get_length(l->out) == 0) {
		do
			n = sendmsg(l->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		while (n < 0 && errno == EINTR);
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return -1;
		if (n < 0)
			n = 0;
		if ((size_t)n == sizeof(hdr) + len)
			return 0;
	}
	if ((size_t)n < sizeof(hdr) &&
	    evbuffer_add(l->out, hdr + n, sizeof(hdr) - (size_t)n))
		return -1;
	n = (size_t)n > sizeof(hdr) ? n - (ssize_t)sizeof(hdr) : 0;
	if (evbuffer_add(l->out, (const uint8_t *)buf + n, len - (size_t)n))
		return -1;
	return lane_flush(l) ? 0 : -1;
}

int engine_send_frame(struct agent *a, const void *id, size_t id_len,
		      const void *buf, size_t len)
{
	struct engine_direct *d = &a->direct;

	if (d->lane && d->tx && id_len == d->id_len &&
	    memcmp(id, d->id, id_len) == 0) {
		if (lane_write(d->lane, buf, len) == 0)
			return 0;
		lane_stop_sending(d->lane, strerror(errno));
	}
	return agent_zsend(a->engine_sock, id, id_len, buf, len);
}

/* The next frame in the lane's input, pulled up, its body at *body:
 * pdx_lane_frame_len()'s answer (the whole frame's bytes, 0 while it is
 * not whole, -1 over max). */
static int64_t frame_peek(struct lane *l, uint32_t max, uint8_t **body)
{
	uint8_t hdr[PDX_LANE_HDR] = {0};
	size_t have = evbuffer_get_length(l->in);
	int64_t n;

	evbuffer_copyout(l->in, hdr, sizeof(hdr));
	n = pdx_lane_frame_len(hdr, have, max);
	if (n > 0)
		*body = evbuffer_pullup(l->in, n) + PDX_LANE_HDR;
	return n;
}

/* The first frame: {"op": "direct", "token"} naming the offer made to
 * the registered engine. true: it is that engine's lane now. */
static bool hello(struct lane *l, const uint8_t *body, uint32_t len)
{
	struct engine_direct *d = &l->a->direct;
	msgpack_unpacked msg;
	const void *tok = NULL;
	size_t tok_len = 0;
	char op[16];
	bool ok;

	ok = !pdx_mp_parse(body, len, &msg, op, sizeof(op)) &&
	     !strcmp(op, "direct") &&
	     !pdx_mp_get_bin(&msg.data, "token", &tok, &tok_len) &&
	     d->offered && tok_len == sizeof(d->token);
	if (ok) { /* in constant time: a guess learns nothing from it */
		uint8_t diff = 0;

		for (size_t i = 0; i < tok_len; i++)
			diff |= ((const uint8_t *)tok)[i] ^ d->token[i];
		ok = diff == 0;
	}
	msgpack_unpacked_destroy(&msg);
	return ok;
}

/* A lane whose token checked: ours to send on, after our marker, the
 * last message on ZeroMQ. */
static void lane_take(struct lane *l)
{
	struct engine_direct *d = &l->a->direct;

	for (int i = 0; i < ENGINE_DIRECT_PENDING; i++)
		if (d->pending[i] == l)
			d->pending[i] = NULL;
	if (d->lane)
		lane_lost(d->lane, "replaced");
	d->offered = false; /* one lane per offer */
	if (agent_zsend(l->a->engine_sock, d->id, d->id_len, PDX_LANE_MARKER,
			PDX_LANE_MARKER_BYTES)) {
		lane_lost(l, "the marker could not go on ZeroMQ");
		return;
	}
	d->lane = l;
	d->tx = true;
	/* nothing is read until the engine's marker (its end included):
	 * before that it could only pile up here */
	event_del(l->rev);
	log_debug("the engine's direct lane is up");
}

/* Hands each whole frame the lane holds to the engine link, once the
 * engine's marker said nothing more comes on ZeroMQ. */
static void lane_deliver(struct lane *l)
{
	struct agent *a = l->a;
	struct engine_direct *d = &a->direct;
	uint8_t id[sizeof(d->id)];
	size_t id_len = d->id_len;
	uint8_t *body;
	int64_t n = 0;

	if (l->delivering)
		return; /* a frame handed on asked for it (a marker on the lane) */
	memcpy(id, d->id, id_len); /* a register may move d->id */
	l->busy++;
	l->delivering = true;
	while (!l->lost && d->lane == l && d->rx &&
	       (n = frame_peek(l, PDX_LANE_MAX_BYTES, &body)) > 0) {
		d->on_msg(a, id, id_len, body, (size_t)n - PDX_LANE_HDR);
		if (!l->lost)
			evbuffer_drain(l->in, (size_t)n);
	}
	if (!l->lost && n < 0)
		lane_lost(l, "a frame over the bound");
	l->delivering = false;
	l->busy--;
	if (l->lost && !l->busy)
		lane_free(l);
}

/* Reads what the lane has, up to want bytes: 2 all it had (maybe
 * nothing), 1 want bytes (more may be there), 0 its end (or a failure:
 * why in errno). */
static int lane_read(struct lane *l, size_t want)
{
	size_t got = 0;

	while (got < want) {
		int n = evbuffer_read(l->in, l->fd, (int)(want - got));

		if (n > 0) {
			got += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 2;
		if (n == 0)
			errno = 0;
		return 0;
	}
	return 1;
}

/* A connection not yet the lane: its first frame, a short one, must be
 * the hello with the token offered. */
static void check_hello(struct lane *l)
{
	size_t have = evbuffer_get_length(l->in);
	int more = lane_read(l, PDX_LANE_HDR + HELLO_MAX_BYTES - have);
	uint8_t *body;
	int64_t n = frame_peek(l, HELLO_MAX_BYTES, &body);

	if (n > 0 && hello(l, body, (uint32_t)(n - PDX_LANE_HDR))) {
		evbuffer_drain(l->in, (size_t)n);
		lane_take(l);
	} else if (n || !more) {
		if (n || evbuffer_get_length(l->in))
			log_warn("a connection to the direct lane without the "
				 "token offered: closed");
		lane_lost(l, "refused");
	}
}

/* The engine's end of the lane came (after what it sent, delivered):
 * what we still owe it goes first, as it reads the lane to its end
 * (docs/protocol.md: leaving a lane); the rest on ZeroMQ. */
static void lane_ended(struct lane *l, int err)
{
	struct engine_direct *d = &l->a->direct;

	if (l->lost)
		return;
	if (err || !evbuffer_get_length(l->out) || d->lane != l) {
		lane_lost(l, err ? strerror(err) : "the engine closed it");
		return;
	}
	log_info("the engine's direct lane closed (the engine's end): what "
		 "it was owed goes first, then its messages by ZeroMQ");
	d->lane = NULL;
	d->tx = d->rx = false;
	event_del(l->rev);
	if (d->draining)
		lane_lost(d->draining, "another drained");
	d->draining = l;
	l->draining = true;
	event_add(l->wev, NULL);
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
	struct lane *l = arg;
	struct engine_direct *d = &l->a->direct;

	l->busy++;
	if (d->lane != l) {
		check_hello(l);
	} else if (!lane_read(l, READ_TURN_BYTES)) {
		int err = errno;

		lane_deliver(l); /* what the engine sent before it closed */
		lane_ended(l, err);
	} else {
		lane_deliver(l);
	}
	l->busy--;
	if (l->lost) {
		if (!l->busy)
			lane_free(l);
		return;
	}
	l->a->settle(l->a); /* what the messages started */
}

static void on_accept(evutil_socket_t fd, short what, void *arg)
{
	struct agent *a = arg;
	struct engine_direct *d = &a->direct;
	struct lane *l;
	int c = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	struct ucred who;
	socklen_t who_len = sizeof(who);

	if (c < 0)
		return;
	/* the engine link's ipc path is ours alone (0600): so is the lane */
	if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &who, &who_len) ||
	    (who.uid != geteuid() && who.uid != 0)) {
		log_warn("a connection to the direct lane from another user "
			 "(uid %d): closed", (int)who.uid);
		close(c);
		return;
	}
	l = calloc(1, sizeof(*l));
	if (!l) {
		close(c);
		return;
	}
	l->a = a;
	l->fd = c;
	l->in = evbuffer_new();
	l->out = evbuffer_new();
	l->rev = event_new(a->base, c, EV_READ | EV_PERSIST, on_read, l);
	l->wev = event_new(a->base, c, EV_WRITE, on_writable, l);
	if (!l->in || !l->out || !l->rev || !l->wev ||
	    event_add(l->rev, NULL)) {
		lane_free(l);
		return;
	}
	/* a few at once; the oldest unchecked one makes room */
	if (d->pending[0])
		lane_lost(d->pending[0], "too many unchecked connections");
	memmove(d->pending, d->pending + 1,
		sizeof(d->pending) - sizeof(d->pending[0]));
	d->pending[ENGINE_DIRECT_PENDING - 1] = l;
}

int engine_direct_listen(struct agent *a, engine_msg_fn on_msg)
{
	struct engine_direct *d = &a->direct;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	uint32_t r;
	socklen_t len;

	d->on_msg = on_msg;
	if (getrandom(&r, sizeof(r), 0) != sizeof(r))
		return -1;
	/* the abstract namespace: nothing on disk to leave behind; the token
	 * keeps the lane to the engine that registered */
	snprintf(d->name, sizeof(d->name), "pdx-agent-%d-%08x", (int)getpid(),
		 r);
	memcpy(sa.sun_path + 1, d->name, strlen(d->name));
	len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
			  strlen(d->name));
	d->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (d->lfd < 0 || bind(d->lfd, (struct sockaddr *)&sa, len) ||
	    listen(d->lfd, 16)) {
		log_error("the engine link's direct lane: %s", strerror(errno));
		if (d->lfd >= 0)
			close(d->lfd);
		return -1;
	}
	d->lev = event_new(a->base, d->lfd, EV_READ | EV_PERSIST, on_accept, a);
	if (!d->lev || event_add(d->lev, NULL)) {
		if (d->lev)
			event_free(d->lev);
		d->lev = NULL;
		close(d->lfd);
		return -1;
	}
	return 0;
}

void engine_direct_offer(struct agent *a, const void *id, size_t id_len,
			 struct pdx_mp_msg *ans)
{
	struct engine_direct *d = &a->direct;

	if (!d->lev || id_len > sizeof(d->id))
		return; /* not listening (--engine-direct off) */
	if (d->lane && id_len == d->id_len && !memcmp(id, d->id, id_len))
		return; /* registered again on its lane: it stays */
	if (d->lane)
		lane_lost(d->lane, "another connection registered");
	if (getrandom(d->token, sizeof(d->token), 0) != sizeof(d->token))
		return;
	memcpy(d->id, id, id_len);
	d->id_len = id_len;
	d->offered = true;
	pdx_mp_msg_str(ans, "direct", d->name);
	pdx_mp_msg_bin(ans, "direct_token", d->token, sizeof(d->token));
}

void engine_direct_marker(struct agent *a, const void *id, size_t id_len)
{
	struct engine_direct *d = &a->direct;

	if (!d->lane || !d->tx || d->rx || id_len != d->id_len ||
	    memcmp(id, d->id, id_len)) {
		log_debug("a direct marker with no lane waiting for it: "
			  "ignored");
		return;
	}
	d->rx = true;
	if (event_add(d->lane->rev, NULL)) {
		lane_lost(d->lane, "its read event could not be armed");
		return;
	}
	lane_deliver(d->lane); /* what came before it */
}

void engine_direct_drop(struct agent *a, const void *id, size_t id_len)
{
	struct engine_direct *d = &a->direct;

	if (d->lane && id_len == d->id_len && !memcmp(id, d->id, id_len))
		lane_lost(d->lane, "another connection registered");
}

void engine_direct_catch_up(struct agent *a, const void *id, size_t id_len)
{
	struct engine_direct *d = &a->direct;
	struct lane *l = d->lane;

	if (!l || !d->rx || id_len != d->id_len || memcmp(id, d->id, id_len))
		return;
	l->busy++;
	for (int more = 1; more == 1 && !l->lost;) {
		int err;

		more = lane_read(l, READ_TURN_BYTES);
		err = errno;
		lane_deliver(l);
		if (!more)
			lane_ended(l, err);
	}
	l->busy--;
	if (l->lost && !l->busy)
		lane_free(l);
}

void engine_direct_stop(struct agent *a)
{
	struct engine_direct *d = &a->direct;

	for (int i = 0; i < ENGINE_DIRECT_PENDING; i++)
		if (d->pending[i])
			lane_lost(d->pending[i], "stopping");
	if (d->lane)
		lane_lost(d->lane, "the agent stops");
	if (d->draining)
		lane_lost(d->draining, "the agent stops");
	if (d->lev) {
		event_free(d->lev);
		close(d->lfd);
	}
	d->lev = NULL;
}
