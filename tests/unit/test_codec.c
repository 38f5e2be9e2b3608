/* msgpack helpers and the layout codec: round trips, and refusals. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/layout_mp.h"
#include "common/mp.h"
#include "common/utf8.h"
#include "tests/check.h"

static struct pdx_kv_layer layers[3] = {
	{ .base = { { 0, 0 }, { 0, 4096 } }, .block_stride = 1024 },
	{ .base = { { 0, 8192 }, { 1, 0 } }, .block_stride = 1024 },
	{ .base = { { 1, 1ull << 40 }, { 1, 77 } }, .block_stride = 2048 },
};

static struct pdx_kv_layout sample(void)
{
	return (struct pdx_kv_layout){ .layers = 3, .tensors = 2, .blocks = 4,
				       .block_tokens = 16, .kv_heads = 2,
				       .head_dim = 16, .dtype_bytes = 2,
				       .order = PDX_KV_HND, .layer = layers };
}

static void layout_round_trip(void)
{
	struct pdx_kv_layout in = sample(), out;
	struct pdx_mp_out o;
	msgpack_unpacked msg;
	size_t off = 0;
	char err[128];

	pdx_mp_out_init(&o);
	pdx_layout_pack(&o.pk, &in);
	msgpack_unpacked_init(&msg);
	CHECK(msgpack_unpack_next(&msg, o.buf.data, o.buf.size, &off) ==
	      MSGPACK_UNPACK_SUCCESS);
	CHECK_EQ(pdx_layout_unpack(&msg.data, &out, err, sizeof(err)), PDX_OK);
	CHECK_EQ(out.layers, 3);
	CHECK_EQ(out.order, PDX_KV_HND);
	CHECK_EQ(out.block_tokens, 16);
	for (int i = 0; i < 3; i++) {
		CHECK_EQ(out.layer[i].block_stride, in.layer[i].block_stride);
		for (int t = 0; t < 2; t++) {
			CHECK_EQ(out.layer[i].base[t].region, in.layer[i].base[t].region);
			CHECK_EQ(out.layer[i].base[t].offset, in.layer[i].base[t].offset);
		}
	}
	CHECK_EQ(pdx_kv_layout_compat_hash(&in), pdx_kv_layout_compat_hash(&out));
	free(out.layer);
	msgpack_unpacked_destroy(&msg);
	pdx_mp_out_free(&o);
}

static void message_round_trip(void)
{
	struct pdx_xfer_id id, back;
	uint32_t blocks[] = { 1, 2, 4000000000u }, *got = NULL;
	struct pdx_mp_out o;
	msgpack_unpacked msg;
	char op[16], s[8];
	uint64_t u;
	int64_t i;
	size_t n = 0;

	pdx_xfer_id_random(&id);
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, 5);
	pdx_mp_kv_str(&o.pk, "op", "want");
	pdx_mp_kv_xfer(&o.pk, "xfer", &id);
	pdx_mp_kv_u32s(&o.pk, "blocks", blocks, 3);
	pdx_mp_kv_u64(&o.pk, "skip", 1ull << 33);
	pdx_mp_kv_i64(&o.pk, "status", -101);
	CHECK_EQ(pdx_mp_parse(o.buf.data, o.buf.size, &msg, op, sizeof(op)), 0);
	CHECK_STR_CONTAINS(op, "want");
	CHECK_EQ(pdx_mp_get_xfer(&msg.data, "xfer", &back), 0);
	CHECK(memcmp(id.b, back.b, 16) == 0);
	CHECK_EQ(pdx_mp_get_u32s(&msg.data, "blocks", 10, &got, &n), 0);
	CHECK_EQ(n, 3);
	CHECK_EQ(got ? got[2] : 0, 4000000000u);
	free(got);
	CHECK_EQ(pdx_mp_get_u32s(&msg.data, "blocks", 2, &got, &n), -1);
	CHECK_EQ(pdx_mp_get_u64(&msg.data, "skip", &u), 0);
	CHECK_EQ(u, 1ull << 33);
	CHECK_EQ(pdx_mp_get_i64(&msg.data, "status", &i), 0);
	CHECK_EQ(i, -101);
	CHECK_EQ(pdx_mp_get_u64(&msg.data, "status", &u), -1);
	CHECK_EQ(pdx_mp_get_str(&msg.data, "op", s, 4), -1); /* too long */
	CHECK_EQ(pdx_mp_get_u64(&msg.data, "missing", &u), -1);
	msgpack_unpacked_destroy(&msg);

	/* Not a map, trailing bytes, truncated: all refused. */
	CHECK_EQ(pdx_mp_parse("\x93\x01\x02\x03", 4, &msg, op, sizeof(op)), -1);
	msgpack_unpacked_destroy(&msg);
	CHECK_EQ(pdx_mp_parse(o.buf.data, o.buf.size - 1, &msg, op, sizeof(op)), -1);
	msgpack_unpacked_destroy(&msg);
	{
		char *more = malloc(o.buf.size + 1);

		memcpy(more, o.buf.data, o.buf.size);
		more[o.buf.size] = 0;
		CHECK_EQ(pdx_mp_parse(more, o.buf.size + 1, &msg, op, sizeof(op)), -1);
		msgpack_unpacked_destroy(&msg);
		free(more);
	}
	pdx_mp_out_free(&o);
}

static void layout_checks(void)
{
	struct pdx_kv_layout l = sample(), m = sample();
	uint64_t sizes[2] = { 8192 + 4 * 1024, (1ull << 40) + 4 * 2048 };
	char err[256];

	CHECK_EQ(pdx_kv_layout_block_bytes(&l), 16 * 2 * 16 * 2);
	CHECK_EQ(pdx_kv_layout_check(&l, sizes, 2, err, sizeof(err)), PDX_OK);
	sizes[0] -= 1;
	CHECK_EQ(pdx_kv_layout_check(&l, sizes, 2, err, sizeof(err)), PDX_ERANGE);
	CHECK_STR_CONTAINS(err, "layer 1 tensor 0");
	CHECK_EQ(pdx_kv_layout_check(&l, sizes, 1, err, sizeof(err)), PDX_ERANGE);
	l.tensors = 3;
	CHECK_EQ(pdx_kv_layout_check(&l, sizes, 2, err, sizeof(err)), PDX_EINVAL);
	l = sample();
	l.layer = NULL;
	CHECK_EQ(pdx_kv_layout_check(&l, sizes, 2, err, sizeof(err)), PDX_EINVAL);

	/* tensors sharing bytes (blocks of 1024 bytes, 4 of them) */
	{
		static const struct {
			uint64_t stride, v; /* layer 0: K at 0, V at v */
			pdx_status_t want;
		} c[] = {
		    {1024, 0, PDX_ERANGE},    /* K and V at one base */
		    {1024, 4095, PDX_ERANGE}, /* V's block 0 in K's 3 */
		    {1024, 4096, PDX_OK},     /* V right after K */
		    {2048, 1024, PDX_OK},     /* interleaved, K V K V */
		    {2048, 1000, PDX_ERANGE}, /* interleaved, one byte short */
		    {2048, 2048 + 1024, PDX_OK},
		    {2048, 6 * 2048 + 1024, PDX_OK}, /* past K's last block */
		};
		struct pdx_kv_layer saved = layers[0];

		for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
			l = sample();
			layers[0].block_stride = c[i].stride;
			layers[0].base[1] = (struct pdx_kv_ref){0, c[i].v};
			sizes[0] = 1ull << 20;
			err[0] = '\0';
			CHECK_EQ(pdx_kv_layout_check(&l, sizes, 2, err, sizeof(err)),
				 c[i].want);
			if (c[i].want)
				CHECK_STR_CONTAINS(err, "layer 0 tensor 0, layer 0 "
							"tensor 1): their blocks overlap");
		}
		layers[0] = saved;
	}

	l = sample();
	CHECK_EQ(pdx_kv_layout_diff(&l, &m, err, sizeof(err)), 0);
	m.blocks = 99; /* each side's own */
	CHECK_EQ(pdx_kv_layout_diff(&l, &m, err, sizeof(err)), 0);
	CHECK_EQ(pdx_kv_layout_compat_hash(&l), pdx_kv_layout_compat_hash(&m));
	m.head_dim = 8;
	m.order = PDX_KV_NHD;
	CHECK_EQ(pdx_kv_layout_diff(&l, &m, err, sizeof(err)), 1);
	CHECK_STR_CONTAINS(err, "head_dim 16 != 8");
	CHECK_STR_CONTAINS(err, "order");
	CHECK(pdx_kv_layout_compat_hash(&l) != pdx_kv_layout_compat_hash(&m));
}

/* A few bytes announcing a huge array or map are refused before msgpack-c
 * allocates room for its elements (found by fuzzing: a 5-byte frame made
 * it ask for 96 GiB). */
static void container_bombs(void)
{
	static const struct {
		const char *bytes;
		size_t len;
		int ok;
	} c[] = {
	    {"\x81\xa2op\xa1x", 6, 0},	     /* {"op": "x"} */
	    {"\x90", 1, 0},		     /* [] */
	    {"\x92\xc0\xd4\x01\x02", 5, 0},  /* [nil, fixext1] */
	    {"\xdd\xff\xff\xff\xff", 5, -1}, /* array of 2^32 - 1 */
	    {"\xdf\x00\x01\x00\x00", 5, -1}, /* map of 65536 */
	    {"\x92\x01", 2, -1},	     /* 2 announced, 1 there */
	    {"\x81\xa2op", 4, -1},	     /* key without a value */
	    {"\xdb\x7f\xff\xff\xff", 5, -1}, /* str past the end */
	    {"\xc1", 1, -1},		     /* never used */
	    {"\xcf\x00", 2, -1},	     /* uint64 cut short */
	};
	char deep[40];
	msgpack_unpacked msg;
	char op[8];

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++)
		CHECK_EQ(pdx_mp_check(c[i].bytes, c[i].len), c[i].ok);
	memset(deep, 0x91, sizeof(deep) - 1); /* [[[...[1]...]]] */
	deep[sizeof(deep) - 1] = 1;
	CHECK_EQ(pdx_mp_check(deep, sizeof(deep)), -1);
	CHECK_EQ(pdx_mp_check(deep + 8, sizeof(deep) - 8), 0);
	CHECK_EQ(pdx_mp_parse("\x81\xa2op\xdd\xff\xff\xff\xff", 9, &msg, op,
			      sizeof(op)),
		 -1);
	msgpack_unpacked_destroy(&msg);
}

/* Error messages quoting a client's bytes stay JSON-able. */
static void utf8_clean(void)
{
	char out[16];

	CHECK_STR_CONTAINS(pdx_utf8_clean("gpt-\xc3\xa9", out, sizeof(out)),
			   "gpt-\xc3\xa9");
	CHECK_EQ(strcmp(pdx_utf8_clean("a\xd0\x93\xd0", out, sizeof(out)),
			"a\xd0\x93?"),
		 0); /* cut mid-character */
	CHECK_EQ(strcmp(pdx_utf8_clean("\xed\xa0\x80!", out, sizeof(out)), "???"
									   "!"),
		 0); /* a surrogate */
	CHECK_EQ(
	    strcmp(pdx_utf8_clean("\xc0\xaf\xf5", out, sizeof(out)), "???"),
	    0); /* overlong, past U+10FFFF */
	CHECK_EQ(strcmp(pdx_utf8_clean("\xe2\x82\xac\xe2\x82\xac", out, 6),
			"\xe2\x82\xac"),
		 0); /* cut on a boundary */
}

/* A huge allocation fails (returns NULL) under ASan as it does without. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
	return "allocator_may_return_null=1";
}

/* n fields built by the counting builder, byte for byte what a map size
 * written by hand gives. */
static void msg_counts(uint32_t n)
{
	struct pdx_mp_msg m;
	struct pdx_mp_out o;
	char key[16];

	pdx_mp_msg_init(&m);
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, n);
	for (uint32_t i = 0; i < n; i++) {
		snprintf(key, sizeof(key), "k%u", i);
		pdx_mp_msg_u64(&m, key, i);
		pdx_mp_kv_u64(&o.pk, key, i);
	}
	CHECK_EQ(pdx_mp_msg_end(&m), 0);
	CHECK_EQ(m.buf.size, o.buf.size);
	CHECK(m.buf.size == o.buf.size &&
	      memcmp(m.buf.data, o.buf.data, o.buf.size) == 0);
	pdx_mp_msg_free(&m);
	pdx_mp_out_free(&o);
}

static void msg_builder(void)
{
	static const uint32_t blocks[] = { 7, 8, 1u << 31 };
	struct pdx_xfer_id id;
	struct pdx_mp_msg m;
	msgpack_unpacked msg;
	const msgpack_object *r;
	char op[16], s[16];
	uint64_t u;

	msg_counts(0);
	msg_counts(15);
	msg_counts(16);
	msg_counts(70000);

	/* nested maps, in a field and in an array, counted each */
	pdx_xfer_id_random(&id);
	pdx_mp_msg_init(&m);
	pdx_mp_msg_str(&m, "op", "hello");
	pdx_mp_msg_xfer(&m, "xfer", &id);
	pdx_mp_msg_map_open(&m, "staging");
	pdx_mp_msg_str(&m, "name", "/s");
	pdx_mp_msg_u64(&m, "slots", 4);
	pdx_mp_msg_map_close(&m);
	msgpack_pack_array(pdx_mp_msg_key(&m, "regions"), 2);
	for (int i = 0; i < 2; i++) {
		pdx_mp_msg_map_open(&m, NULL);
		pdx_mp_msg_u64(&m, "size", 100 + i);
		if (i)
			pdx_mp_msg_bool(&m, "cuda", true);
		pdx_mp_msg_map_close(&m);
	}
	pdx_mp_msg_u32s(&m, "blocks", blocks, 3);
	pdx_mp_msg_i64(&m, "status", -101);
	CHECK_EQ(pdx_mp_msg_end(&m), 0);
	CHECK_EQ(pdx_mp_parse(m.buf.data, m.buf.size, &msg, op, sizeof(op)), 0);
	CHECK_EQ(msg.data.via.map.size, 6);
	CHECK_EQ(pdx_mp_get_str(pdx_mp_get(&msg.data, "staging"), "name", s,
				sizeof(s)), 0);
	CHECK_EQ(pdx_mp_get_u64(pdx_mp_get(&msg.data, "staging"), "slots", &u),
		 0);
	CHECK_EQ(u, 4);
	r = pdx_mp_get(&msg.data, "regions");
	CHECK(r && r->type == MSGPACK_OBJECT_ARRAY && r->via.array.size == 2);
	if (r && r->type == MSGPACK_OBJECT_ARRAY && r->via.array.size == 2) {
		CHECK_EQ(r->via.array.ptr[0].via.map.size, 1);
		CHECK_EQ(r->via.array.ptr[1].via.map.size, 2);
		CHECK_EQ(pdx_mp_get_u64(&r->via.array.ptr[1], "size", &u), 0);
		CHECK_EQ(u, 101);
	}
	CHECK_EQ(pdx_mp_get_u64(&msg.data, "status", &u), -1); /* negative */
	msgpack_unpacked_destroy(&msg);
	pdx_mp_msg_free(&m);

	/* out of memory: reported at the end, whatever came after it */
	pdx_mp_msg_init(&m);
	pdx_mp_msg_str(&m, "op", "want");
	pdx_mp_msg_bin(&m, "huge", "x", (size_t)1 << 52);
	pdx_mp_msg_u64(&m, "skip", 1);
	CHECK_EQ(pdx_mp_msg_end(&m), -1);
	pdx_mp_msg_free(&m);

	/* a nested map left open, or one closed too many: refused */
	pdx_mp_msg_init(&m);
	pdx_mp_msg_map_open(&m, "a");
	CHECK_EQ(pdx_mp_msg_end(&m), -1);
	pdx_mp_msg_free(&m);
	pdx_mp_msg_init(&m);
	pdx_mp_msg_map_close(&m);
	CHECK_EQ(pdx_mp_msg_end(&m), -1);
	pdx_mp_msg_free(&m);
}

int main(void)
{
	layout_round_trip();
	message_round_trip();
	msg_builder();
	layout_checks();
	container_bombs();
	utf8_clean();
	CHECK_DONE();
}
