#include "agent/coalesce.h"

size_t pdx_coalesce(const uint32_t *src, const uint32_t *dst, size_t first,
		    size_t n, uint32_t max_count, struct pdx_run *out)
{
	size_t runs = 0;

	for (size_t i = first; i < n; i++) {
		struct pdx_run *r = runs ? &out[runs - 1] : NULL;

		if (r && src[i] == r->src + r->count &&
		    dst[i] == r->dst + r->count &&
		    (max_count == 0 || r->count < max_count)) {
			r->count++;
			continue;
		}
		out[runs++] = (struct pdx_run){ .index = (uint32_t)i,
						.src = src[i],
						.dst = dst[i],
						.count = 1 };
	}
	return runs;
}
