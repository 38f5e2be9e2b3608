/* A TP leg's heads as the cuda-ipc path moves them (agent/path_cuda_ipc.c):
 * tp_slice_each_piece() of one block gives the piece, and the copy kernel
 * (kernels/plan.cu, k_copy_piece) applies that same piece to every
 * segment, one block of one tensor. Here the kernel is modelled on the
 * CPU, segment by segment, and every decode rank's blocks, put together
 * from the legs of every prefill rank that overlaps it, must equal what
 * pdx_kv_heads_reshard_cpu() makes of the same KV, then
 * pdx_kv_permute_cpu() where the decode side's order is the other: for
 * TP p -> d both ways and p == d, NHD and HND on either side,
 * block_tokens not a power of two, heads of odd byte lengths. Each piece
 * must also pass the kernel's own bounds check (the last row ends within
 * the block on both sides), or the launch would be refused, and the
 * agent's host copies of it (pdx_kv_piece_copy(), directly and packed
 * then unpacked as slice messages carry it) must write what the model
 * writes. Runs without a GPU. */
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "kernels/kv_kernels.h"
#include "tests/check.h"
#include "tests/rng.h"

static struct test_rng rng = { 0x6a09e667f3bcc909ULL };
static int failed, cases;

struct seg_copy {
	const uint8_t *src; /* the sender rank's blocks */
	uint8_t *dst;	    /* the receiver rank's blocks */
	uint64_t sbb, dbb, nblocks;
	int calls, bad_fit, bad_copy;
};

/* The agent's host copies of a piece into a copy of the block at dst
 * as it was: pdx_kv_piece_copy() (the ipc lane), and packed then
 * unpacked (slice messages); each must leave what the row by row model
 * left at dst_now, and the packed bytes must be the rows in
 * pdx_kv_piece_row()'s order (the slice messages' wire format). */
static bool host_copies_agree(const struct pdx_kv_piece *pc,
			      const uint8_t *src, const uint8_t *dst_before,
			      const uint8_t *dst_now, uint64_t dbb)
{
	uint8_t *direct = malloc(dbb), *unpacked = malloc(dbb);
	uint8_t *packed = malloc(pdx_kv_piece_bytes(pc));
	struct pdx_kv_piece in = pdx_kv_piece_packed(*pc, PDX_KV_DST);
	struct pdx_kv_piece out = pdx_kv_piece_packed(*pc, PDX_KV_SRC);
	bool same;

	memcpy(direct, dst_before, dbb);
	memcpy(unpacked, dst_before, dbb);
	pdx_kv_piece_copy(direct, src, pc);
	pdx_kv_piece_copy(packed, src, &in);
	pdx_kv_piece_copy(unpacked, packed, &out);
	same = !memcmp(direct, dst_now, dbb) && !memcmp(unpacked, dst_now, dbb);
	for (uint64_t i = 0; i < (uint64_t)pc->groups * pc->rows; i++) {
		uint64_t s, d;

		pdx_kv_piece_row(pc, i, &s, &d);
		same = same && !memcmp(packed + i * pc->len, src + s, pc->len);
	}
	free(direct);
	free(unpacked);
	free(packed);
	return same;
}

/* k_copy_piece on the CPU: the piece of each segment (a block here). */
static pdx_status_t apply(struct xfer *x, const void *ctx,
			  const struct pdx_kv_piece *pc)
{
	struct seg_copy *c = (struct seg_copy *)ctx;

	uint64_t s, d;

	(void)x;
	c->calls++;
	/* the kernel's own bounds check (plan.cu) */
	if (!pdx_kv_piece_fits(pc, pc->src_off, pc->src_stride, pc->src_group,
			       c->sbb) ||
	    !pdx_kv_piece_fits(pc, pc->dst_off, pc->dst_stride, pc->dst_group,
			       c->dbb)) {
		c->bad_fit++;
		return PDX_OK;
	}
	for (uint64_t k = 0; k < c->nblocks; k++) {
		uint8_t *dst = c->dst + k * c->dbb, *before = malloc(c->dbb);
		const uint8_t *src = c->src + k * c->sbb;

		memcpy(before, dst, c->dbb);
		for (uint64_t i = 0; i < (uint64_t)pc->groups * pc->rows; i++) {
			pdx_kv_piece_row(pc, i, &s, &d);
			memcpy(dst + d, src + s, pc->len);
		}
		c->bad_copy += !host_copies_agree(pc, src, before, dst, c->dbb);
		free(before);
	}
	return PDX_OK;
}

static struct pdx_kv_layout rank_layout(const struct pdx_kv_shape *s,
					uint32_t heads, enum pdx_kv_order order)
{
	return (struct pdx_kv_layout){ .layers = 1, .tensors = 2,
				       .blocks = 1,
				       .block_tokens = s->block_tokens,
				       .kv_heads = heads,
				       .head_dim = s->head_dim,
				       .dtype_bytes = s->dtype_bytes,
				       .order = order };
}

/* TP p -> d of nblocks blocks of full shape s, the decode side's blocks
 * in order `to` (p == d: every head, converted). */
static void one(const struct pdx_kv_shape *s, uint32_t p, uint32_t d,
		enum pdx_kv_order to, uint64_t nblocks)
{
	uint32_t H = s->kv_heads;
	uint64_t full = pdx_kv_shape_bytes(s), sbb = full / p, dbb = full / d;
	uint8_t *whole = malloc(full * nblocks);
	void *src[16], *want[16];
	uint8_t *got = malloc(dbb * nblocks);
	struct pdx_kv_shape shape = *s;
	const void *one_src[1] = { whole };

	for (uint64_t i = 0; i < full * nblocks; i++)
		whole[i] = (uint8_t)test_rnd(&rng);
	for (uint32_t i = 0; i < p; i++)
		src[i] = malloc(sbb * nblocks);
	for (uint32_t i = 0; i < d; i++)
		want[i] = malloc(dbb * nblocks);
	/* the prefill ranks' shards, and the decode ranks' */
	CHECK_EQ(pdx_kv_heads_reshard_cpu(&shape, 1, one_src, p, src, nblocks),
		 PDX_OK);
	CHECK_EQ(pdx_kv_heads_reshard_cpu(&shape, 1, one_src, d, want,
					  nblocks),
		 PDX_OK);
	for (uint32_t r = 0; r < d && to != s->order; r++) {
		struct pdx_kv_shape rs = *s;

		rs.kv_heads = H / d;
		memcpy(got, want[r], dbb * nblocks);
		pdx_kv_permute_cpu(&rs, got, want[r], nblocks);
	}
	for (uint32_t r = 0; r < d; r++) {
		struct pdx_kv_layout dl = rank_layout(s, H / d, to);
		uint32_t covered = 0;

		memset(got, 0xa5, dbb * nblocks);
		for (uint32_t q = 0; q < p; q++) {
			struct pdx_kv_layout sl = rank_layout(s, H / p,
							      s->order);
			struct seg_copy c = { src[q], got, sbb, dbb, nblocks,
					      0, 0, 0 };
			struct tp_slice sc;

			if (!tp_slice_of(H, (struct tp_rank){ q, p },
					 (struct tp_rank){ r, d }, &sc))
				continue;
			covered += sc.n;
			CHECK_EQ(tp_slice_each_piece(NULL, &sc, &sl, &dl, 1,
						     apply, &c),
				 PDX_OK);
			/* one piece a block, within it on both sides */
			CHECK_EQ(c.calls, 1);
			CHECK_EQ(c.bad_fit, 0);
			CHECK_EQ(c.bad_copy, 0);
		}
		/* every head of the rank from some leg, and the bytes the
		 * resharded KV's */
		CHECK_EQ(covered, H / d);
		CHECK(!memcmp(got, want[r], dbb * nblocks));
		if (check_failures > failed) {
			printf("  TP %u -> %u, decode rank %u: %s -> %s, %u "
			       "tokens, %u heads of %u bytes\n", p, d, r,
			       s->order == PDX_KV_NHD ? "NHD" : "HND",
			       to == PDX_KV_NHD ? "NHD" : "HND",
			       s->block_tokens, H,
			       s->head_dim * s->dtype_bytes);
			failed = check_failures;
		}
	}
	cases++;
	for (uint32_t i = 0; i < p; i++)
		free(src[i]);
	for (uint32_t i = 0; i < d; i++)
		free(want[i]);
	free(got);
	free(whole);
}

int main(void)
{
	static const uint32_t tokens[] = { 1, 3, 16 }, heads[] = { 2, 4, 8 },
			      dims[] = { 1, 5, 64 }, dtypes[] = { 1, 2 },
			      tps[] = { 1, 2, 4, 8 };

	for (int o = 0; o < 4; o++)
		for (size_t t = 0; t < 3; t++)
			for (size_t h = 0; h < 3; h++)
				for (size_t k = 0; k < 3; k++)
					for (size_t b = 0; b < 2; b++) {
						struct pdx_kv_shape s = {
							tokens[t], heads[h],
							dims[k], dtypes[b],
							o & 1 ? PDX_KV_HND
							      : PDX_KV_NHD };
						enum pdx_kv_order to =
							o & 2 ? PDX_KV_HND
							      : PDX_KV_NHD;

						for (size_t i = 0; i < 4; i++)
							for (size_t j = 0; j < 4; j++)
								if ((tps[i] != tps[j] ||
								     to != s.order) &&
								    tps[i] <= heads[h] &&
								    tps[j] <= heads[h])
									one(&s, tps[i], tps[j], to,
									    1 + test_rnd(&rng) % 3);
					}
	/* the kernel's bounds check itself: a piece that would wrap past
	 * 2^64, one row with a stride it never takes, an exact fit */
	{
		struct pdx_kv_piece w = { .len = 1, .rows = (1u << 31) + 2,
					  .groups = (1u << 31) + 2,
					  .src_stride = 0xffffffffu,
					  .src_group = 0xffffffffu };
		struct pdx_kv_piece one = pdx_kv_piece_whole(16), fit = one;

		CHECK(!pdx_kv_piece_fits(&w, 0, w.src_stride, w.src_group,
					 0xffffffffu));
		one.src_stride = one.src_group = UINT64_MAX;
		CHECK(pdx_kv_piece_fits(&one, 0, one.src_stride, one.src_group,
					16));
		fit.rows = 3;
		fit.groups = 2;
		fit.src_stride = 16;
		fit.src_group = 48;
		CHECK(pdx_kv_piece_fits(&fit, 4, 16, 48, 100));
		CHECK(!pdx_kv_piece_fits(&fit, 5, 16, 48, 100));
	}
	CHECK(cases > 1500, "TP p -> d between 1, 2, 4 and 8 ranks and p == "
	      "d, NHD and HND on either side, blocks of 1, 3 and 16 tokens: "
	      "each decode rank's blocks, put together from the cuda-ipc "
	      "legs' pieces segment by segment, are the resharded KV byte for "
	      "byte, in the decode side's order");
	CHECK_DONE();
}
