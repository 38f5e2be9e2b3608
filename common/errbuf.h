/* Writing a failure's reason into the caller's buffer (Redis anet style):
 * library-like code returns a status and says why here, never logs. */
#ifndef PDX_COMMON_ERRBUF_H
#define PDX_COMMON_ERRBUF_H

#include <stddef.h>

/* snprintf into err[errlen]; does nothing when err is NULL or errlen 0. */
void pdx_errbuf_set(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
