/* Whether an instance's host name resolves here (inst_host.h). */
#include "proxy/inst_host.h"

#include <errno.h>
#include <event2/bufferevent.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

static void unresolved(int gai_err, char *why, size_t len)
{
	snprintf(why, len, "its host name does not resolve here (%s)",
		 gai_strerror(gai_err));
}

bool pdx_inst_host_resolves(const struct pdx_inst *i, char *why, size_t len)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
				 .ai_socktype = SOCK_STREAM},
			*res = NULL;
	int rc = getaddrinfo(i->host, NULL, &hints, &res);

	if (res)
		freeaddrinfo(res);
	if (rc == 0)
		return true;
	unresolved(rc, why, len);
	return false;
}

bool pdx_conn_failure(struct evhttp_connection *conn, int e, char *why,
		      size_t len)
{
	struct bufferevent *bev =
	    conn ? evhttp_connection_get_bufferevent(conn) : NULL;
	int rc = bev ? bufferevent_socket_get_dns_error(bev) : 0;
	char host[160];

	if (rc) {
		unresolved(rc, host, sizeof(host));
		snprintf(why, len, "cannot connect: %s", host);
		return true;
	}
	if (e != ENOTCONN && e != EBADF)
		return false;
	snprintf(why, len,
		 "cannot connect (nothing listens there, or no route to it)");
	return true;
}
