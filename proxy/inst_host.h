/* An instance's host, looked up as libevent's connect does (getaddrinfo,
 * blocking: evhttp resolves so at each connect). Its failure reached a
 * client as "cannot connect" and the health check's log as "no answer in
 * time": a name that does not resolve was never said (a new user's find,
 * going to two hosts). */
#ifndef PDX_PROXY_INST_HOST_H
#define PDX_PROXY_INST_HOST_H

#include <stdbool.h>
#include <stddef.h>

#include "proxy/pool.h"

/* True when i->host resolves; else false and why. */
bool pdx_inst_host_resolves(const struct pdx_inst *i, char *why, size_t len);

#endif
