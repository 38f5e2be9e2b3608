/* tcp://HOST:PORT checked (tcp_addr.h). */
#include "common/tcp_addr.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

static bool port_ok(const char *p, bool bind)
{
	unsigned long v = 0;

	if (!*p || strlen(p) > 5 || (p[0] == '0' && p[1]))
		return false; /* ZeroMQ reads "00" as no port at all */
	for (; *p; p++) {
		if (*p < '0' || *p > '9')
			return false;
		v = v * 10 + (unsigned long)(*p - '0');
	}
	return (v >= 1 || bind) && v <= 65535;
}

bool pdx_tcp_addr_wildcard(const char *addr)
{
	return !strncmp(addr, "tcp://*:", 8) ||
	       !strncmp(addr, "tcp://0.0.0.0:", 14);
}

bool pdx_tcp_addr_ok(const char *addr, bool bind, char *why, size_t why_len)
{
	const char *host = addr + 6, *colon;
	size_t host_len;

	if (strncmp(addr, "tcp://", 6)) {
		snprintf(why, why_len, "'%s': want tcp://HOST:PORT", addr);
		return false;
	}
	colon = strrchr(host, ':');
	if (!colon) {
		snprintf(why, why_len, "'%s': no :PORT", addr);
		return false;
	}
	host_len = (size_t)(colon - host);
	if (host_len && (host[0] == '[' || memchr(host, ':', host_len))) {
		/* the sockets are made without ZMQ_IPV6 */
		snprintf(why, why_len, "'%s': IPv6 addresses are not "
			 "supported; give an IPv4 address or a name", addr);
		return false;
	}
	if (!host_len || memchr(host, '/', host_len)) {
		snprintf(why, why_len, "'%s': no host", addr);
		return false;
	}
	if (!bind && pdx_tcp_addr_wildcard(addr)) {
		snprintf(why, why_len, "'%s': nobody connects to %.*s (every "
			 "address: name one)", addr, (int)host_len, host);
		return false;
	}
	if (!port_ok(colon + 1, bind)) {
		snprintf(why, why_len, "'%s': the port is not a number from %d "
			 "to 65535", addr, bind ? 0 : 1);
		return false;
	}
	return true;
}

static bool interface_has(struct in_addr in)
{
	struct ifaddrs *all, *i;
	bool has = false;

	if (getifaddrs(&all))
		return false;
	for (i = all; i && !has; i = i->ifa_next)
		has = i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
		      ((struct sockaddr_in *)(void *)i->ifa_addr)
			      ->sin_addr.s_addr == in.s_addr;
	freeifaddrs(all);
	return has;
}

bool pdx_tcp_addr_host(const char *addr, char *host, size_t len)
{
	const char *h = addr + 6, *colon;
	size_t n;

	if (strncmp(addr, "tcp://", 6))
		return false;
	colon = strrchr(h, ':');
	n = colon ? (size_t)(colon - h) : 0;
	if (!n || n >= len)
		return false;
	memcpy(host, h, n);
	host[n] = 0;
	return true;
}

enum pdx_tcp_host pdx_tcp_addr_where(const char *addr)
{
	char h[64];
	struct in_addr in;

	if (!pdx_tcp_addr_host(addr, h, sizeof(h)))
		return PDX_TCP_HOST_NAME;
	if (!strcmp(h, "localhost"))
		return PDX_TCP_HOST_LOOPBACK;
	if (inet_pton(AF_INET, h, &in) != 1)
		return PDX_TCP_HOST_NAME;
	if ((ntohl(in.s_addr) >> 24) == 127)
		return PDX_TCP_HOST_LOOPBACK;
	return interface_has(in) ? PDX_TCP_HOST_LOCAL : PDX_TCP_HOST_REMOTE;
}
