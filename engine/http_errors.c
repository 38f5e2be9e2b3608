/* The error answers of the HTTP front (http_api.c's routes and
 * http_gen.c's), each counted as a rejected request. Its own file so that
 * the router and the completion routes both use it without calling each
 * other back. */
#define PDX_LOG_TOPIC "http"
#include "engine/http_internal.h"

#include "common/http_error.h"
#include "common/log.h"

void pdx__http_error(struct pdx_http_api *api, struct evhttp_request *req,
		     int status, const char *type, const char *message)
{
	api->p.metrics->req_rejected++;
	log_debug("%d %s", status, message);
	pdx_http_send_error(req, status, type, message);
}

void pdx__http_refuse(struct pdx_http_api *api, struct evhttp_request *req,
		      const struct pdx_oai_error *e)
{
	api->p.metrics->req_rejected++;
	log_debug("%d %s", e->status, e->message);
	pdx_http_send_json(req, e->status,
			   pdx_http_error_obj(e->status, e->type, e->param,
					      e->message));
}
