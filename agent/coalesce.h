/* Runs of blocks that are consecutive on both sides of a transfer, so one
 * data operation moves each run. */
#ifndef PDX_AGENT_COALESCE_H
#define PDX_AGENT_COALESCE_H

#include <stddef.h>
#include <stdint.h>

struct pdx_run {
	uint32_t index; /* position in the block lists */
	uint32_t src;   /* first source block id */
	uint32_t dst;   /* first destination block id */
	uint32_t count;
};

/* Splits src[i], dst[i] for i in [first, n) into runs of at most max_count
 * blocks (0 = no limit). Writes at most n - first runs to out; returns how
 * many. */
size_t pdx_coalesce(const uint32_t *src, const uint32_t *dst, size_t first,
		    size_t n, uint32_t max_count, struct pdx_run *out);

#endif
