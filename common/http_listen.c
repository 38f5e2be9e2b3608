/* The HTTP servers' listener and descriptor limit (see http_listen.h). */
#define PDX_LOG_TOPIC "http"
#include "common/http_listen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/clock.h"
#include "common/log.h"

#define ACCEPT_PAUSE_MS 100

static void on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
	evconnlistener_enable(arg);
}

static void on_accept_error(struct evconnlistener *lev, void *arg)
{
	static uint64_t logged_ns;
	static unsigned pauses;
	struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};
	int e = EVUTIL_SOCKET_ERROR();

	evconnlistener_disable(lev);
	if (event_base_once(evconnlistener_get_base(lev), -1, EV_TIMEOUT,
			    on_accept_resume, lev, &tv))
		evconnlistener_enable(lev);
	pauses++;
	if (pdx_once_a_second(&logged_ns)) {
		log_warn("accept: %s; not accepting for %d ms (%u pause(s) "
			 "since the last message)",
			 e == EMFILE || e == ENFILE ? "too many open files"
						    : strerror(e),
			 ACCEPT_PAUSE_MS, pauses);
		pauses = 0;
	}
}

struct evhttp_bound_socket *pdx_http_bind(struct evhttp *http,
					  const char *host, uint16_t port,
					  const char *option, char *err,
					  size_t errlen)
{
	struct evhttp_bound_socket *bs;
	int e;

	errno = 0;
	bs = evhttp_bind_socket_with_handle(http, host, port);
	if (bs)
		return bs;
	e = errno; /* bind()'s, or getaddrinfo() left it 0 */
	if (e == EADDRINUSE)
		snprintf(err, errlen,
			 "cannot listen on %s:%u: %s (another process listens "
			 "there, another deployment's perhaps: pick another "
			 "%s)",
			 host, port, strerror(e), option);
	else
		snprintf(err, errlen, "cannot listen on %s:%u: %s", host, port,
			 e ? strerror(e) : "no such address here");
	return NULL;
}

void pdx_http_listen_tune(struct evhttp_bound_socket *bs)
{
	int one = 1;

	(void)setsockopt(evhttp_bound_socket_get_fd(bs), IPPROTO_TCP,
			 TCP_NODELAY, &one, sizeof(one));
	evconnlistener_set_error_cb(evhttp_bound_socket_get_listener(bs),
				    on_accept_error);
}

uint16_t pdx_http_bound_port(struct evhttp_bound_socket *bs)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	evutil_socket_t fd = evhttp_bound_socket_get_fd(bs);

	if (getsockname(fd, (struct sockaddr *)&ss, &len))
		return 0;
	if (ss.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

void pdx_http_url(char *out, size_t len, const char *host, unsigned port,
		  const char *path)
{
	bool v6 = strchr(host, ':') != NULL;

	snprintf(out, len, "http://%s%s%s:%u%s", v6 ? "[" : "", host,
		 v6 ? "]" : "", port, path);
}

struct pdx_client_watch {
	struct event *ev;
	struct evhttp_connection *conn;
};

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_client_watch *w = arg;
	char byte;
	ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);

	if (n > 0)
		return;
	if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
		event_add(w->ev, NULL);
		return;
	}
	evhttp_connection_free(w->conn);
}

struct pdx_client_watch *pdx_client_watch_new(struct event_base *base,
					      struct evhttp_connection *conn)
{
	struct bufferevent *bev = evhttp_connection_get_bufferevent(conn);
	struct pdx_client_watch *w = calloc(1, sizeof(*w));

	if (!w)
		return NULL;
	w->conn = conn;
	w->ev =
	    event_new(base, bufferevent_getfd(bev), EV_READ, on_readable, w);
	if (!w->ev || event_add(w->ev, NULL)) {
		pdx_client_watch_free(w);
		return NULL;
	}
	return w;
}

void pdx_client_watch_free(struct pdx_client_watch *w)
{
	if (!w)
		return;
	if (w->ev)
		event_free(w->ev);
	free(w);
}

rlim_t pdx_nofile_raise(void)
{
	struct rlimit rl;
	rlim_t before;

	if (getrlimit(RLIMIT_NOFILE, &rl))
		return 1024;
	before = rl.rlim_cur;
	if (rl.rlim_cur != rl.rlim_max) {
		/* an unlimited hard limit still stops at fs.nr_open */
		rl.rlim_cur =
		    rl.rlim_max == RLIM_INFINITY ? 1u << 20 : rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl))
			rl.rlim_cur = before;
	}
	log_debug("file descriptors: limit %llu (was %llu, hard %llu)",
		  (unsigned long long)rl.rlim_cur, (unsigned long long)before,
		  (unsigned long long)rl.rlim_max);
	return rl.rlim_cur;
}
