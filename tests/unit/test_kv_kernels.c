/* The CPU reference kernels (kernels/<name>_cpu.c): round trips, small cases
 * worked out by hand, and checksums that notice a flipped byte. */
#include <stdlib.h>
#include <string.h>

#include "kernels/kv_kernels.h"
#include "tests/check.h"
#include "tests/rng.h"

/* A pool in two regions: K of every layer in region 0, V in region 1 (MLA:
 * all in region 0), each layer at its own offset, strides padded past the
 * block bytes so a stray write lands in padding the tests look at. */
struct pool {
	struct pdx_kv_layout l;
	struct pdx_kv_layer layer[8];
	uint8_t *mem[2];
	uint8_t *base[2];
	uint64_t size;
	struct pdx_kv_region kv;
};

static struct test_rng rng = { 88172645463325252ULL };

static uint64_t rnd(void)
{
	return test_rnd(&rng);
}

static void pool_init(struct pool *p, uint32_t layers, uint32_t tensors,
		      uint32_t blocks, uint32_t T, uint32_t H, uint32_t D,
		      uint32_t dt, enum pdx_kv_order order, uint32_t pad)
{
	uint64_t bb, off = 0;

	memset(p, 0, sizeof(*p));
	p->l = (struct pdx_kv_layout){ .layers = layers, .tensors = tensors,
				       .blocks = blocks, .block_tokens = T,
				       .kv_heads = H, .head_dim = D,
				       .dtype_bytes = dt, .order = order,
				       .layer = p->layer };
	bb = pdx_kv_layout_block_bytes(&p->l);
	for (uint32_t i = 0; i < layers; i++) {
		p->layer[i].block_stride = bb + pad;
		for (uint32_t t = 0; t < tensors; t++)
			p->layer[i].base[t] = (struct pdx_kv_ref){
				.region = t, .offset = off + 3 };
		off += 3 + (uint64_t)blocks * (bb + pad);
	}
	p->size = off;
	for (int r = 0; r < 2; r++) {
		p->mem[r] = malloc(p->size);
		p->base[r] = p->mem[r];
		for (uint64_t i = 0; i < p->size; i++)
			p->mem[r][i] = (uint8_t)rnd();
	}
	p->kv = (struct pdx_kv_region){ .layout = &p->l, .base = p->base,
					.n_regions = 2 };
}

static void pool_free(struct pool *p)
{
	free(p->mem[0]);
	free(p->mem[1]);
}

/* Block ids 0..3, 1 layer of 2 tensors and 1 more layer, 2 bytes a block:
 * every byte's place in the staging buffer written out. */
static void gather_by_hand(void)
{
	struct pool p;
	uint32_t ids[2] = { 3, 1 };
	uint8_t st[2 * 2 * 2 * 2];
	/* region r, layer i, block b, byte j: byte (b * 2 + j) of the layer's
	 * run (stride 2, no padding) after its 3-byte offset. */
	uint8_t want[16];
	int w = 0;

	pool_init(&p, 2, 2, 4, 1, 1, 2, 1, PDX_KV_NHD, 0);
	for (int r = 0; r < 2; r++)
		for (uint64_t i = 0; i < p.size; i++)
			p.mem[r][i] = (uint8_t)(r * 128 + i);
	/* layer 0 starts at 3, layer 1 at 3 + 4 * 2 + 3 = 14 */
	for (int l = 0; l < 2; l++)
		for (int t = 0; t < 2; t++)
			for (int k = 0; k < 2; k++)
				for (int j = 0; j < 2; j++)
					want[w++] = (uint8_t)(t * 128 +
							      (l ? 14 : 3) +
							      ids[k] * 2 + j);
	CHECK_EQ(pdx_kv_gather_cpu(&p.kv, ids, 2, st), PDX_OK);
	CHECK(!memcmp(st, want, sizeof(want)));
	/* layer 0, K, block 3 = region 0 bytes 9, 10 */
	CHECK_EQ(st[0], 9);
	CHECK_EQ(st[1], 10);
	/* layer 1, V, block 1 = region 1 bytes 16, 17 */
	CHECK_EQ(st[14], 128 + 16);
	CHECK_EQ(st[15], 128 + 17);
	pool_free(&p);
}

/* gather then scatter into another pool writes exactly the chosen blocks. */
static void round_trip(uint32_t tensors, enum pdx_kv_order order)
{
	struct pool a, b;
	uint32_t ids[5] = { 6, 0, 9, 3, 4 };
	uint64_t bb, sbytes;
	uint8_t *st, *st2, *before[2];

	pool_init(&a, 3, tensors, 10, 4, 2, 8, 2, order, 24);
	pool_init(&b, 3, tensors, 10, 4, 2, 8, 2, order, 24);
	bb = pdx_kv_layout_block_bytes(&a.l);
	sbytes = 3ULL * tensors * 5 * bb;
	st = malloc(sbytes);
	st2 = malloc(sbytes);
	for (int r = 0; r < 2; r++) {
		before[r] = malloc(b.size);
		memcpy(before[r], b.mem[r], b.size);
	}
	CHECK_EQ(pdx_kv_gather_cpu(&a.kv, ids, 5, st), PDX_OK);
	CHECK_EQ(pdx_kv_scatter_cpu(&b.kv, ids, 5, st), PDX_OK);
	CHECK_EQ(pdx_kv_gather_cpu(&b.kv, ids, 5, st2), PDX_OK);
	CHECK(!memcmp(st, st2, sbytes));
	/* every byte of b is a's where a chosen block lies, else untouched */
	for (int r = 0; r < 2; r++) {
		uint64_t moved = 0, kept = 0;

		for (uint64_t i = 0; i < b.size; i++) {
			int chosen = 0;

			for (uint32_t l = 0; l < 3 && r < (int)tensors; l++) {
				uint64_t s = b.layer[l].base[r].offset,
					 stride = b.layer[l].block_stride;

				for (int k = 0; k < 5; k++)
					if (i >= s + ids[k] * stride &&
					    i < s + ids[k] * stride + bb)
						chosen = 1;
			}
			if (chosen)
				moved += b.mem[r][i] == a.mem[r][i];
			else
				kept += b.mem[r][i] == before[r][i];
			if (chosen ? b.mem[r][i] != a.mem[r][i] :
				     b.mem[r][i] != before[r][i]) {
				CHECK(!"byte out of place");
				break;
			}
		}
		CHECK_EQ(moved + kept, b.size);
		CHECK_EQ(moved, r < (int)tensors ? 3 * 5 * bb : 0);
	}
	for (int r = 0; r < 2; r++)
		free(before[r]);
	free(st);
	free(st2);
	pool_free(&a);
	pool_free(&b);
}

/* Pool to pool, 2 layers of K and V, 4-byte blocks. src: 6 blocks, stride
 * 4, K in region 0 and V in region 1, layer 0 at offset 3 and layer 1 at
 * 3 + 6 * 4 + 3 = 30, byte i of region r holding r * 128 + i. dst: 8
 * blocks, stride 6 (2 bytes of padding), K in region 1 and V in region 0,
 * layers at 3 and 3 + 8 * 6 + 3 = 54, every byte 0xee. Blocks 4, 1 go to
 * 7, 0. */
static void copy_by_hand(void)
{
	struct pool a, b;
	uint32_t from[2] = { 4, 1 }, to[2] = { 7, 0 };
	int changed = 0;

	pool_init(&a, 2, 2, 6, 1, 1, 4, 1, PDX_KV_NHD, 0);
	pool_init(&b, 2, 2, 8, 1, 1, 4, 1, PDX_KV_NHD, 2);
	for (int r = 0; r < 2; r++) {
		for (uint64_t i = 0; i < a.size; i++)
			a.mem[r][i] = (uint8_t)(r * 128 + i);
		memset(b.mem[r], 0xee, b.size);
	}
	for (int l = 0; l < 2; l++) {
		b.layer[l].base[0].region = 1;
		b.layer[l].base[1].region = 0;
	}
	CHECK_EQ(a.size, 54);
	CHECK_EQ(b.size, 102);
	CHECK_EQ(pdx_kv_copy_cpu(&a.kv, from, &b.kv, to, 2), PDX_OK);
	/* layer 0 K: src block 4 (region 0, 3 + 16 = 19) -> dst block 7
	 * (region 1, 3 + 42 = 45) */
	CHECK(!memcmp(b.mem[1] + 45, "\x13\x14\x15\x16", 4));
	/* layer 0 K: block 1 (7..10) -> block 0 (region 1, 3) */
	CHECK(!memcmp(b.mem[1] + 3, "\x07\x08\x09\x0a", 4));
	/* layer 0 V: block 4 (region 1: 128 + 19) -> region 0, 45 */
	CHECK(!memcmp(b.mem[0] + 45, "\x93\x94\x95\x96", 4));
	/* layer 1 K: block 4 (region 0, 30 + 16 = 46) -> block 7 (region 1,
	 * 54 + 42 = 96) */
	CHECK(!memcmp(b.mem[1] + 96, "\x2e\x2f\x30\x31", 4));
	/* layer 1 V: block 1 (region 1, 128 + 34) -> block 0 (region 0, 54) */
	CHECK(!memcmp(b.mem[0] + 54, "\xa2\xa3\xa4\xa5", 4));
	/* padding after block 7, and block 6 before it, untouched */
	CHECK_EQ(b.mem[1][49], 0xee);
	CHECK_EQ(b.mem[1][50], 0xee);
	CHECK_EQ(b.mem[1][44], 0xee);
	CHECK_EQ(b.mem[0][58], 0xee);
	/* nothing else written: 2 layers x 2 tensors x 2 blocks x 4 bytes */
	for (int r = 0; r < 2; r++)
		for (uint64_t i = 0; i < b.size; i++)
			changed += b.mem[r][i] != 0xee;
	CHECK_EQ(changed, 32);
	/* the source is read only */
	for (int r = 0; r < 2; r++)
		for (uint64_t i = 0; i < a.size; i++)
			if (a.mem[r][i] != (uint8_t)(r * 128 + i))
				CHECK(!"source written");
	pool_free(&a);
	pool_free(&b);
}

/* gather from a, scatter into b == copy, on padded random pools */
static void copy_is_gather_scatter(uint32_t tensors)
{
	struct pool a, b, c;
	uint32_t from[4] = { 9, 2, 5, 0 }, to[4] = { 1, 11, 3, 6 };
	uint64_t sbytes;
	uint8_t *st;

	pool_init(&a, 3, tensors, 10, 4, 2, 8, 2, PDX_KV_HND, 24);
	pool_init(&b, 3, tensors, 12, 4, 2, 8, 2, PDX_KV_HND, 8);
	pool_init(&c, 3, tensors, 12, 4, 2, 8, 2, PDX_KV_HND, 8);
	for (int r = 0; r < 2; r++)
		memcpy(c.mem[r], b.mem[r], b.size);
	sbytes = 3ULL * tensors * 4 * pdx_kv_layout_block_bytes(&a.l);
	st = malloc(sbytes);
	CHECK_EQ(pdx_kv_gather_cpu(&a.kv, from, 4, st), PDX_OK);
	CHECK_EQ(pdx_kv_scatter_cpu(&b.kv, to, 4, st), PDX_OK);
	CHECK_EQ(pdx_kv_copy_cpu(&a.kv, from, &c.kv, to, 4), PDX_OK);
	for (int r = 0; r < 2; r++)
		CHECK(!memcmp(b.mem[r], c.mem[r], b.size));
	/* another shape, a bad id */
	c.l.tensors = 3 - tensors;
	CHECK_EQ(pdx_kv_copy_cpu(&a.kv, from, &c.kv, to, 4), PDX_EINVAL);
	c.l.tensors = tensors;
	c.l.head_dim = 4;
	CHECK_EQ(pdx_kv_copy_cpu(&a.kv, from, &c.kv, to, 4), PDX_EINVAL);
	c.l.head_dim = 8;
	to[3] = 12;
	CHECK_EQ(pdx_kv_copy_cpu(&a.kv, from, &c.kv, to, 4), PDX_ERANGE);
	free(st);
	pool_free(&a);
	pool_free(&b);
	pool_free(&c);
}

static void bad_arguments(void)
{
	struct pool p;
	uint32_t ids[2] = { 1, 10 };
	uint8_t st[4096];
	struct pdx_kv_shape s = { 2, 4, 1, 1, PDX_KV_NHD };
	void *dst[3] = { st, st, st };

	pool_init(&p, 1, 2, 10, 1, 1, 4, 1, PDX_KV_NHD, 0);
	CHECK_EQ(pdx_kv_gather_cpu(&p.kv, ids, 2, st), PDX_ERANGE);
	CHECK_EQ(pdx_kv_fill_cpu(&p.kv, ids, 2, 1), PDX_ERANGE);
	p.layer[0].base[1].region = 2;
	CHECK_EQ(pdx_kv_scatter_cpu(&p.kv, ids, 1, st), PDX_ERANGE);
	p.layer[0].base[1].region = 1;
	p.l.tensors = 3;
	CHECK_EQ(pdx_kv_gather_cpu(&p.kv, ids, 1, st), PDX_EINVAL);
	/* 4 heads do not split 3 ways */
	CHECK_EQ(pdx_kv_heads_split_cpu(&s, st, 3, dst, 1), PDX_EINVAL);
	CHECK_EQ(pdx_kv_heads_split_cpu(&s, st, 0, dst, 1), PDX_EINVAL);
	pool_free(&p);
}

static void permute_by_hand(void)
{
	/* T = 2, H = 3, one byte a row */
	struct pdx_kv_shape s = { 2, 3, 1, 1, PDX_KV_NHD };
	const uint8_t nhd[6] = { 0, 1, 2, 3, 4, 5 }; /* n0h0 n0h1 n0h2 n1h0 .. */
	const uint8_t hnd[6] = { 0, 3, 1, 4, 2, 5 }; /* h0n0 h0n1 h1n0 .. */
	uint8_t out[6], back[6];

	pdx_kv_permute_cpu(&s, nhd, out, 1);
	CHECK(!memcmp(out, hnd, 6));
	s.order = PDX_KV_HND;
	pdx_kv_permute_cpu(&s, out, back, 1);
	CHECK(!memcmp(back, nhd, 6));
}

static void permute_twice(void)
{
	struct pdx_kv_shape s = { 16, 8, 4, 2, PDX_KV_HND };
	uint64_t bb = pdx_kv_shape_bytes(&s), n = 7;
	uint8_t *x = malloc(bb * n), *y = malloc(bb * n), *z = malloc(bb * n);

	for (uint64_t i = 0; i < bb * n; i++)
		x[i] = (uint8_t)rnd();
	pdx_kv_permute_cpu(&s, x, y, n);
	CHECK(memcmp(x, y, bb * n));
	s.order = PDX_KV_NHD;
	pdx_kv_permute_cpu(&s, y, z, n);
	CHECK(!memcmp(x, z, bb * n));
	/* one head: both orders are the same bytes */
	s.kv_heads = 1;
	pdx_kv_permute_cpu(&s, x, y, 3);
	CHECK(!memcmp(x, y, pdx_kv_shape_bytes(&s) * 3));
	free(x);
	free(y);
	free(z);
}

static void split_by_hand(void)
{
	/* T = 2, H = 4, one byte a row, into 2 ranks of 2 heads */
	struct pdx_kv_shape s = { 2, 4, 1, 1, PDX_KV_NHD };
	const uint8_t full[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
	uint8_t s0[4], s1[4], back[8];
	void *dst[2] = { s0, s1 };
	const void *src[2] = { s0, s1 };

	/* NHD: n0h0 n0h1 n0h2 n0h3 n1h0 ..; rank 0 has h0, h1 */
	CHECK_EQ(pdx_kv_heads_split_cpu(&s, full, 2, dst, 1), PDX_OK);
	CHECK(!memcmp(s0, "\0\1\4\5", 4));
	CHECK(!memcmp(s1, "\2\3\6\7", 4));
	CHECK_EQ(pdx_kv_heads_merge_cpu(&s, 2, src, back, 1), PDX_OK);
	CHECK(!memcmp(back, full, 8));
	/* HND: h0n0 h0n1 h1n0 ..; rank 0 has the first half */
	s.order = PDX_KV_HND;
	CHECK_EQ(pdx_kv_heads_split_cpu(&s, full, 2, dst, 1), PDX_OK);
	CHECK(!memcmp(s0, "\0\1\2\3", 4));
	CHECK(!memcmp(s1, "\4\5\6\7", 4));
}

/* split then merge is the identity; TP 2 -> 3 is merge then split. */
static void reshard(enum pdx_kv_order order)
{
	struct pdx_kv_shape s = { 8, 6, 4, 2, order };
	uint64_t bb = pdx_kv_shape_bytes(&s), n = 5, all = bb * n;
	uint8_t *full = malloc(all), *back = malloc(all);
	uint8_t *two[2], *three[3], *three2[3];

	for (uint64_t i = 0; i < all; i++)
		full[i] = (uint8_t)rnd();
	for (int i = 0; i < 2; i++)
		two[i] = malloc(all / 2);
	for (int i = 0; i < 3; i++) {
		three[i] = malloc(all / 3);
		three2[i] = malloc(all / 3);
	}
	for (uint32_t parts = 1; parts <= 6; parts++) {
		uint8_t *sh[6];

		if (6 % parts)
			continue;
		for (uint32_t i = 0; i < parts; i++)
			sh[i] = malloc(all / parts);
		CHECK_EQ(pdx_kv_heads_split_cpu(&s, full, parts,
						(void *const *)sh, n),
			 PDX_OK);
		memset(back, 0, all);
		CHECK_EQ(pdx_kv_heads_merge_cpu(&s, parts,
						(const void *const *)sh, back,
						n),
			 PDX_OK);
		CHECK(!memcmp(full, back, all));
		for (uint32_t i = 0; i < parts; i++)
			free(sh[i]);
	}
	CHECK_EQ(pdx_kv_heads_split_cpu(&s, full, 2, (void *const *)two, n),
		 PDX_OK);
	CHECK_EQ(pdx_kv_heads_split_cpu(&s, full, 3, (void *const *)three, n),
		 PDX_OK);
	CHECK_EQ(pdx_kv_heads_reshard_cpu(&s, 2, (const void *const *)two, 3,
					  (void *const *)three2, n),
		 PDX_OK);
	for (int i = 0; i < 3; i++)
		CHECK(!memcmp(three[i], three2[i], all / 3));
	free(full);
	free(back);
	for (int i = 0; i < 2; i++)
		free(two[i]);
	for (int i = 0; i < 3; i++) {
		free(three[i]);
		free(three2[i]);
	}
}

static void checksum(void)
{
	uint8_t buf[29];
	uint64_t h, hs[3], hs2[3];

	for (int i = 0; i < (int)sizeof(buf); i++)
		buf[i] = (uint8_t)i;
	h = pdx_kv_block_hash(buf, sizeof(buf));
	/* pinned (also computed from the definition in Python): the CUDA
	 * version and other hosts must agree */
	CHECK_EQ(h, (long long)0x2967e1f5ae5b3081ULL);
	CHECK_EQ(pdx_kv_block_hash(buf, sizeof(buf)), h);
	/* every one-bit flip in any byte, tail included, changes it */
	for (int i = 0; i < (int)sizeof(buf); i++)
		for (int bit = 0; bit < 8; bit++) {
			buf[i] ^= (uint8_t)(1 << bit);
			if (pdx_kv_block_hash(buf, sizeof(buf)) == h)
				CHECK(!"flip unnoticed");
			buf[i] ^= (uint8_t)(1 << bit);
		}
	/* the length counts: trailing zeros are not free */
	buf[28] = 0;
	CHECK(pdx_kv_block_hash(buf, 28) != pdx_kv_block_hash(buf, 29));
	/* the combination depends on order and count */
	hs[0] = 1, hs[1] = 2, hs[2] = 3;
	hs2[0] = 2, hs2[1] = 1, hs2[2] = 3;
	CHECK(pdx_kv_checksum_combine(hs, 3) != pdx_kv_checksum_combine(hs2, 3));
	CHECK(pdx_kv_checksum_combine(hs, 2) != pdx_kv_checksum_combine(hs, 3));
}

/* fill: a pure function of (seed, layer, tensor, block, offset), equal to
 * fill_staging once gathered, and region hashes equal staging hashes. */
static void fill(uint32_t tensors)
{
	struct pool p;
	uint32_t ids[3] = { 2, 7, 5 }, other[1] = { 4 };
	uint64_t bb, nb, key;
	uint8_t *st, *want, *blk4;
	uint64_t *h1, *h2;

	pool_init(&p, 2, tensors, 8, 3, 2, 5, 1, PDX_KV_NHD, 16);
	bb = pdx_kv_layout_block_bytes(&p.l); /* 30: not a multiple of 8 */
	nb = 2ULL * tensors * 3;
	st = malloc(nb * bb);
	want = malloc(nb * bb);
	h1 = malloc(nb * sizeof(*h1));
	h2 = malloc(nb * sizeof(*h2));
	blk4 = malloc(bb);
	memcpy(blk4, p.base[0] + p.layer[1].base[0].offset +
			     4 * p.layer[1].block_stride,
	       bb);
	CHECK_EQ(pdx_kv_fill_cpu(&p.kv, ids, 3, 42), PDX_OK);
	CHECK_EQ(pdx_kv_gather_cpu(&p.kv, ids, 3, st), PDX_OK);
	pdx_kv_fill_staging_cpu(&p.l, ids, 3, 42, want);
	CHECK(!memcmp(st, want, nb * bb));
	/* byte 9 of layer 1, last tensor, block 5, from the definition */
	key = pdx_kv_mix64(42 ^ pdx_kv_mix64((1ULL << 40) ^
					     ((uint64_t)(tensors - 1) << 32) ^
					     5));
	CHECK_EQ(st[(nb - 1) * bb + 9],
		 (uint8_t)(pdx_kv_mix64(key + 1) >> 8));
	CHECK_EQ(pdx_kv_fill_byte(42, 1, tensors - 1, 5, 9),
		 (uint8_t)(pdx_kv_mix64(key + 1) >> 8));
	/* block 4 was not chosen and kept its bytes */
	CHECK(!memcmp(blk4, p.base[0] + p.layer[1].base[0].offset +
				    4 * p.layer[1].block_stride,
		      bb));
	/* another seed, other bytes */
	pdx_kv_fill_staging_cpu(&p.l, ids, 3, 43, want);
	CHECK(memcmp(st, want, nb * bb));
	/* hashes in place == hashes of the staging buffer */
	CHECK_EQ(pdx_kv_hashes_cpu(&p.kv, ids, 3, h1), PDX_OK);
	pdx_kv_buf_hashes_cpu(st, bb, nb, h2);
	CHECK(!memcmp(h1, h2, nb * sizeof(*h1)));
	CHECK_EQ(pdx_kv_hashes_cpu(&p.kv, other, 1, h1), PDX_OK);
	CHECK(h1[0] != h2[0]);
	free(st);
	free(want);
	free(h1);
	free(h2);
	free(blk4);
	pool_free(&p);
}

int main(void)
{
	gather_by_hand();
	round_trip(2, PDX_KV_NHD);
	round_trip(2, PDX_KV_HND);
	round_trip(1, PDX_KV_NHD); /* MLA */
	copy_by_hand();
	copy_is_gather_scatter(2);
	copy_is_gather_scatter(1);
	bad_arguments();
	permute_by_hand();
	permute_twice();
	split_by_hand();
	reshard(PDX_KV_NHD);
	reshard(PDX_KV_HND);
	checksum();
	fill(2);
	fill(1);
	CHECK_DONE();
}
