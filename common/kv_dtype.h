/* A KV element type's name as libpdx takes it and the agent checks it
 * (pdx_engine_set_kv_dtype(), register's "kv_dtype"): 1 to
 * PDX_KV_DTYPE_MAX - 1 letters, digits, '_', '.' or '-'. */
#ifndef PDX_COMMON_KV_DTYPE_H
#define PDX_COMMON_KV_DTYPE_H

#include <stdbool.h>
#include <string.h>

#include <pdx/engine.h>

static inline bool pdx_kv_dtype_name_ok(const char *s)
{
	size_t n = strnlen(s, PDX_KV_DTYPE_MAX);

	return n && n < PDX_KV_DTYPE_MAX &&
	       strspn(s, "abcdefghijklmnopqrstuvwxyz"
			 "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == n;
}

#endif
