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
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"

#define ACCEPT_PAUSE_MS 100
#define LISTEN_BACKLOG 128 /* evhttp's */

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

/* A socket bound to host:port as evhttp binds one (the first address
 * host has, SO_REUSEADDR, keep-alive), not listening; -1 with errno
 * (0: host has no address). */
static evutil_socket_t socket_bound(const char *host, uint16_t port)
{
	struct evutil_addrinfo hints = {.ai_family = AF_UNSPEC,
					.ai_socktype = SOCK_STREAM,
					.ai_flags = EVUTIL_AI_PASSIVE};
	struct evutil_addrinfo *ai;
	char service[8];
	evutil_socket_t fd;
	int one = 1, e;

	snprintf(service, sizeof(service), "%u", port);
	if (evutil_getaddrinfo(host, service, &hints, &ai)) {
		errno = 0;
		return -1;
	}
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    0);
	if (fd >= 0 &&
	    (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) ||
	     evutil_make_listen_socket_reuseable(fd) ||
	     bind(fd, ai->ai_addr, ai->ai_addrlen))) {
		e = errno;
		close(fd);
		errno = e;
		fd = -1;
	}
	e = errno;
	evutil_freeaddrinfo(ai);
	errno = e;
	return fd;
}

/* Why host:port cannot be listened on (e: errno, 0 for a host with no
 * address), and the option that picks another port when another process
 * has it. */
static void say_cannot(char *err, size_t errlen, const char *host,
		       unsigned port, int e, const char *option)
{
	if (e == EADDRINUSE)
		snprintf(err, errlen,
			 "cannot listen on %s:%u: %s (another process listens "
			 "there, another deployment's perhaps: pick another "
			 "%s)",
			 host, port, strerror(e), option);
	else
		snprintf(err, errlen, "cannot listen on %s:%u: %s", host, port,
			 e ? strerror(e) : "no such address here");
}

struct evhttp_bound_socket *pdx_http_bind(struct evhttp *http, const char *host,
					  uint16_t port, const char *option,
					  char *err, size_t errlen)
{
	struct evhttp_bound_socket *bs;
	evutil_socket_t fd = socket_bound(host, port);
	int e = errno;

	if (fd >= 0) {
		/* evhttp does not listen() (backlog 0) and enables it; a
		 * bound socket polls as hung up, so it is disabled before
		 * the loop runs */
		bs = evhttp_accept_socket_with_handle(http, fd);
		if (bs) {
			evconnlistener_disable(
			    evhttp_bound_socket_get_listener(bs));
			return bs;
		}
		close(fd);
		e = ENOMEM;
	}
	say_cannot(err, errlen, host, port, e, option);
	return NULL;
}

int pdx_http_listen_start(struct evhttp_bound_socket *bs, const char *option,
			  char *err, size_t errlen)
{
	evutil_socket_t fd = evhttp_bound_socket_get_fd(bs);
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char host[INET6_ADDRSTRLEN] = "?";
	int e;

	if (!listen(fd, LISTEN_BACKLOG)) {
		evconnlistener_enable(evhttp_bound_socket_get_listener(bs));
		return 0;
	}
	e = errno;
	if (!getsockname(fd, (struct sockaddr *)&ss, &len))
		evutil_inet_ntop(
		    ss.ss_family,
		    ss.ss_family == AF_INET6
			? (void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
			: (void *)&((struct sockaddr_in *)&ss)->sin_addr,
		    host, sizeof(host));
	say_cannot(err, errlen, host, pdx_http_bound_port(bs), e, option);
	return -1;
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
