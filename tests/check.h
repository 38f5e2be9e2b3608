/* Test assertions, one set for every C test. A failure is printed with
 * both operands where there are two, and counted; a check given a
 * sentence (what a user would notice) prints it passed or failed, so an
 * integration test's output reads as its specification:
 *
 *	CHECK(cond)                   CHECK(cond, "fmt", ...)
 *	CHECK_EQ(a, b)                CHECK_EQ(a, b, "fmt", ...)
 *	CHECK_STR_CONTAINS(hay, needle)
 *	CHECK_FAIL("fmt", ...)        a failure with its reason
 *	CHECK_DONE()                  returns 0 or 1 from main
 *
 * The sentence must be a string literal. check_failures is one counter
 * per program, even across files: the integration harness's own checks
 * (tests/integ/harness.c) count with the test's.
 */
#ifndef PDX_TESTS_CHECK_H
#define PDX_TESTS_CHECK_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* weak: every file that includes this defines it, the linker keeps one */
__attribute__((weak)) int check_failures;

/* fmt is " " for no sentence, else " " followed by it: the space keeps
 * an absent sentence from being an empty format, which -Wformat flags. */
__attribute__((format(printf, 6, 7))) static inline void
check__report(bool ok, const char *file, int line, const char *what,
	      const char *diff, const char *fmt, ...)
{
	va_list ap;

	if (!ok)
		check_failures++;
	if (fmt[1] == '\0') {
		if (!ok)
			printf("FAIL %s:%d: %s%s\n", file, line, what, diff);
		fflush(stdout);
		return;
	}
	printf("%s ", ok ? "ok  " : "FAIL");
	va_start(ap, fmt);
	vprintf(fmt + 1, ap);
	va_end(ap);
	if (!ok)
		printf(" (%s:%d: %s%s)", file, line, what, diff);
	printf("\n");
	fflush(stdout);
}

#define CHECK(cond, ...)                                                       \
	check__report(!!(cond), __FILE__, __LINE__, "CHECK(" #cond ")", "",   \
		      " " __VA_ARGS__)

#define CHECK_EQ(a, b, ...)                                                    \
	do {                                                                   \
		long long _a = (long long)(a), _b = (long long)(b);            \
		char _d[64];                                                   \
		snprintf(_d, sizeof(_d), ": %lld != %lld", _a, _b);            \
		check__report(_a == _b, __FILE__, __LINE__, #a " == " #b, _d, \
			      " " __VA_ARGS__);                                \
	} while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                        \
	do {                                                                   \
		const char *_h = (hay), *_n = (needle);                        \
		if (!strstr(_h, _n)) {                                         \
			printf("FAIL %s:%d: \"%s\" lacks \"%s\"\n", __FILE__,  \
			       __LINE__, _h, _n);                              \
			check_failures++;                                      \
		}                                                              \
	} while (0)

#define CHECK_FAIL(...)                                                        \
	check__report(false, __FILE__, __LINE__, "failed", "", " " __VA_ARGS__)

/* Prints how many checks failed; 0 when none did, else 1. */
static inline int check_status(void)
{
	if (check_failures)
		printf("# %d check(s) failed\n", check_failures);
	else
		printf("# all checks passed\n");
	fflush(stdout);
	return check_failures ? 1 : 0;
}

#define CHECK_DONE() return check_status()

#endif
