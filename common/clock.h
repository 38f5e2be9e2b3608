/* Monotonic time in nanoseconds, comparable across processes of one host. */
#ifndef PDX_COMMON_CLOCK_H
#define PDX_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t pdx_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

#endif
