/* A small logger: levels, a topic per file, lowercase messages to stderr.
 * Define PDX_LOG_TOPIC before including to name the file's topic. */
#ifndef PDX_COMMON_LOG_H
#define PDX_COMMON_LOG_H

enum pdx_log_level { PDX_LOG_ERROR, PDX_LOG_WARN, PDX_LOG_INFO, PDX_LOG_DEBUG };

#ifndef PDX_LOG_TOPIC
#define PDX_LOG_TOPIC "pdx"
#endif

extern enum pdx_log_level pdx_log_level;

/* Sets the level from a name ("error", "warn", "info", "debug"); -1 if
 * the name is unknown. */
int pdx_log_set_level(const char *name);
void pdx_log_prefix(const char *prefix); /* e.g. the process role */

void pdx__log(enum pdx_log_level lvl, const char *topic, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#define pdx_log(lvl, ...)                                                      \
	do {                                                                   \
		if ((lvl) <= pdx_log_level)                                    \
			pdx__log((lvl), PDX_LOG_TOPIC, __VA_ARGS__);           \
	} while (0)
#define log_error(...) pdx_log(PDX_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) pdx_log(PDX_LOG_WARN, __VA_ARGS__)
#define log_info(...) pdx_log(PDX_LOG_INFO, __VA_ARGS__)
#define log_debug(...) pdx_log(PDX_LOG_DEBUG, __VA_ARGS__)

#endif
