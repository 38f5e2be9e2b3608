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

/* True when conn's last connect failed resolving its host name; why
 * says so (no second lookup: the connection kept the error). */
bool pdx_conn_unresolved(struct evhttp_connection *conn, char *why,
			 size_t len);

#endif
