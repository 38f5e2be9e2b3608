/* The routes pdx's HTTP servers share (see http_route.h). */
#include "common/http_route.h"

#include <jansson.h>
#include <string.h>

#include "common/http_error.h"
#include "common/version.h"

const char *pdx_http_route_path(struct evhttp_request *req, char *buf,
				size_t len)
{
	const char *path =
	    evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
	size_t n = path ? strlen(path) : 0;

	if (!n)
		return "/";
	if (n == 1 || path[n - 1] != '/' || n > len)
		return path;
	memcpy(buf, path, n - 1);
	buf[n - 1] = '\0';
	return buf;
}

void pdx_http_send_version(struct evhttp_request *req)
{
	pdx_http_send_json(req, 200,
			   json_pack("{s:s}", "version", pdx_version()));
}
