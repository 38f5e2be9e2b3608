/* The KV layout as the handshake carries it (common/layout_mp.c,
 * lib/layout.c): a msgpack map decoded with pdx_layout_unpack(), then
 * screened by pdx_mp_check() as every frame is, checked against regions
 * (sizes from the input), hashed and compared
 * with a reference layout. A layout that decodes must pack and decode
 * again to the same thing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdx/layout.h>

#include "common/layout_mp.h"
#include "common/mp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void same(const struct pdx_kv_layout *a, const struct pdx_kv_layout *b)
{
	char diff[256];

	if (pdx_kv_layout_diff(a, b, diff, sizeof(diff)) ||
	    pdx_kv_layout_compat_hash(a) != pdx_kv_layout_compat_hash(b) ||
	    a->blocks != b->blocks ||
	    memcmp(a->layer, b->layer, a->layers * sizeof(*a->layer)))
		abort();
}

static void roundtrip(const struct pdx_kv_layout *l)
{
	struct pdx_kv_layout back;
	struct pdx_mp_out o;
	msgpack_unpacked msg;
	size_t off = 0;
	char err[256];

	pdx_mp_out_init(&o);
	pdx_layout_pack(&o.pk, l);
	msgpack_unpacked_init(&msg);
	if (msgpack_unpack_next(&msg, o.buf.data, o.buf.size, &off) !=
		MSGPACK_UNPACK_SUCCESS ||
	    pdx_layout_unpack(&msg.data, &back, err, sizeof(err)) != PDX_OK)
		abort();
	same(l, &back);
	free(back.layer);
	msgpack_unpacked_destroy(&msg);
	pdx_mp_out_free(&o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct pdx_kv_layer ref_layer[2] = {
	    {{{0, 0}, {0, 4096}}, 64},
	    {{{0, 8192}, {0, 12288}}, 64},
	};
	const struct pdx_kv_layout ref = {.layers = 2,
					  .tensors = 2,
					  .blocks = 64,
					  .block_tokens = 4,
					  .kv_heads = 2,
					  .head_dim = 4,
					  .dtype_bytes = 2,
					  .order = PDX_KV_NHD,
					  .layer =
					      (struct pdx_kv_layer *)ref_layer};
	uint64_t sizes[4] = {16384, 1 << 20, UINT64_MAX, 0};
	struct pdx_kv_layout l;
	msgpack_unpacked msg;
	char err[256], diff[64];
	size_t off = 0;

	/* the first bytes size the regions, the rest is the map */
	if (size < 1)
		return 0;
	sizes[3] = (uint64_t)data[0] << 12;
	msgpack_unpacked_init(&msg);
	if (pdx_mp_check(data + 1, size - 1) == 0 &&
	    msgpack_unpack_next(&msg, (const char *)data + 1, size - 1, &off) ==
		MSGPACK_UNPACK_SUCCESS &&
	    pdx_layout_unpack(&msg.data, &l, err, sizeof(err)) == PDX_OK) {
		pdx_kv_layout_check(&l, sizes, 1 + data[0] % 4, err,
				    sizeof(err));
		pdx_kv_layout_compat_hash(&l);
		/* a short buffer: the diff must stay inside it */
		if (pdx_kv_layout_diff(&ref, &l, diff, sizeof(diff)) == 0 &&
		    pdx_kv_layout_compat_hash(&ref) !=
			pdx_kv_layout_compat_hash(&l))
			abort();
		pdx_kv_layout_block_bytes_all(&l);
		roundtrip(&l);
		free(l.layer);
	}
	msgpack_unpacked_destroy(&msg);
	return 0;
}
