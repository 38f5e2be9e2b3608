/* FNV-1a, 64 bits: a cheap, stable hash of bytes, fed in pieces (start
 * with h = PDX_FNV1A64_INIT and pass the running value back in). Stable
 * across processes and versions, so it may key what two programs share
 * (the proxy's prefix routing, the engine's tokenizer and cache salt). */
#ifndef PDX_COMMON_FNV_H
#define PDX_COMMON_FNV_H

#include <stddef.h>
#include <stdint.h>

#define PDX_FNV1A64_INIT 0xcbf29ce484222325ull

static inline uint64_t pdx_fnv1a64(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;

	for (size_t k = 0; k < n; k++)
		h = (h ^ b[k]) * 0x100000001b3ull;
	return h;
}

#endif
