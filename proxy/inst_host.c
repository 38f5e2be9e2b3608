/* Whether an instance's host name resolves here (inst_host.h). */
#include "proxy/inst_host.h"

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

bool pdx_conn_unresolved(struct evhttp_connection *conn, char *why,
			 size_t len)
{
	struct bufferevent *bev =
	    conn ? evhttp_connection_get_bufferevent(conn) : NULL;
	int rc = bev ? bufferevent_socket_get_dns_error(bev) : 0;

	if (!rc)
		return false;
	unresolved(rc, why, len);
	return true;
}
