/* CPU reference: deterministic fill and block hashes, the two halves of
 * checking that a transfer moved the right bytes (definitions in
 * kernels/kv_kernels.h). */
#include "kernels/kv_kernels.h"

static void fill_block(uint8_t *p, uint64_t len, uint64_t seed,
		       uint32_t layer, uint32_t tensor, uint32_t block)
{
	uint64_t key = pdx_kv_mix64(seed ^ pdx_kv_mix64(((uint64_t)layer << 40) ^
						      ((uint64_t)tensor << 32) ^
						      block));

	for (uint64_t w = 0; w * 8 < len; w++) {
		uint64_t word = pdx_kv_mix64(key + w);

		for (uint64_t j = 0; j < 8 && w * 8 + j < len; j++)
			p[w * 8 + j] = (uint8_t)(word >> (8 * j));
	}
}

static void fill_seg(const struct pdx_kv_seg *sg, void *seed)
{
	fill_block(sg->p, sg->bytes, *(const uint64_t *)seed, sg->layer,
		   sg->tensor, sg->block);
}

pdx_status_t pdx_kv_fill_cpu(const struct pdx_kv_region *kv,
			     const uint32_t *blocks, uint32_t n, uint64_t seed)
{
	return pdx_kv_each_segment(kv, blocks, n, fill_seg, &seed);
}

void pdx_kv_fill_staging_cpu(const struct pdx_kv_layout *l,
			     const uint32_t *blocks, uint32_t n,
			     uint64_t seed, void *staging)
{
	uint64_t bb = pdx_kv_layout_block_bytes(l);
	uint8_t *out = staging;

	for (uint32_t i = 0; i < l->layers; i++)
		for (uint32_t t = 0; t < l->tensors; t++)
			for (uint32_t k = 0; k < n; k++, out += bb)
				fill_block(out, bb, seed, i, t, blocks[k]);
}

uint64_t pdx_kv_block_hash(const void *p, uint64_t len)
{
	const uint8_t *b = p;
	uint64_t h = pdx_kv_mix64(len);

	for (uint64_t w = 0; w * 8 < len; w++) {
		uint64_t word = 0;

		for (uint64_t j = 0; j < 8 && w * 8 + j < len; j++)
			word |= (uint64_t)b[w * 8 + j] << (8 * j);
		h += pdx_kv_mix64(word + w * 0x9e3779b97f4a7c15ULL);
	}
	return h;
}

void pdx_kv_buf_hashes_cpu(const void *buf, uint64_t block_bytes,
			   uint64_t nblocks, uint64_t *out)
{
	for (uint64_t k = 0; k < nblocks; k++)
		out[k] = pdx_kv_block_hash((const uint8_t *)buf +
						   k * block_bytes,
					   block_bytes);
}

static void hash_seg(const struct pdx_kv_seg *sg, void *out)
{
	((uint64_t *)out)[sg->index] = pdx_kv_block_hash(sg->p, sg->bytes);
}

pdx_status_t pdx_kv_hashes_cpu(const struct pdx_kv_region *kv,
			       const uint32_t *blocks, uint32_t n,
			       uint64_t *out)
{
	return pdx_kv_each_segment(kv, blocks, n, hash_seg, out);
}

uint64_t pdx_kv_checksum_combine(const uint64_t *hashes, uint64_t count)
{
	uint64_t c = 0xcbf29ce484222325ULL;

	for (uint64_t i = 0; i < count; i++)
		c = (c ^ hashes[i]) * 0x100000001b3ULL;
	return pdx_kv_mix64(c ^ count);
}
