/* Turns Nagle's algorithm off on an evhttp connection's socket.
 *
 * evhttp leaves it on. Then the tail of a large request body (an 8k-token
 * prompt is ~50 KB) and every small SSE chunk after the first wait until
 * the peer acknowledges the bytes before them, and the peer delays its
 * ACK by up to 40 ms: measured, +40 ms on every TTFT of 8k-token prompts
 * and inter-token gaps of 44 ms at p99. Every HTTP socket of pdx carries
 * latency-bound messages, so each sets TCP_NODELAY.
 *
 * The socket must exist: a server-side connection, or a client one after
 * evhttp_make_request() (which starts the connect). Best effort: a
 * socket that refuses (not TCP) is left as it is.
 */
#ifndef PDX_COMMON_NODELAY_H
#define PDX_COMMON_NODELAY_H

#include <event2/bufferevent.h>
#include <event2/http.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static inline void pdx_evhttp_nodelay(struct evhttp_connection *conn)
{
	struct bufferevent *bev = evhttp_connection_get_bufferevent(conn);
	evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
	int one = 1;

	if (fd >= 0)
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one,
				 sizeof(one));
}

#endif
