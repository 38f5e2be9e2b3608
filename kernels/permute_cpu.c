/* CPU reference: the order of rows inside a block (NHD <-> HND) and the
 * split of its heads between tensor-parallel ranks. A "row" is one head of
 * one token: head_dim * dtype_bytes bytes, never split. */
#include "kernels/kv_kernels.h"

#include <string.h>

/* Index of the row of token n, head h in a block of T tokens, H heads. */
static uint64_t row_index(enum pdx_kv_order order, uint32_t T, uint32_t H,
			  uint32_t n, uint32_t h)
{
	return order == PDX_KV_NHD ? (uint64_t)n * H + h : (uint64_t)h * T + n;
}

void pdx_kv_permute_cpu(const struct pdx_kv_shape *s, const void *src,
			void *dst, uint64_t nblocks)
{
	enum pdx_kv_order to = s->order == PDX_KV_NHD ? PDX_KV_HND : PDX_KV_NHD;
	uint64_t row = (uint64_t)s->head_dim * s->dtype_bytes;
	uint64_t bb = pdx_kv_shape_bytes(s);
	uint32_t T = s->block_tokens, H = s->kv_heads;

	for (uint64_t k = 0; k < nblocks; k++) {
		const uint8_t *in = (const uint8_t *)src + k * bb;
		uint8_t *out = (uint8_t *)dst + k * bb;

		for (uint32_t n = 0; n < T; n++)
			for (uint32_t h = 0; h < H; h++)
				memcpy(out + row_index(to, T, H, n, h) * row,
				       in + row_index(s->order, T, H, n, h) * row,
				       row);
	}
}

pdx_status_t pdx_kv_heads_reshard_cpu(const struct pdx_kv_shape *s,
				      uint32_t a, const void *const *src,
				      uint32_t b, void *const *dst,
				      uint64_t nblocks)
{
	uint32_t T = s->block_tokens, H = s->kv_heads, ha, hb;
	uint64_t row = (uint64_t)s->head_dim * s->dtype_bytes, ba, bbt;

	if (!a || !b || H % a || H % b || !src || !dst)
		return PDX_EINVAL;
	ha = H / a;
	hb = H / b;
	ba = (uint64_t)T * ha * row;
	bbt = (uint64_t)T * hb * row;
	for (uint64_t k = 0; k < nblocks; k++)
		for (uint32_t n = 0; n < T; n++)
			for (uint32_t g = 0; g < H; g++) {
				const uint8_t *in = (const uint8_t *)src[g / ha] +
						    k * ba;
				uint8_t *out = (uint8_t *)dst[g / hb] + k * bbt;

				memcpy(out + row_index(s->order, T, hb, n,
						       g % hb) * row,
				       in + row_index(s->order, T, ha, n,
						      g % ha) * row,
				       row);
			}
	return PDX_OK;
}

pdx_status_t pdx_kv_heads_split_cpu(const struct pdx_kv_shape *s,
				    const void *src, uint32_t parts,
				    void *const *dst, uint64_t nblocks)
{
	const void *one[1] = { src };

	return pdx_kv_heads_reshard_cpu(s, 1, one, parts, dst, nblocks);
}

pdx_status_t pdx_kv_heads_merge_cpu(const struct pdx_kv_shape *s,
				    uint32_t parts, const void *const *src,
				    void *dst, uint64_t nblocks)
{
	void *one[1] = { dst };

	return pdx_kv_heads_reshard_cpu(s, parts, src, 1, one, nblocks);
}
