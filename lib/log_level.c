/* The library's own log level and prefix. libpdx carries its own copy of
 * common/log.c (not exported), so a program that logs with it too has two:
 * its own, and this one, set here. */
#include <pdx/engine.h>

#include <stdlib.h>

#include "common/log.h"

__attribute__((constructor)) static void log_init(void)
{
	const char *level = getenv("PDX_LOG_LEVEL");

	pdx_log_prefix("libpdx");
	if (level)
		pdx_log_set_level(level);
}

pdx_status_t pdx_engine_set_log_level(const char *name)
{
	if (!name || pdx_log_set_level(name))
		return PDX_EINVAL;
	return PDX_OK;
}
