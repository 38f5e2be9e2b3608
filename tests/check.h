/* Test assertions that print both operands, and a failure count. */
#ifndef PDX_TESTS_CHECK_H
#define PDX_TESTS_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_failures;

#define CHECK(cond)                                                            \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, \
				__LINE__, #cond);                              \
			check_failures++;                                      \
		}                                                              \
	} while (0)

#define CHECK_EQ(a, b)                                                         \
	do {                                                                   \
		long long _a = (long long)(a), _b = (long long)(b);            \
		if (_a != _b) {                                                \
			fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", \
				__FILE__, __LINE__, #a, #b, _a, _b);           \
			check_failures++;                                      \
		}                                                              \
	} while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                        \
	do {                                                                   \
		if (!strstr((hay), (needle))) {                                \
			fprintf(stderr, "%s:%d: \"%s\" lacks \"%s\"\n",        \
				__FILE__, __LINE__, (hay), (needle));          \
			check_failures++;                                      \
		}                                                              \
	} while (0)

#define CHECK_DONE()                                                           \
	do {                                                                   \
		if (check_failures)                                            \
			fprintf(stderr, "%d check(s) failed\n",                \
				check_failures);                               \
		return check_failures ? 1 : 0;                                 \
	} while (0)

#endif
