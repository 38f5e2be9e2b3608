/* Noticing that this process did not run for a while (stopped, swapped
 * out, its container frozen, its host overloaded). A periodic liveness
 * check that then judged others by their silence would blame them for
 * its own: nothing could be heard while it did not run. Such a check
 * calls pdx_stall_check() at each tick; after a stall, the silences it
 * judges count from now. */
#ifndef PDX_COMMON_STALL_H
#define PDX_COMMON_STALL_H

#include <stdint.h>

/* How long since the previous tick (*last_ns) when that is over
 * limit_ns: the tick ran that late, we stalled. Else 0 (also at the
 * first tick). *last_ns becomes now. */
static inline uint64_t pdx_stall_check(uint64_t *last_ns, uint64_t now,
				       uint64_t limit_ns)
{
	uint64_t gap = *last_ns ? now - *last_ns : 0;

	*last_ns = now;
	return gap > limit_ns ? gap : 0;
}

#endif
