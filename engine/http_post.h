/* A fire-and-forget HTTP POST of a JSON body: the prefill side's early
 * callback to a proxy's /v1/metaserver (docs/engine.md). Its outcome is
 * only logged; the proxy does without it (it then uses the prefill's
 * answer).
 *
 * One thread (the engine's loop). The post is bounded by timeout_s and
 * is cancelled, its connection closed, by pdx_http_post_free().
 */
#ifndef PDX_ENGINE_HTTP_POST_H
#define PDX_ENGINE_HTTP_POST_H

#include <event2/event.h>
#include <stddef.h>

struct pdx_http_post;

/* Starts posting body to url (http://host[:port]/path); NULL with the
 * reason in err when the URL is bad or memory ran out. */
struct pdx_http_post *pdx_http_post_start(struct event_base *base,
					  const char *url, const char *body,
					  unsigned timeout_s, char *err,
					  size_t errlen);

/* Ends the post, done or not; NULL-safe. */
void pdx_http_post_free(struct pdx_http_post *p);

#endif
