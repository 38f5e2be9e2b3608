/* pdx-xferbench's two ways out (xb_fail.h). */
#include "bench/xb_fail.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void xb_fail(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "pdx-xferbench: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	exit(1); /* the cleanup registry kills and unlinks at exit */
}

void xb_bad(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "pdx-xferbench: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n(try --help)\n");
	exit(2);
}
