/* What every HTTP server of pdx (engine, proxy) shares: TCP_NODELAY once
 * on the listener, a pause instead of a busy loop when accept() fails,
 * the port it got, the file-descriptor limit raised, and a watch that
 * notices a client leaving while its request is answered.
 *
 * One thread (the server's loop). One listener per process.
 */
#ifndef PDX_COMMON_HTTP_LISTEN_H
#define PDX_COMMON_HTTP_LISTEN_H

#include <event2/event.h>
#include <event2/http.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>

/* Binds host:port for http, as evhttp_bind_socket_with_handle() does,
 * but does not listen yet: a client's connect() is refused until
 * pdx_http_listen_start(), instead of being accepted and left without
 * an answer while the program gets ready, and another process on the
 * port is found at once. Says why it failed: err gets "cannot listen on
 * HOST:PORT: REASON" and, when another process has the port (two
 * deployments with the same defaults), which option picks another
 * (option, e.g. "--port"; 0 takes a free port where the program allows
 * it). NULL on failure. */
struct evhttp_bound_socket *pdx_http_bind(struct evhttp *http,
					  const char *host, uint16_t port,
					  const char *option, char *err,
					  size_t errlen);

/* Listens and accepts from now on; -1 with the reason in err, as
 * pdx_http_bind() says it. Another process may have taken the port
 * since the bind, if it bound it without listening as well (both with
 * SO_REUSEADDR, as every server does: Linux finds two such binds no
 * conflict) and listened first: two engines started at once. */
int pdx_http_listen_start(struct evhttp_bound_socket *bs,
			  const char *option, char *err, size_t errlen);

/* Accepted sockets inherit TCP_NODELAY from the listening one (Linux),
 * so it is set there once (see common/nodelay.h for why). When accept()
 * fails in a way retrying at once will not fix (above all EMFILE),
 * libevent would log and retry level-triggered for as long as it lasts;
 * the listener rests 100 ms instead, the clients wait in the backlog,
 * and a warning goes out at most once a second. */
void pdx_http_listen_tune(struct evhttp_bound_socket *bs);

/* The port the bound socket got (asked for 0: the kernel's choice); 0
 * when unknown. */
uint16_t pdx_http_bound_port(struct evhttp_bound_socket *bs);

#define PDX_HTTP_URL_MAX 320 /* a host name of 255 bytes, and a path */

/* "http://HOST:PORT" and path into out (truncated to len), an IPv6
 * address in brackets: a URL as pdx's options and logs give one. */
void pdx_http_url(char *out, size_t len, const char *host, unsigned port,
		  const char *path);

/* evhttp (2.1) does not read a connection while its request is being
 * answered, so it notices a client that left only when a write fails: a
 * request still queued or a response still being generated would run to
 * its end. The watch reads the socket instead: end of file or an error
 * means the client is gone, and the connection is freed, which runs its
 * close callback. Bytes (a pipelined request) end the watch. */
struct pdx_client_watch;

/* NULL when out of memory. */
struct pdx_client_watch *pdx_client_watch_new(struct event_base *base,
					      struct evhttp_connection *conn);

/* Stops and frees the watch; NULL-safe. */
void pdx_client_watch_free(struct pdx_client_watch *w);

/* Raises the soft limit on file descriptors to the hard one (a shell's
 * 1024 is fewer than the streams a server can run) and returns the
 * limit now (RLIM_INFINITY: none). */
rlim_t pdx_nofile_raise(void);

#endif
