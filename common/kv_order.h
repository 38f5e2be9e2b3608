/* A block's order by name, as the wire (register's layout.order), the
 * options (--order, --decode-order) and every message spell it. */
#ifndef PDX_COMMON_KV_ORDER_H
#define PDX_COMMON_KV_ORDER_H

#include <stdbool.h>
#include <string.h>

#include <pdx/layout.h>

/* "NHD", "HND", or "?" for a number that is neither */
static inline const char *pdx_kv_order_name(enum pdx_kv_order o)
{
	return o == PDX_KV_NHD ? "NHD" : o == PDX_KV_HND ? "HND" : "?";
}

/* The order a name spells into *o; false (and *o untouched) for any
 * other name. */
static inline bool pdx_kv_order_parse(const char *s, enum pdx_kv_order *o)
{
	if (strcmp(s, "NHD") == 0)
		*o = PDX_KV_NHD;
	else if (strcmp(s, "HND") == 0)
		*o = PDX_KV_HND;
	else
		return false;
	return true;
}

#endif
