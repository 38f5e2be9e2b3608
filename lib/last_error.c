/* Why the last call on an engine failed, in words: a status says what
 * kind of failure, this says which (the argument, the agent's refusal,
 * the CUDA driver's error). Bindings put it into their exceptions.
 */
#define PDX_LOG_TOPIC "engine"
#include "lib/client.h"

#include <stdarg.h>
#include <stdio.h>

void pdx__why_clear(struct pdx_engine *e)
{
	e->why[0] = '\0';
}

pdx_status_t pdx__fail(struct pdx_engine *e, pdx_status_t st, const char *fmt,
		       ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(e->why, sizeof(e->why), fmt, ap);
	va_end(ap);
	return st;
}

pdx_status_t pdx__fail_log(struct pdx_engine *e, enum pdx_log_level lvl,
			   pdx_status_t st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(e->why, sizeof(e->why), fmt, ap);
	va_end(ap);
	pdx_log(lvl, "%s", e->why);
	return st;
}

const char *pdx_engine_last_error(const struct pdx_engine *e)
{
	return e ? e->why : "no engine (NULL)";
}
