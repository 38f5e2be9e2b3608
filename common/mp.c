#include "common/mp.h"

#include <stdlib.h>
#include <string.h>

void pdx_mp_out_init(struct pdx_mp_out *o)
{
	msgpack_sbuffer_init(&o->buf);
	msgpack_packer_init(&o->pk, &o->buf, msgpack_sbuffer_write);
}

void pdx_mp_out_free(struct pdx_mp_out *o)
{
	msgpack_sbuffer_destroy(&o->buf);
}

void pdx_mp_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);

	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

void pdx_mp_bin(msgpack_packer *pk, const void *p, size_t n)
{
	msgpack_pack_bin(pk, n);
	msgpack_pack_bin_body(pk, p, n);
}

void pdx_mp_kv_str(msgpack_packer *pk, const char *key, const char *val)
{
	pdx_mp_str(pk, key);
	pdx_mp_str(pk, val);
}

void pdx_mp_kv_u64(msgpack_packer *pk, const char *key, uint64_t val)
{
	pdx_mp_str(pk, key);
	msgpack_pack_uint64(pk, val);
}

void pdx_mp_kv_i64(msgpack_packer *pk, const char *key, int64_t val)
{
	pdx_mp_str(pk, key);
	msgpack_pack_int64(pk, val);
}

void pdx_mp_kv_bin(msgpack_packer *pk, const char *key, const void *p, size_t n)
{
	pdx_mp_str(pk, key);
	pdx_mp_bin(pk, p, n);
}

void pdx_mp_kv_xfer(msgpack_packer *pk, const char *key,
		    const struct pdx_xfer_id *x)
{
	pdx_mp_kv_bin(pk, key, x->b, sizeof(x->b));
}

void pdx_mp_kv_u32s(msgpack_packer *pk, const char *key, const uint32_t *v,
		    size_t n)
{
	pdx_mp_str(pk, key);
	msgpack_pack_array(pk, n);
	for (size_t i = 0; i < n; i++)
		msgpack_pack_uint32(pk, v[i]);
}

/* Every write of a message goes through here: the first that runs out of
 * memory marks it failed, and nothing is written after it. */
static int msg_write(void *data, const char *buf, size_t len)
{
	struct pdx_mp_msg *m = data;

	if (m->failed)
		return -1;
	if (msgpack_sbuffer_write(&m->buf, buf, len)) {
		m->failed = true;
		return -1;
	}
	return 0;
}

/* A map header whose size is not known yet: map32, rewritten on close. */
static void msg_open(struct pdx_mp_msg *m)
{
	static const char map32[5] = { (char)0xdf, 0, 0, 0, 0 };

	if (m->depth == PDX_MP_MSG_DEPTH) {
		m->failed = true;
		return;
	}
	m->open[m->depth].at = m->buf.size;
	m->open[m->depth].n = 0;
	m->depth++;
	msg_write(m, map32, sizeof(map32));
}

/* The innermost map's header, now that its fields are counted: the one
 * msgpack_pack_map() writes, the bytes after it moved up to meet it. */
static void msg_close(struct pdx_mp_msg *m)
{
	size_t at, hdr;
	uint8_t *b;
	uint32_t n;

	if (m->depth == 0) {
		m->failed = true;
		return;
	}
	m->depth--;
	if (m->failed)
		return;
	at = m->open[m->depth].at;
	n = m->open[m->depth].n;
	b = (uint8_t *)m->buf.data + at;
	if (n < 16) {
		b[0] = (uint8_t)(0x80 | n);
		hdr = 1;
	} else if (n < 65536) {
		b[0] = 0xde;
		b[1] = (uint8_t)(n >> 8);
		b[2] = (uint8_t)n;
		hdr = 3;
	} else {
		b[1] = (uint8_t)(n >> 24);
		b[2] = (uint8_t)(n >> 16);
		b[3] = (uint8_t)(n >> 8);
		b[4] = (uint8_t)n;
		return;
	}
	memmove(b + hdr, b + 5, m->buf.size - at - 5);
	m->buf.size -= 5 - hdr;
}

void pdx_mp_msg_init(struct pdx_mp_msg *m)
{
	memset(m, 0, sizeof(*m));
	msgpack_sbuffer_init(&m->buf);
	msgpack_packer_init(&m->pk, m, msg_write);
	msg_open(m);
}

int pdx_mp_msg_end(struct pdx_mp_msg *m)
{
	bool nested = m->depth != 1;

	msg_close(m);
	return m->failed || nested ? -1 : 0;
}

void pdx_mp_msg_free(struct pdx_mp_msg *m)
{
	msgpack_sbuffer_destroy(&m->buf);
}

msgpack_packer *pdx_mp_msg_key(struct pdx_mp_msg *m, const char *key)
{
	if (m->depth)
		m->open[m->depth - 1].n++;
	else
		m->failed = true;
	pdx_mp_str(&m->pk, key);
	return &m->pk;
}

void pdx_mp_msg_str(struct pdx_mp_msg *m, const char *key, const char *val)
{
	pdx_mp_str(pdx_mp_msg_key(m, key), val);
}

void pdx_mp_msg_u64(struct pdx_mp_msg *m, const char *key, uint64_t val)
{
	msgpack_pack_uint64(pdx_mp_msg_key(m, key), val);
}

void pdx_mp_msg_i64(struct pdx_mp_msg *m, const char *key, int64_t val)
{
	msgpack_pack_int64(pdx_mp_msg_key(m, key), val);
}

void pdx_mp_msg_bool(struct pdx_mp_msg *m, const char *key, bool val)
{
	msgpack_packer *pk = pdx_mp_msg_key(m, key);

	if (val)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
}

void pdx_mp_msg_bin(struct pdx_mp_msg *m, const char *key, const void *p,
		    size_t n)
{
	pdx_mp_bin(pdx_mp_msg_key(m, key), p, n);
}

void pdx_mp_msg_xfer(struct pdx_mp_msg *m, const char *key,
		     const struct pdx_xfer_id *x)
{
	pdx_mp_msg_bin(m, key, x->b, sizeof(x->b));
}

void pdx_mp_msg_u32s(struct pdx_mp_msg *m, const char *key, const uint32_t *v,
		     size_t n)
{
	msgpack_packer *pk = pdx_mp_msg_key(m, key);

	msgpack_pack_array(pk, n);
	for (size_t i = 0; i < n && !m->failed; i++)
		msgpack_pack_uint32(pk, v[i]);
}

void pdx_mp_msg_map_open(struct pdx_mp_msg *m, const char *key)
{
	if (key)
		pdx_mp_msg_key(m, key);
	msg_open(m);
}

void pdx_mp_msg_map_close(struct pdx_mp_msg *m)
{
	if (m->depth <= 1) /* the top map closes only at the end */
		m->failed = true;
	else
		msg_close(m);
}

/* The size of the header at p[0..left) and what follows it: *body bytes of
 * payload, *items elements. -1 when the header itself is cut short. */
static int mp_header(const uint8_t *p, size_t left, size_t *hdr, uint64_t *body,
		     uint64_t *items)
{
	/* 0xc0..0xdf: header bytes, 0 for a length-prefixed type */
	static const uint8_t fixed[32] = {
	    1,	0, 1, 1, 0, 0, 0, 0,  /* nil, -, false, true, bin, ext */
	    0,	0, 5, 9, 2, 3, 5, 9,  /* ext, float, uint */
	    2,	3, 5, 9, 3, 4, 6, 10, /* int, fixext */
	    18, 0, 0, 0, 0, 0, 0, 0,  /* fixext 16, str, array, map */
	};
	uint8_t b = p[0];
	size_t n = 0;
	uint64_t v = 0;

	*body = 0;
	*items = 0;
	*hdr = 1;
	if (b <= 0x7f || b >= 0xe0)
		return 0; /* fixint */
	if (b <= 0x8f) {
		*items = 2 * (uint64_t)(b & 0x0f);
		return 0;
	}
	if (b <= 0x9f) {
		*items = b & 0x0f;
		return 0;
	}
	if (b <= 0xbf) {
		*body = b & 0x1f;
		return 0;
	}
	if (b == 0xc1)
		return -1; /* never used */
	if (fixed[b - 0xc0]) {
		*hdr = fixed[b - 0xc0];
		return *hdr > left ? -1 : 0;
	}
	/* str, bin, ext, array, map: a big-endian length */
	switch (b) {
	case 0xc4:
	case 0xd9:
		n = 1;
		break;
	case 0xc5:
	case 0xda:
	case 0xdc:
	case 0xde:
		n = 2;
		break;
	case 0xc6:
	case 0xdb:
	case 0xdd:
	case 0xdf:
		n = 4;
		break;
	case 0xc7: /* ext 8: length, then type */
		n = 1;
		break;
	case 0xc8:
		n = 2;
		break;
	case 0xc9:
		n = 4;
		break;
	}
	*hdr = 1 + n + (b >= 0xc7 && b <= 0xc9);
	if (*hdr > left)
		return -1;
	for (size_t i = 0; i < n; i++)
		v = v << 8 | p[1 + i];
	if (b == 0xdc || b == 0xdd)
		*items = v;
	else if (b == 0xde || b == 0xdf)
		*items = 2 * v;
	else
		*body = v;
	return 0;
}

int pdx_mp_check(const void *buf, size_t len)
{
	/* objects still to read at each open level; level 0 is the root */
	uint64_t todo[PDX_MP_MAX_DEPTH + 1] = {1};
	const uint8_t *p = buf;
	size_t pos = 0;
	int depth = 0;

	while (depth >= 0) {
		uint64_t body, items;
		size_t hdr;

		if (todo[depth] == 0) {
			depth--;
			continue;
		}
		if (pos >= len ||
		    mp_header(p + pos, len - pos, &hdr, &body, &items))
			return -1;
		todo[depth]--;
		pos += hdr;
		if (body > len - pos)
			return -1;
		pos += (size_t)body;
		if (items) {
			if (items > len - pos || depth == PDX_MP_MAX_DEPTH)
				return -1;
			todo[++depth] = items;
		}
	}
	return 0;
}

int pdx_mp_parse(const void *buf, size_t len, msgpack_unpacked *msg, char *op,
		 size_t opsize)
{
	size_t off = 0;

	msgpack_unpacked_init(msg);
	if (pdx_mp_check(buf, len))
		return -1;
	if (msgpack_unpack_next(msg, buf, len, &off) != MSGPACK_UNPACK_SUCCESS)
		return -1;
	if (off != len || msg->data.type != MSGPACK_OBJECT_MAP)
		return -1;
	return pdx_mp_get_str(&msg->data, "op", op, opsize);
}

const msgpack_object *pdx_mp_get(const msgpack_object *map, const char *key)
{
	size_t klen = strlen(key);

	if (map->type != MSGPACK_OBJECT_MAP)
		return NULL;
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object_kv *kv = &map->via.map.ptr[i];

		if (kv->key.type == MSGPACK_OBJECT_STR &&
		    kv->key.via.str.size == klen &&
		    memcmp(kv->key.via.str.ptr, key, klen) == 0)
			return &kv->val;
	}
	return NULL;
}

int pdx_mp_obj_u64(const msgpack_object *o, uint64_t *out)
{
	if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return -1;
	*out = o->via.u64;
	return 0;
}

int pdx_mp_get_u64(const msgpack_object *map, const char *key, uint64_t *out)
{
	return pdx_mp_obj_u64(pdx_mp_get(map, key), out);
}

int pdx_mp_get_bool(const msgpack_object *map, const char *key, bool *out)
{
	const msgpack_object *o = pdx_mp_get(map, key);

	if (!o || o->type != MSGPACK_OBJECT_BOOLEAN)
		return -1;
	*out = o->via.boolean;
	return 0;
}

int pdx_mp_get_i64(const msgpack_object *map, const char *key, int64_t *out)
{
	const msgpack_object *o = pdx_mp_get(map, key);

	if (!o)
		return -1;
	if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
		*out = o->via.i64;
		return 0;
	}
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX) {
		*out = (int64_t)o->via.u64;
		return 0;
	}
	return -1;
}

int pdx_mp_get_str(const msgpack_object *map, const char *key, char *out,
		   size_t outlen)
{
	const msgpack_object *o = pdx_mp_get(map, key);

	if (!o || o->type != MSGPACK_OBJECT_STR || o->via.str.size >= outlen)
		return -1;
	memcpy(out, o->via.str.ptr, o->via.str.size);
	out[o->via.str.size] = '\0';
	return 0;
}

int pdx_mp_get_bin(const msgpack_object *map, const char *key, const void **p,
		   size_t *n)
{
	const msgpack_object *o = pdx_mp_get(map, key);

	if (!o || o->type != MSGPACK_OBJECT_BIN)
		return -1;
	*p = o->via.bin.ptr;
	*n = o->via.bin.size;
	return 0;
}

int pdx_mp_obj_xfer(const msgpack_object *o, struct pdx_xfer_id *out)
{
	if (!o || o->type != MSGPACK_OBJECT_BIN ||
	    o->via.bin.size != sizeof(out->b))
		return -1;
	memcpy(out->b, o->via.bin.ptr, sizeof(out->b));
	return 0;
}

int pdx_mp_get_xfer(const msgpack_object *map, const char *key,
		    struct pdx_xfer_id *out)
{
	return pdx_mp_obj_xfer(pdx_mp_get(map, key), out);
}

int pdx_mp_get_u32s(const msgpack_object *map, const char *key, size_t max,
		    uint32_t **out, size_t *n)
{
	const msgpack_object *o = pdx_mp_get(map, key);
	uint32_t *v;

	if (!o || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > max)
		return -1;
	v = malloc((o->via.array.size ? o->via.array.size : 1) * sizeof(*v));
	if (!v)
		return -1;
	for (uint32_t i = 0; i < o->via.array.size; i++) {
		uint64_t x;

		if (pdx_mp_obj_u64(&o->via.array.ptr[i], &x) || x > UINT32_MAX) {
			free(v);
			return -1;
		}
		v[i] = (uint32_t)x;
	}
	*out = v;
	*n = o->via.array.size;
	return 0;
}
