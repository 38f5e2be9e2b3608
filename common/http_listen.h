/* What every HTTP server of pdx (engine, proxy) does to its listening
 * socket and its process: TCP_NODELAY once on the listener, a pause
 * instead of a busy loop when accept() fails, and the file-descriptor
 * limit raised.
 *
 * One thread (the server's loop). One listener per process.
 */
#ifndef PDX_COMMON_HTTP_LISTEN_H
#define PDX_COMMON_HTTP_LISTEN_H

#include <event2/http.h>
#include <sys/resource.h>

/* Accepted sockets inherit TCP_NODELAY from the listening one (Linux),
 * so it is set there once (see common/nodelay.h for why). When accept()
 * fails in a way retrying at once will not fix (above all EMFILE),
 * libevent would log and retry level-triggered for as long as it lasts;
 * the listener rests 100 ms instead, the clients wait in the backlog,
 * and a warning goes out at most once a second. */
void pdx_http_listen_tune(struct evhttp_bound_socket *bs);

/* Raises the soft limit on file descriptors to the hard one (a shell's
 * 1024 is fewer than the streams a server can run) and returns the
 * limit now (RLIM_INFINITY: none). */
rlim_t pdx_nofile_raise(void);

#endif
