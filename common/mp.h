/* msgpack helpers: build maps with string keys, read fields by key.
 * Readers return 0 on success and -1 when the key is missing or has the
 * wrong type; they never allocate except pdx_mp_get_u32s(). */
#ifndef PDX_COMMON_MP_H
#define PDX_COMMON_MP_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/engine.h>

struct pdx_mp_out {
	msgpack_sbuffer buf;
	msgpack_packer pk;
};

void pdx_mp_out_init(struct pdx_mp_out *o);
void pdx_mp_out_free(struct pdx_mp_out *o);

/* A message being built: a map whose fields are counted as they are
 * written (no map size written by hand that can drift from the fields
 * below it), and whose every write is checked, so that one check at the
 * end reports a message that ran out of memory. Maps nest (a field whose
 * value is a map) up to PDX_MP_MSG_DEPTH; each is encoded as
 * msgpack_pack_map() would, smallest header first. */
#define PDX_MP_MSG_DEPTH 4

struct pdx_mp_msg {
	msgpack_sbuffer buf;
	msgpack_packer pk;
	bool failed; /* a write ran out of memory, or maps nest too deep */
	uint32_t depth;
	struct {
		size_t at;  /* its header's offset in buf */
		uint32_t n; /* fields written */
	} open[PDX_MP_MSG_DEPTH];
};

/* Starts a message: its top map is open. */
void pdx_mp_msg_init(struct pdx_mp_msg *m);
/* Closes the top map: 0, or -1 when a write failed or a nested map was
 * left open (the message is then unusable; free it). */
int pdx_mp_msg_end(struct pdx_mp_msg *m);
void pdx_mp_msg_free(struct pdx_mp_msg *m);
/* Writes key as the next field of the innermost open map and counts it;
 * the caller packs exactly one value with the packer returned. */
msgpack_packer *pdx_mp_msg_key(struct pdx_mp_msg *m, const char *key);
void pdx_mp_msg_str(struct pdx_mp_msg *m, const char *key, const char *val);
void pdx_mp_msg_u64(struct pdx_mp_msg *m, const char *key, uint64_t val);
void pdx_mp_msg_i64(struct pdx_mp_msg *m, const char *key, int64_t val);
void pdx_mp_msg_bool(struct pdx_mp_msg *m, const char *key, bool val);
void pdx_mp_msg_bin(struct pdx_mp_msg *m, const char *key, const void *p,
		    size_t n);
void pdx_mp_msg_xfer(struct pdx_mp_msg *m, const char *key,
		     const struct pdx_xfer_id *x);
void pdx_mp_msg_u32s(struct pdx_mp_msg *m, const char *key, const uint32_t *v,
		     size_t n);
/* Opens a map as a value: of the field key, or (key NULL) as the next
 * element of an array the caller packed; its fields follow, counted, until
 * pdx_mp_msg_map_close(). */
void pdx_mp_msg_map_open(struct pdx_mp_msg *m, const char *key);
void pdx_mp_msg_map_close(struct pdx_mp_msg *m);

void pdx_mp_str(msgpack_packer *pk, const char *s);
void pdx_mp_bin(msgpack_packer *pk, const void *p, size_t n);
void pdx_mp_kv_str(msgpack_packer *pk, const char *key, const char *val);
void pdx_mp_kv_u64(msgpack_packer *pk, const char *key, uint64_t val);
void pdx_mp_kv_i64(msgpack_packer *pk, const char *key, int64_t val);
void pdx_mp_kv_bin(msgpack_packer *pk, const char *key, const void *p, size_t n);
void pdx_mp_kv_xfer(msgpack_packer *pk, const char *key,
		    const struct pdx_xfer_id *x);
void pdx_mp_kv_u32s(msgpack_packer *pk, const char *key, const uint32_t *v,
		    size_t n);

/* Checks that buf holds msgpack whose every array and map announces no
 * more elements than bytes follow it (each element takes at least one), at
 * most PDX_MP_MAX_DEPTH deep. msgpack-c allocates a container's elements
 * up front, so without this a 5-byte frame announcing 2^32 elements makes
 * it allocate 96 GiB. 0 when sane, -1 otherwise; trailing bytes are
 * allowed. */
#define PDX_MP_MAX_DEPTH 32
int pdx_mp_check(const void *buf, size_t len);

/* Unpacks buf into *msg (whose zone the caller destroys with
 * msgpack_unpacked_destroy) and checks that it is a map with a str "op".
 * Writes the op into op[opsize]. Runs pdx_mp_check() first. */
int pdx_mp_parse(const void *buf, size_t len, msgpack_unpacked *msg,
		 char *op, size_t opsize);

const msgpack_object *pdx_mp_get(const msgpack_object *map, const char *key);
int pdx_mp_get_u64(const msgpack_object *map, const char *key, uint64_t *out);
int pdx_mp_get_i64(const msgpack_object *map, const char *key, int64_t *out);
/* -1 when key is missing or not a msgpack bool. */
int pdx_mp_get_bool(const msgpack_object *map, const char *key, bool *out);
int pdx_mp_get_str(const msgpack_object *map, const char *key, char *out,
		   size_t outlen);
int pdx_mp_get_bin(const msgpack_object *map, const char *key,
		   const void **p, size_t *n);
int pdx_mp_get_xfer(const msgpack_object *map, const char *key,
		    struct pdx_xfer_id *out);
int pdx_mp_obj_xfer(const msgpack_object *o, struct pdx_xfer_id *out);
int pdx_mp_obj_u64(const msgpack_object *o, uint64_t *out);
/* An array of at most max non-negative 32-bit ints; *out is malloc'd. */
int pdx_mp_get_u32s(const msgpack_object *map, const char *key, size_t max,
		    uint32_t **out, size_t *n);

#endif
