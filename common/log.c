#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

enum pdx_log_level pdx_log_level = PDX_LOG_INFO;
static char log_prefix[32] = "pdx";

int pdx_log_set_level(const char *name)
{
	static const char *const names[] = { "error", "warn", "info", "debug" };

	for (int i = 0; i < 4; i++) {
		if (strcmp(name, names[i]) == 0) {
			pdx_log_level = (enum pdx_log_level)i;
			return 0;
		}
	}
	return -1;
}

void pdx_log_prefix(const char *prefix)
{
	snprintf(log_prefix, sizeof(log_prefix), "%s", prefix);
}

void pdx__log(enum pdx_log_level lvl, const char *topic, const char *fmt, ...)
{
	static const char tag[] = "EWID";
	struct timespec ts;
	char line[1024];
	va_list ap;

	clock_gettime(CLOCK_REALTIME, &ts);
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "%lld.%06ld %c %s %s: %s\n", (long long)ts.tv_sec,
		ts.tv_nsec / 1000, tag[lvl], log_prefix, topic, line);
}
