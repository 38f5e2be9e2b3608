/* tcp://HOST:PORT checked (tcp_addr.h). */
#include "common/tcp_addr.h"

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
