/* A ZeroMQ TCP endpoint as pdx's options take it: tcp://HOST:PORT, HOST a
 * name, an IPv4 address or * or 0.0.0.0 (bind: every interface; no IPv6: the
 * sockets are made without ZMQ_IPV6), PORT 1..65535 in decimal without
 * leading zeros (or 0 to bind: the kernel picks one). ZeroMQ
 * itself would take a port such as 99999 or -5 and bind another one,
 * leaving the address the agent gives its peers wrong, so options are
 * checked here first.
 *
 * Any thread. */
#ifndef PDX_COMMON_TCP_ADDR_H
#define PDX_COMMON_TCP_ADDR_H

#include <stdbool.h>
#include <stddef.h>

/* True when addr is such an endpoint (a wildcard host and port 0 only
 * when bind); else false, and why in why. */
bool pdx_tcp_addr_ok(const char *addr, bool bind, char *why, size_t why_len);

/* Whether addr's host is every interface: * or 0.0.0.0 (to bind only;
 * nobody reaches it). */
bool pdx_tcp_addr_wildcard(const char *addr);

/* addr's HOST into host (len bytes with its NUL): false when addr is no
 * tcp://HOST:PORT or HOST does not fit. */
bool pdx_tcp_addr_host(const char *addr, char *host, size_t len);

/* Where addr's host is, as far as its text says (a name is not
 * resolved: that may wait on DNS): a loopback address (127.0.0.0/8 or
 * "localhost"), an IPv4 address of one of this host's interfaces,
 * another IPv4 address, or a name. Reads the interfaces (getifaddrs). */
enum pdx_tcp_host {
	PDX_TCP_HOST_LOOPBACK,
	PDX_TCP_HOST_LOCAL,
	PDX_TCP_HOST_REMOTE,
	PDX_TCP_HOST_NAME,
};
enum pdx_tcp_host pdx_tcp_addr_where(const char *addr);

#endif
