/* Whether an instance's host name resolves here (inst_host.h). */
#include "proxy/inst_host.h"

#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

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
	snprintf(why, len, "its host name does not resolve here (%s)",
		 gai_strerror(rc));
	return false;
}
