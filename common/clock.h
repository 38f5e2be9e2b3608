/* Monotonic time in nanoseconds, comparable across processes of one host. */
#ifndef PDX_COMMON_CLOCK_H
#define PDX_COMMON_CLOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t pdx_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* True at most once a second per *last_ns (0 at first: true), which it
 * sets then: a warning that a flood would repeat, said once a second. */
static inline bool pdx_once_a_second(uint64_t *last_ns)
{
	uint64_t now = pdx_now_ns();

	if (*last_ns && now - *last_ns < 1000000000ULL)
		return false;
	*last_ns = now;
	return true;
}

/* A warning a flood would repeat, said at most once a second with how
 * many were held back since: one per warning, zeroed at first. */
struct pdx_said {
	uint64_t last_ns;
	unsigned held;
};

/* True when the warning is to be said now, *held then how many were not
 * said since the last one (0: none); false: held back, and counted. */
static inline bool pdx_said_now(struct pdx_said *s, unsigned *held)
{
	if (!pdx_once_a_second(&s->last_ns)) {
		s->held++;
		return false;
	}
	*held = s->held;
	s->held = 0;
	return true;
}

#endif
