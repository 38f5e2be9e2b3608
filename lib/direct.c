/* The engine side of the direct lane's socket (docs/protocol.md, "The
 * direct lane"; the agent's side is agent/engine_direct.c): connect, frames
 * out and in. When to switch to it and back is link.c's.
 *
 * The engine's loop never waits for its agent, so a frame that does not
 * fit the socket now is kept here and sent by the next call that reads or
 * writes the link; meanwhile pdx_engine_fd() is armed for writing too.
 */
#define PDX_LOG_TOPIC "engine"

#include "lib/client.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/lane_frame.h"

/* Bytes kept unsent at most: past that the agent is stuck, as ZeroMQ's
 * high-water mark says on the link without a lane. */
#define OUT_MAX_BYTES (256u << 20)

/* The lane's fd in pdx_engine_fd(): readable once it is read (before,
 * what comes on it would wake the engine for nothing; its end still
 * does, as a hang-up), writable while bytes wait. */
static void watch(struct pdx_engine *e, int op)
{
	struct epoll_event ev = {.events = EPOLLET};

	if (e->lane.rx)
		ev.events |= EPOLLIN;
	if (e->lane.out_len > e->lane.out_off)
		ev.events |= EPOLLOUT;
	epoll_ctl(e->efd, op, e->lane.fd, &ev);
}

void pdx__direct_rearm(struct pdx_engine *e)
{
	if (e->lane.fd >= 0)
		watch(e, EPOLL_CTL_MOD);
}

/* Makes room for n more bytes at the end of buf (len used, *cap held). */
static int reserve(uint8_t **buf, size_t len, size_t *cap, size_t n)
{
	size_t want = *cap ? *cap : 4096;
	uint8_t *p;

	while (want < len + n)
		want *= 2;
	if (want == *cap)
		return 0;
	p = realloc(*buf, want);
	if (!p)
		return -1;
	*buf = p;
	*cap = want;
	return 0;
}

int pdx__direct_flush(struct pdx_engine *e)
{
	struct pdx__lane *l = &e->lane;
	bool was = l->out_len > l->out_off;

	while (l->out_len > l->out_off) {
		ssize_t n = send(l->fd, l->out + l->out_off,
				 l->out_len - l->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (n < 0)
			return -1;
		l->out_off += (size_t)n;
	}
	l->out_len = l->out_off = 0;
	if (was)
		watch(e, EPOLL_CTL_MOD);
	return 0;
}

int pdx__direct_write(struct pdx_engine *e, const void *buf, size_t len)
{
	struct pdx__lane *l = &e->lane;
	uint8_t hdr[PDX_LANE_HDR];
	struct iovec iov[2] = {{hdr, sizeof(hdr)}, {(void *)buf, len}};
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
	size_t sent = 0, total = sizeof(hdr) + len;
	bool was = l->out_len > l->out_off;

	if (len > PDX_LANE_MAX_BYTES)
		return -2;
	pdx_lane_hdr_put(hdr, (uint32_t)len);
	if (!was) {
		ssize_t n;

		do
			n = sendmsg(l->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		while (n < 0 && errno == EINTR);
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return -1;
		sent = n > 0 ? (size_t)n : 0;
		if (sent == total)
			return 0;
	}
	if (l->out_len - l->out_off + total - sent > OUT_MAX_BYTES)
		return sent ? -1 : -2; /* a frame begun must end, or the lane */
	if (l->out_off) { /* what went is gone: the buffer holds what waits */
		memmove(l->out, l->out + l->out_off, l->out_len - l->out_off);
		l->out_len -= l->out_off;
		l->out_off = 0;
	}
	if (reserve(&l->out, l->out_len, &l->out_cap, total - sent))
		return sent ? -1 : -2;
	if (sent < sizeof(hdr)) {
		memcpy(l->out + l->out_len, hdr + sent, sizeof(hdr) - sent);
		l->out_len += sizeof(hdr) - sent;
		sent = sizeof(hdr);
	}
	memcpy(l->out + l->out_len, (const uint8_t *)buf + sent - sizeof(hdr),
	       total - sent);
	l->out_len += total - sent;
	if (!was)
		watch(e, EPOLL_CTL_MOD);
	return pdx__direct_flush(e);
}

int pdx__direct_read(struct pdx_engine *e, const void **buf, size_t *len)
{
	struct pdx__lane *l = &e->lane;

	/* the frame handed out last is done with */
	if (l->in_off) {
		memmove(l->in, l->in + l->in_off, l->in_len - l->in_off);
		l->in_len -= l->in_off;
		l->in_off = 0;
	}
	for (;;) {
		ssize_t n;

		int64_t whole = pdx_lane_frame_len(l->in, l->in_len,
						   PDX_LANE_MAX_BYTES);

		if (whole < 0)
			return -1;
		if (whole > 0) {
			*buf = l->in + PDX_LANE_HDR;
			*len = (size_t)whole - PDX_LANE_HDR;
			l->in_off = (size_t)whole;
			return 1;
		}
		if (reserve(&l->in, l->in_len, &l->in_cap, 65536))
			return -1;
		n = recv(l->fd, l->in + l->in_len, l->in_cap - l->in_len,
			 MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (n <= 0)
			return -1;
		l->in_len += (size_t)n;
	}
}

int pdx__direct_open(struct pdx_engine *e, const char *name,
		     const void *token, size_t token_len)
{
	struct pdx__lane *l = &e->lane;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t n = strlen(name);
	struct pdx_mp_msg m;
	int rc;

	if (!n || n >= sizeof(sa.sun_path) - 1)
		return -1;
	memcpy(sa.sun_path + 1, name, n); /* abstract: sun_path[0] is 0 */
	l->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (l->fd < 0)
		return -1;
	/* a local connect completes at once, or fails */
	if (connect(l->fd, (struct sockaddr *)&sa,
		    (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n))) {
		close(l->fd);
		l->fd = -1;
		return -1;
	}
	watch(e, EPOLL_CTL_ADD);
	pdx_mp_msg_init(&m);
	pdx_mp_msg_str(&m, "op", "direct");
	pdx_mp_msg_bin(&m, "token", token, token_len);
	rc = pdx_mp_msg_end(&m) ? -1
				: pdx__direct_write(e, m.buf.data, m.buf.size);
	pdx_mp_msg_free(&m);
	if (rc)
		pdx__direct_close(e, false);
	return rc ? -1 : 0;
}

void pdx__direct_close(struct pdx_engine *e, bool forked)
{
	struct pdx__lane *l = &e->lane;

	if (l->fd >= 0) {
		/* a forked child's epoll instance and socket are its
		 * parent's too: removing the fd or shutting the socket down
		 * would do it for the parent. The parent's shutdown ends the
		 * lane for the agent even while a child still holds it. */
		if (!forked) {
			if (e->efd >= 0)
				epoll_ctl(e->efd, EPOLL_CTL_DEL, l->fd, NULL);
			shutdown(l->fd, SHUT_RDWR);
		}
		close(l->fd);
	}
	free(l->in);
	free(l->out);
	*l = (struct pdx__lane){.fd = -1};
}
