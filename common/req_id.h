/* A client's X-Request-Id, which pdx-proxy and pdx-engine keep (echoed
 * in the response head, the suffix of the response's "id", in their
 * logs) when it is usable: 1 to PDX_REQ_ID_MAX printable ASCII
 * characters, neither a quote nor a backslash. One rule for both: the
 * proxy forwards the id it kept, and an engine that refused it would
 * answer under an id of its own, so the head's id and the body's would
 * differ and the logs of one request would not meet (the proxy's limit
 * was 64, the engine's 128: an id between was replaced behind the proxy
 * only). Pure; any thread.
 */
#ifndef PDX_COMMON_REQ_ID_H
#define PDX_COMMON_REQ_ID_H

#include <ctype.h>
#include <stdbool.h>
#include <stddef.h>

#define PDX_REQ_ID_MAX 128

static inline bool pdx_req_id_usable(const char *s)
{
	size_t n = 0;

	for (; s[n]; n++)
		if (n == PDX_REQ_ID_MAX || !isgraph((unsigned char)s[n]) || s[n] == '"' ||
		    s[n] == '\\')
			return false;
	return n > 0;
}

#endif
