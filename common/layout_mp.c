#include "common/layout_mp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_order.h"
#include "common/mp.h"

void pdx_layout_pack(msgpack_packer *pk, const struct pdx_kv_layout *l)
{
	msgpack_pack_map(pk, 10);
	pdx_mp_kv_u64(pk, "layers", l->layers);
	pdx_mp_kv_u64(pk, "tensors", l->tensors);
	pdx_mp_kv_u64(pk, "blocks", l->blocks);
	pdx_mp_kv_u64(pk, "block_tokens", l->block_tokens);
	pdx_mp_kv_u64(pk, "kv_heads", l->kv_heads);
	pdx_mp_kv_u64(pk, "head_dim", l->head_dim);
	pdx_mp_kv_u64(pk, "dtype_bytes", l->dtype_bytes);
	pdx_mp_kv_str(pk, "order", pdx_kv_order_name(l->order));
	pdx_mp_str(pk, "bases");
	msgpack_pack_array(pk, l->layers);
	for (uint32_t i = 0; i < l->layers; i++) {
		msgpack_pack_array(pk, l->tensors);
		for (uint32_t t = 0; t < l->tensors; t++) {
			msgpack_pack_array(pk, 2);
			msgpack_pack_uint32(pk, l->layer[i].base[t].region);
			msgpack_pack_uint64(pk, l->layer[i].base[t].offset);
		}
	}
	pdx_mp_str(pk, "strides");
	msgpack_pack_array(pk, l->layers);
	for (uint32_t i = 0; i < l->layers; i++)
		msgpack_pack_uint64(pk, l->layer[i].block_stride);
}

static int get_u32(const msgpack_object *o, const char *key, uint32_t *out)
{
	uint64_t v;

	if (pdx_mp_get_u64(o, key, &v) || v > UINT32_MAX)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static int unpack_base(const msgpack_object *o, uint32_t tensors,
		       struct pdx_kv_layer *ly)
{
	if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != tensors)
		return -1;
	for (uint32_t t = 0; t < tensors; t++) {
		const msgpack_object *p = &o->via.array.ptr[t];
		uint64_t region, off;

		if (p->type != MSGPACK_OBJECT_ARRAY || p->via.array.size != 2 ||
		    pdx_mp_obj_u64(&p->via.array.ptr[0], &region) ||
		    pdx_mp_obj_u64(&p->via.array.ptr[1], &off) ||
		    region > UINT32_MAX)
			return -1;
		ly->base[t].region = (uint32_t)region;
		ly->base[t].offset = off;
	}
	return 0;
}

pdx_status_t pdx_layout_unpack(const msgpack_object *o, struct pdx_kv_layout *l,
			       char *err, size_t errlen)
{
	struct pdx_kv_layout t = { 0 };
	const msgpack_object *bases, *strides;
	const struct {
		const char *name;
		uint32_t *v;
	} f[] = {
		{ "layers", &t.layers },	   { "tensors", &t.tensors },
		{ "blocks", &t.blocks },	   { "block_tokens", &t.block_tokens },
		{ "kv_heads", &t.kv_heads },	   { "head_dim", &t.head_dim },
		{ "dtype_bytes", &t.dtype_bytes },
	};
	char order[8];

	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
		if (get_u32(o, f[i].name, f[i].v)) {
			snprintf(err, errlen, "layout.%s: missing or not an "
				 "int below 2^32", f[i].name);
			return PDX_EINVAL;
		}
	}
	if (pdx_mp_get_str(o, "order", order, sizeof(order))) {
		snprintf(err, errlen, "layout.order: want \"NHD\" or \"HND\"");
		return PDX_EINVAL;
	}
	if (!pdx_kv_order_parse(order, &t.order)) {
		snprintf(err, errlen, "layout.order: \"%s\" is neither NHD nor HND",
			 order);
		return PDX_EINVAL;
	}
	if (t.layers == 0 || t.layers > PDX_MAX_LAYERS) {
		snprintf(err, errlen, "layout.layers: %u outside 1..%u", t.layers,
			 PDX_MAX_LAYERS);
		return PDX_EINVAL;
	}
	if (t.tensors != 1 && t.tensors != 2) {
		snprintf(err, errlen, "layout.tensors: %u is neither 1 (MLA) "
			 "nor 2 (K, V)", t.tensors);
		return PDX_EINVAL;
	}
	bases = pdx_mp_get(o, "bases");
	strides = pdx_mp_get(o, "strides");
	if (!bases || bases->type != MSGPACK_OBJECT_ARRAY ||
	    bases->via.array.size != t.layers) {
		snprintf(err, errlen, "layout.bases: want an array of %u "
			 "(layers) entries", t.layers);
		return PDX_EINVAL;
	}
	if (!strides || strides->type != MSGPACK_OBJECT_ARRAY ||
	    strides->via.array.size != t.layers) {
		snprintf(err, errlen, "layout.strides: want an array of %u "
			 "(layers) ints", t.layers);
		return PDX_EINVAL;
	}
	t.layer = calloc(t.layers, sizeof(*t.layer));
	if (!t.layer) {
		snprintf(err, errlen, "layout: out of memory");
		return PDX_ENOMEM;
	}
	for (uint32_t i = 0; i < t.layers; i++) {
		const char *bad = NULL;

		if (unpack_base(&bases->via.array.ptr[i], t.tensors, &t.layer[i]))
			bad = "bases";
		else if (pdx_mp_obj_u64(&strides->via.array.ptr[i],
					&t.layer[i].block_stride))
			bad = "strides";
		if (bad) {
			snprintf(err, errlen, "layout.%s[%u]: %s", bad, i,
				 bad[0] == 'b' ? "want [[region, offset]] per tensor"
					       : "want an int");
			free(t.layer);
			return PDX_EINVAL;
		}
	}
	*l = t;
	return PDX_OK;
}
