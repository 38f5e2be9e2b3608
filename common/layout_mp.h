/* The KV layout as a msgpack map (docs/protocol.md, "register"). */
#ifndef PDX_COMMON_LAYOUT_MP_H
#define PDX_COMMON_LAYOUT_MP_H

#include <msgpack.h>

#include <pdx/layout.h>

void pdx_layout_pack(msgpack_packer *pk, const struct pdx_kv_layout *l);

/* Fills *l from a map; l->layer is malloc'd (free it). On failure writes the
 * reason to err and returns PDX_EINVAL with *l untouched. */
pdx_status_t pdx_layout_unpack(const msgpack_object *o, struct pdx_kv_layout *l,
			       char *err, size_t errlen);

#endif
