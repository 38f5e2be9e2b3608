/* The routes pdx's HTTP servers share (see http_route.h). */
#include "common/http_route.h"

#include <jansson.h>

#include "common/http_error.h"
#include "common/version.h"

void pdx_http_send_version(struct evhttp_request *req)
{
	pdx_http_send_json(req, 200,
			   json_pack("{s:s}", "version", pdx_version()));
}
