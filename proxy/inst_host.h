/* An instance's host name, as libevent's connect resolves it (blocking
 * getaddrinfo: evhttp is given no evdns base). Its failure reached a
 * client as "cannot connect" and the health check's log as "no answer in
 * time": a name that does not resolve was never said (a new user's find,
 * going to two hosts). */
#ifndef PDX_PROXY_INST_HOST_H
#define PDX_PROXY_INST_HOST_H

#include <event2/http.h>
#include <stdbool.h>
#include <stddef.h>

#include "proxy/pool.h"

/* True when i->host resolves; else false and why (a lookup of its own:
 * at start only). */
bool pdx_inst_host_resolves(const struct pdx_inst *i, char *why, size_t len);

/* True when conn's last connect surely failed, and why says how:
 * "cannot connect: its host name does not resolve here (…)" (no second
 * lookup: the connection kept the error) or "cannot connect (nothing
 * listens there, or no route to it)" (libevent leaves e, the errno,
 * ENOTCONN after a refused connect, EBADF after one with no route).
 * The health checks and the requests' legs say it alike (they said "no
 * response", "Bad file descriptor", "no answer in time"). */
bool pdx_conn_failure(struct evhttp_connection *conn, int e, char *why,
		      size_t len);

#endif
