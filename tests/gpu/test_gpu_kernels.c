/* Each CUDA kernel (kernels/<name>.cu) against its CPU reference on random
 * layouts: same inputs, byte-for-byte the same outputs; plans on random
 * segment ranges and between differently laid out pools; and plans used
 * the agent's way, behind a stream that waits for the engine. Exits 77
 * (meson's "skipped") where there is no GPU. */
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "kernels/kv_kernels.h"
#include "tests/check.h"
#include "tests/gpu/gpu_skip.h"
#include "tests/rng.h"

static struct test_rng rng = { 0x2545f4914f6cdd1dULL };

static uint64_t rnd(void)
{
	return test_rnd(&rng);
}

static uint32_t pick(const uint32_t *v, int n)
{
	return test_pick(&rng, v, n);
}

/* A random layout in two regions, the same bytes on host and device. */
struct pool {
	struct pdx_kv_layout l;
	struct pdx_kv_layer layer[16];
	uint64_t size;
	uint8_t *h[2], *d[2];
	struct pdx_kv_region hkv, dkv;
};

#define MAX_BLOCKS 48

/* With `like`, the same shape laid out otherwise: at least min_blocks
 * blocks, K and V in swapped regions, other padding, another start. */
static int pool_new(struct pool *p, const struct pdx_kv_layout *like,
		    uint32_t min_blocks)
{
	static const uint32_t T[] = { 1, 3, 16, 32 }, H[] = { 1, 2, 4, 8 },
			      D[] = { 1, 7, 64, 128 }, DT[] = { 1, 2, 4 },
			      PAD[] = { 0, 0, 16, 5 };
	uint64_t bb, off = 0;
	uint32_t swap = 0;

	memset(p, 0, sizeof(*p));
	if (like) {
		p->l = *like;
		p->l.blocks = min_blocks + (uint32_t)(rnd() % 8);
		/* mostly 16-byte aligned, sometimes not */
		off = rnd() % 3 ? 16 * (rnd() % 4) : 1 + rnd() % 15;
		swap = 1;
	} else {
		p->l.layers = 1 + (uint32_t)(rnd() % 16);
		p->l.tensors = 1 + (uint32_t)(rnd() % 2);
		p->l.blocks = 1 + (uint32_t)(rnd() % 40);
		p->l.block_tokens = pick(T, 4);
		p->l.kv_heads = pick(H, 4);
		p->l.head_dim = pick(D, 4);
		p->l.dtype_bytes = pick(DT, 3);
		p->l.order = (enum pdx_kv_order)(rnd() % 2);
	}
	p->l.layer = p->layer;
	bb = pdx_kv_layout_block_bytes(&p->l);
	for (uint32_t i = 0; i < p->l.layers; i++) {
		p->layer[i].block_stride = bb + pick(PAD, 4);
		for (uint32_t t = 0; t < p->l.tensors; t++)
			p->layer[i].base[t] = (struct pdx_kv_ref){
				.region = (t + swap) % 2, .offset = off };
		off += (uint64_t)p->l.blocks * p->layer[i].block_stride;
	}
	p->size = off;
	for (int r = 0; r < 2; r++) {
		p->h[r] = malloc(p->size);
		for (uint64_t i = 0; i < p->size; i++)
			p->h[r][i] = (uint8_t)rnd();
		if (cudaMalloc((void **)&p->d[r], p->size) != cudaSuccess ||
		    cudaMemcpy(p->d[r], p->h[r], p->size,
			       cudaMemcpyHostToDevice) != cudaSuccess)
			return -1;
	}
	p->hkv = (struct pdx_kv_region){ &p->l, p->h, 2 };
	p->dkv = (struct pdx_kv_region){ &p->l, p->d, 2 };
	/* the copies above may still be landing, unseen by other streams */
	return cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
}

/* Device regions equal host ones, byte for byte. */
static int pool_same(struct pool *p)
{
	uint8_t *x = malloc(p->size);
	int same = 1;

	for (int r = 0; r < 2; r++) {
		cudaMemcpy(x, p->d[r], p->size, cudaMemcpyDeviceToHost);
		same &= !memcmp(x, p->h[r], p->size);
	}
	free(x);
	return same;
}

static void pool_free(struct pool *p)
{
	for (int r = 0; r < 2; r++) {
		free(p->h[r]);
		cudaFree(p->d[r]);
	}
}

static int dev_same(const void *d, const void *h, uint64_t len)
{
	uint8_t *x = malloc(len ? len : 1);
	int same;

	cudaMemcpy(x, d, len, cudaMemcpyDeviceToHost);
	same = !memcmp(x, h, len);
	free(x);
	return same;
}

static void one_layout(int round)
{
	struct pool p;
	uint32_t ids[40], n;
	uint64_t bb, nb, len, seed = rnd();
	uint8_t *hs, *ds, *hp, *dp;
	uint64_t *h1, *h2;
	struct pdx_kv_shape s;

	if (pool_new(&p, NULL, 0)) {
		CHECK(!"device allocation");
		return;
	}
	n = 1 + (uint32_t)(rnd() % p.l.blocks);
	for (uint32_t i = 0; i < n; i++)
		ids[i] = (uint32_t)(rnd() % p.l.blocks); /* repeats allowed */
	bb = pdx_kv_layout_block_bytes(&p.l);
	nb = (uint64_t)p.l.layers * p.l.tensors * n;
	len = nb * bb;
	hs = malloc(len);
	hp = malloc(len);
	h1 = malloc(nb * 8);
	h2 = malloc(nb * 8);
	cudaMalloc((void **)&ds, len);
	cudaMalloc((void **)&dp, len);

	/* gather */
	CHECK_EQ(pdx_kv_gather_cpu(&p.hkv, ids, n, hs), PDX_OK);
	CHECK_EQ(pdx_kv_gather_cuda(&p.dkv, ids, n, ds, NULL), PDX_OK);
	cudaDeviceSynchronize();
	CHECK(dev_same(ds, hs, len));
	/* hashes of the staging buffer */
	pdx_kv_buf_hashes_cpu(hs, bb, nb, h1);
	CHECK_EQ(pdx_kv_buf_hashes_cuda(ds, bb, nb, h2, NULL), PDX_OK);
	CHECK(!memcmp(h1, h2, nb * 8));
	/* fill, then scatter the gathered bytes back over it (distinct ids
	 * only, so the last writer of a repeated id cannot differ) */
	CHECK_EQ(pdx_kv_fill_cpu(&p.hkv, ids, n, seed), PDX_OK);
	CHECK_EQ(pdx_kv_fill_cuda(&p.dkv, ids, n, seed, NULL), PDX_OK);
	cudaDeviceSynchronize();
	CHECK(pool_same(&p));
	CHECK_EQ(pdx_kv_scatter_cpu(&p.hkv, ids, 1, hs), PDX_OK);
	CHECK_EQ(pdx_kv_scatter_cuda(&p.dkv, ids, 1, ds, NULL), PDX_OK);
	cudaDeviceSynchronize();
	CHECK(pool_same(&p));
	/* permute the staging buffer */
	s = pdx_kv_shape_of(&p.l);
	pdx_kv_permute_cpu(&s, hs, hp, nb);
	CHECK_EQ(pdx_kv_permute_cuda(&s, ds, dp, nb, NULL), PDX_OK);
	cudaDeviceSynchronize();
	CHECK(dev_same(dp, hp, len));
	/* reshard: split into every divisor, and 2 -> 4 / 4 -> 2 */
	for (uint32_t parts = 2; parts <= s.kv_heads; parts *= 2) {
		void *hsh[8], *dsh[8];
		uint64_t sl = len / parts;

		for (uint32_t i = 0; i < parts; i++) {
			hsh[i] = malloc(sl);
			cudaMalloc(&dsh[i], sl);
		}
		CHECK_EQ(pdx_kv_heads_split_cpu(&s, hs, parts, hsh, nb), PDX_OK);
		CHECK_EQ(pdx_kv_heads_reshard_cuda(&s, 1,
						   (const void *const *)&ds,
						   parts, dsh, nb, NULL),
			 PDX_OK);
		cudaDeviceSynchronize();
		for (uint32_t i = 0; i < parts; i++)
			CHECK(dev_same(dsh[i], hsh[i], sl));
		CHECK_EQ(pdx_kv_heads_reshard_cuda(&s, parts,
						   (const void *const *)dsh, 1,
						   (void *const *)&dp, nb, NULL),
			 PDX_OK);
		cudaDeviceSynchronize();
		CHECK(dev_same(dp, hs, len));
		for (uint32_t i = 0; i < parts; i++) {
			free(hsh[i]);
			cudaFree(dsh[i]);
		}
	}
	/* ... and between two TP sizes above 1 (a TP 2 -> 4 and 4 -> 2
	 * reshard, no full copy on either side) */
	for (uint32_t a = 2; 4 <= s.kv_heads && a <= 4; a += 2) {
		uint32_t b = 6 - a;
		void *ha_[4], *da_[4], *hb_[4], *db_[4];

		for (uint32_t i = 0; i < a; i++) {
			ha_[i] = malloc(len / a);
			cudaMalloc(&da_[i], len / a);
		}
		for (uint32_t i = 0; i < b; i++) {
			hb_[i] = malloc(len / b);
			cudaMalloc(&db_[i], len / b);
		}
		CHECK_EQ(pdx_kv_heads_split_cpu(&s, hs, a, ha_, nb), PDX_OK);
		for (uint32_t i = 0; i < a; i++)
			cudaMemcpy(da_[i], ha_[i], len / a,
				   cudaMemcpyHostToDevice);
		CHECK_EQ(pdx_kv_heads_reshard_cpu(&s, a,
						  (const void *const *)ha_, b,
						  hb_, nb),
			 PDX_OK);
		CHECK_EQ(pdx_kv_heads_reshard_cuda(&s, a,
						   (const void *const *)da_,
						   b, db_, nb, NULL),
			 PDX_OK);
		cudaDeviceSynchronize();
		for (uint32_t i = 0; i < b; i++) {
			CHECK(dev_same(db_[i], hb_[i], len / b));
			free(hb_[i]);
			cudaFree(db_[i]);
		}
		for (uint32_t i = 0; i < a; i++) {
			free(ha_[i]);
			cudaFree(da_[i]);
		}
	}
	if (check_failures)
		fprintf(stderr,
			"round %d: layers %u tensors %u blocks %u T %u H %u D %u dt %u order %d n %u\n",
			round, p.l.layers, p.l.tensors, p.l.blocks,
			p.l.block_tokens, p.l.kv_heads, p.l.head_dim,
			p.l.dtype_bytes, p.l.order, n);
	free(hs);
	free(hp);
	free(h1);
	free(h2);
	cudaFree(ds);
	cudaFree(dp);
	pool_free(&p);
}

/* n distinct block ids below blocks, in random order. */
static void distinct(uint32_t *ids, uint32_t n, uint32_t blocks)
{
	uint32_t all[MAX_BLOCKS];

	for (uint32_t i = 0; i < blocks; i++)
		all[i] = i;
	for (uint32_t i = blocks; i > 1; i--) {
		uint32_t j = (uint32_t)(rnd() % i), x = all[i - 1];

		all[i - 1] = all[j];
		all[j] = x;
	}
	memcpy(ids, all, n * sizeof(*ids));
}

/* A random non-empty range of segs segments. */
static void range(uint64_t segs, uint64_t *first, uint64_t *count)
{
	*count = 1 + rnd() % segs;
	*first = rnd() % (segs - *count + 1);
}

/* Plans that do not fit each other or the range asked for. */
static void plan_errors(struct pool *a, struct pdx_kv_plan *pa,
			const uint32_t *ia, uint32_t n, uint8_t *d)
{
	struct pdx_kv_layout wide = a->l;
	struct pdx_kv_region wkv = { &wide, a->d, 2 };
	struct pdx_kv_plan *pz = NULL, *pw = NULL;
	struct pdx_kv_plan *out = (struct pdx_kv_plan *)&wide;
	uint64_t segs = pdx_kv_plan_segments(pa);
	uint32_t bad[1] = { a->l.blocks };

	/* past the end, wrapping around, NULL staging; empty is fine */
	CHECK_EQ(pdx_kv_plan_gather_cuda(pa, segs, 1, d, NULL), PDX_EINVAL);
	CHECK_EQ(pdx_kv_plan_gather_cuda(pa, 1, UINT64_MAX, d, NULL),
		 PDX_EINVAL);
	CHECK_EQ(pdx_kv_plan_scatter_cuda(pa, 0, segs + 1, d, NULL),
		 PDX_EINVAL);
	CHECK_EQ(pdx_kv_plan_gather_cuda(pa, 0, 1, NULL, NULL), PDX_EINVAL);
	CHECK_EQ(pdx_kv_plan_copy_cuda(pa, pa, segs - 1, 2, NULL), PDX_EINVAL);
	CHECK_EQ(pdx_kv_plan_gather_cuda(pa, segs, 0, d, NULL), PDX_OK);
	/* fewer segments (none), wider segments */
	CHECK_EQ(pdx_kv_plan_new_cuda(&a->dkv, ia, 0, &pz), PDX_OK);
	CHECK_EQ(pdx_kv_plan_segments(pz), 0);
	CHECK_EQ(pdx_kv_plan_copy_cuda(pa, pz, 0, 1, NULL), PDX_EINVAL);
	CHECK_EQ(pdx_kv_plan_copy_cuda(pz, pa, 0, 0, NULL), PDX_EINVAL);
	wide.head_dim++;
	CHECK_EQ(pdx_kv_plan_new_cuda(&wkv, ia, n, &pw), PDX_OK);
	CHECK_EQ(pdx_kv_plan_segments(pw), segs);
	CHECK(pdx_kv_plan_segment_bytes(pw) != pdx_kv_plan_segment_bytes(pa));
	CHECK_EQ(pdx_kv_plan_copy_cuda(pa, pw, 0, 1, NULL), PDX_EINVAL);
	CHECK_EQ(pdx_kv_plan_copy_cuda(pw, pa, 0, 1, NULL), PDX_EINVAL);
	CHECK_EQ(pdx_kv_plan_copy_cuda(NULL, pa, 0, 0, NULL), PDX_EINVAL);
	/* a block id past the pool; no output: *out untouched */
	CHECK_EQ(pdx_kv_plan_new_cuda(&a->dkv, bad, 1, &out), PDX_ERANGE);
	CHECK(out == (struct pdx_kv_plan *)&wide);
	CHECK_EQ(pdx_kv_plan_new_cuda(&a->dkv, ia, n, NULL), PDX_EINVAL);
	pdx_kv_plan_free_cuda(NULL);
	pdx_kv_plan_free_cuda(pz);
	pdx_kv_plan_free_cuda(pw);
}

/* A random piece of a block of bb bytes: groups of rows of len bytes
 * (a group's rows end to end with their gaps, the next group after). */
static struct pdx_kv_piece piece_in(uint64_t bb)
{
	struct pdx_kv_piece pc = { .rows = 1 + (uint32_t)(rnd() % 3),
				   .groups = 1 + (uint32_t)(rnd() % 2) };
	uint64_t share = bb / (pc.rows * pc.groups), ext;

	if (!share) {
		pc.rows = pc.groups = 1;
		share = bb;
	}
	pc.len = 1 + rnd() % share;
	pc.src_stride = pc.len + rnd() % (share - pc.len + 1);
	pc.dst_stride = pc.len + rnd() % (share - pc.len + 1);
	pc.src_group = pc.rows * pc.src_stride;
	pc.dst_group = pc.rows * pc.dst_stride;
	ext = (pc.groups - 1) * pc.src_group + (pc.rows - 1) * pc.src_stride +
	      pc.len;
	pc.src_off = rnd() % (bb - ext + 1);
	ext = (pc.groups - 1) * pc.dst_group + (pc.rows - 1) * pc.dst_stride +
	      pc.len;
	pc.dst_off = rnd() % (bb - ext + 1);
	return pc;
}

/* The piece of segments [first, first + count) of staging hs into hd. */
static void piece_cpu(const struct pdx_kv_piece *pc, const uint8_t *hs,
		      uint8_t *hd, uint64_t bb, uint64_t first, uint64_t count)
{
	uint64_t src, dst;

	for (uint64_t s = first; s < first + count; s++)
		for (uint64_t k = 0; k < (uint64_t)pc->groups * pc->rows; k++) {
			pdx_kv_piece_row(pc, k, &src, &dst);
			memcpy(hd + s * bb + dst, hs + s * bb + src, pc->len);
		}
}

/* Piece pc of every one of segs segments of plan pa into plan pw on st,
 * pool w's device memory then equal to its host copy (which holds what
 * the piece should have written); then pw, hw and w go. */
static void piece_checked(struct pdx_kv_plan *pa, struct pdx_kv_plan *pw,
			  const struct pdx_kv_piece *pc, uint64_t segs,
			  cudaStream_t st, struct pool *w, uint8_t *hw)
{
	if (pw) {
		CHECK_EQ(pdx_kv_plan_copy_piece_cuda(pa, pw, pc, 0, segs, st),
			 PDX_OK);
		CHECK_EQ(cudaStreamSynchronize(st), cudaSuccess);
		CHECK(pool_same(w));
	}
	pdx_kv_plan_free_cuda(pw);
	free(hw);
	pool_free(w);
}

/* A TP leg's heads, as the cuda-ipc path copies them: a's blocks (staging
 * ha, its plan pa) into rank 1's half of the heads of a pool whose blocks
 * hold twice a's (TP 2 -> 1: segment bytes differ); one row per block in
 * HND, one per token in NHD. Nothing else of that pool is written. */
static void tp_piece(struct pool *a, struct pdx_kv_plan *pa, const uint8_t *ha,
		     uint32_t n, cudaStream_t st)
{
	struct pdx_kv_layout wide = a->l;
	struct pdx_kv_plan *pw = NULL;
	struct pdx_kv_piece pc = { 0 };
	struct pool w;
	uint32_t iw[MAX_BLOCKS];
	uint64_t head = (uint64_t)a->l.head_dim * a->l.dtype_bytes;
	uint64_t bb = pdx_kv_layout_block_bytes(&a->l), bw, segs;
	uint8_t *hw;

	wide.kv_heads *= 2;
	if (pool_new(&w, &wide, n)) {
		CHECK(!"device allocation");
		return;
	}
	distinct(iw, n, w.l.blocks);
	bw = pdx_kv_layout_block_bytes(&w.l);
	segs = pdx_kv_plan_segments(pa);
	if (a->l.order == PDX_KV_HND) {
		pc = (struct pdx_kv_piece){ .rows = 1, .groups = 1,
					    .len = bb,
					    .dst_off = bb };
	} else {
		pc = (struct pdx_kv_piece){ .rows = a->l.block_tokens,
					    .groups = 1,
					    .len = a->l.kv_heads * head,
					    .src_stride = a->l.kv_heads * head,
					    .dst_stride = w.l.kv_heads * head,
					    .dst_off = a->l.kv_heads * head };
	}
	hw = malloc(segs * bw);
	CHECK_EQ(pdx_kv_plan_new_cuda(&w.dkv, iw, n, &pw), PDX_OK);
	CHECK_EQ(pdx_kv_gather_cpu(&w.hkv, iw, n, hw), PDX_OK);
	for (uint64_t s = 0; s < segs; s++)
		for (uint32_t r = 0; r < pc.rows; r++)
			memcpy(hw + s * bw + pc.dst_off + r * pc.dst_stride,
			       ha + s * bb + pc.src_off + r * pc.src_stride,
			       pc.len);
	CHECK_EQ(pdx_kv_scatter_cpu(&w.hkv, iw, n, hw), PDX_OK);
	piece_checked(pa, pw, &pc, segs, st, &w, hw);
}

/* Blocks converted to the other order, as the cuda-ipc path copies them
 * (docs/protocol.md, "Converting the order"): a's blocks (staging ha, its
 * plan pa) into a pool of the same shape in the other order, one piece a
 * block of a row per head and token in a's order (agent/tp_slice.c: NHD
 * a group per token, HND a group per head), against
 * pdx_kv_permute_cpu(). */
static void order_piece(struct pool *a, struct pdx_kv_plan *pa,
			const uint8_t *ha, uint32_t n, cudaStream_t st)
{
	struct pdx_kv_layout other = a->l;
	struct pdx_kv_shape shape = pdx_kv_shape_of(&a->l);
	struct pdx_kv_plan *pw = NULL;
	struct pool w;
	uint32_t iw[MAX_BLOCKS], H = a->l.kv_heads, T = a->l.block_tokens;
	uint64_t head = (uint64_t)a->l.head_dim * a->l.dtype_bytes;
	uint64_t bb = pdx_kv_layout_block_bytes(&a->l), segs;
	/* NHD: a token's heads side by side; HND: a head's tokens */
	uint64_t nhd_tok = H * head, nhd_head = head;
	uint64_t hnd_tok = head, hnd_head = T * head;
	bool from_nhd = a->l.order == PDX_KV_NHD;
	struct pdx_kv_piece pc = {
		.len = head,
		.groups = from_nhd ? T : H,
		.rows = from_nhd ? H : T,
		.src_group = from_nhd ? nhd_tok : hnd_head,
		.dst_group = from_nhd ? hnd_tok : nhd_head,
		.src_stride = from_nhd ? nhd_head : hnd_tok,
		.dst_stride = from_nhd ? hnd_head : nhd_tok,
	};
	uint8_t *hw;

	other.order = from_nhd ? PDX_KV_HND : PDX_KV_NHD;
	if (pool_new(&w, &other, n)) {
		CHECK(!"device allocation");
		return;
	}
	distinct(iw, n, w.l.blocks);
	segs = pdx_kv_plan_segments(pa);
	hw = malloc(segs * bb);
	for (uint64_t s = 0; s < segs; s++)
		pdx_kv_permute_cpu(&shape, ha + s * bb, hw + s * bb, 1);
	CHECK_EQ(pdx_kv_scatter_cpu(&w.hkv, iw, n, hw), PDX_OK);
	CHECK_EQ(pdx_kv_plan_new_cuda(&w.dkv, iw, n, &pw), PDX_OK);
	piece_checked(pa, pw, &pc, segs, st, &w, hw);
}

/* Plan gather, scatter and copy of random segment ranges against the
 * matching slice of the CPU gather and scatter, and a whole copy against
 * pdx_kv_copy_cpu(), between two pools of the same shape laid out
 * otherwise, on a stream of their own. */
static void plans(int round)
{
	struct pool a, b;
	struct pdx_kv_plan *pa = NULL, *pb = NULL;
	uint32_t ia[MAX_BLOCKS], ib[MAX_BLOCKS], n;
	uint64_t bb, segs, per, len, first = 0, count = 0;
	uint8_t *ha, *hb, *hr, *d;
	cudaStream_t st;

	if (pool_new(&a, NULL, 0)) {
		CHECK(!"device allocation");
		return;
	}
	n = 1 + (uint32_t)(rnd() % a.l.blocks);
	if (pool_new(&b, &a.l, n)) {
		CHECK(!"device allocation");
		return;
	}
	distinct(ia, n, a.l.blocks);
	distinct(ib, n, b.l.blocks);
	bb = pdx_kv_layout_block_bytes(&a.l);
	per = (uint64_t)a.l.tensors * n;
	segs = a.l.layers * per;
	len = segs * bb;
	ha = malloc(len);
	hb = malloc(len);
	hr = malloc(len);
	cudaMalloc((void **)&d, len);
	cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
	CHECK_EQ(pdx_kv_plan_new_cuda(&a.dkv, ia, n, &pa), PDX_OK);
	CHECK_EQ(pdx_kv_plan_new_cuda(&b.dkv, ib, n, &pb), PDX_OK);
	if (!pa || !pb)
		goto out;
	CHECK_EQ(pdx_kv_plan_segments(pa), segs);
	CHECK_EQ(pdx_kv_plan_segment_bytes(pa), bb);

	/* gather layer by layer, as the agent does */
	CHECK_EQ(pdx_kv_gather_cpu(&a.hkv, ia, n, ha), PDX_OK);
	for (uint32_t l = 0; l < a.l.layers; l++)
		CHECK_EQ(pdx_kv_plan_gather_cuda(pa, l * per, per,
						 d + l * per * bb, st),
			 PDX_OK);
	cudaStreamSynchronize(st);
	CHECK(dev_same(d, ha, len));
	/* a range lands at offset 0 and writes nothing past its end */
	range(segs, &first, &count);
	cudaMemsetAsync(d, 0xa5, len, st);
	memset(hr, 0xa5, len);
	memcpy(hr, ha + first * bb, count * bb);
	CHECK_EQ(pdx_kv_plan_gather_cuda(pa, first, count, d, st), PDX_OK);
	cudaStreamSynchronize(st);
	CHECK(dev_same(d, hr, len));

	/* scatter new bytes into a range */
	range(segs, &first, &count);
	for (uint64_t i = 0; i < count * bb; i++)
		hr[i] = (uint8_t)rnd();
	/* on st: a pageable cudaMemcpy may return before its DMA is done */
	cudaMemcpyAsync(d, hr, count * bb, cudaMemcpyHostToDevice, st);
	CHECK_EQ(pdx_kv_plan_scatter_cuda(pa, first, count, d, st), PDX_OK);
	cudaStreamSynchronize(st);
	memcpy(ha + first * bb, hr, count * bb);
	CHECK_EQ(pdx_kv_scatter_cpu(&a.hkv, ia, n, ha), PDX_OK);
	CHECK(pool_same(&a));

	/* copy a range into b, then all of it */
	range(segs, &first, &count);
	CHECK_EQ(pdx_kv_gather_cpu(&b.hkv, ib, n, hb), PDX_OK);
	memcpy(hb + first * bb, ha + first * bb, count * bb);
	CHECK_EQ(pdx_kv_scatter_cpu(&b.hkv, ib, n, hb), PDX_OK);
	CHECK_EQ(pdx_kv_plan_copy_cuda(pa, pb, first, count, st), PDX_OK);
	cudaStreamSynchronize(st);
	CHECK(pool_same(&b));
	CHECK_EQ(pdx_kv_copy_cpu(&a.hkv, ia, &b.hkv, ib, n), PDX_OK);
	CHECK_EQ(pdx_kv_plan_copy_cuda(pa, pb, 0, segs, st), PDX_OK);
	cudaStreamSynchronize(st);
	CHECK(pool_same(&b));
	CHECK(pool_same(&a));

	/* a piece of each segment of a range (a TP leg's heads), after new
	 * bytes in a, and nothing else of b written */
	for (uint64_t i = 0; i < len; i++)
		ha[i] = (uint8_t)rnd();
	CHECK_EQ(pdx_kv_scatter_cpu(&a.hkv, ia, n, ha), PDX_OK);
	cudaMemcpyAsync(d, ha, len, cudaMemcpyHostToDevice, st);
	CHECK_EQ(pdx_kv_plan_scatter_cuda(pa, 0, segs, d, st), PDX_OK);
	range(segs, &first, &count);
	{
		struct pdx_kv_piece pc = piece_in(bb), bad = pc;

		CHECK_EQ(pdx_kv_gather_cpu(&b.hkv, ib, n, hb), PDX_OK);
		piece_cpu(&pc, ha, hb, bb, first, count);
		CHECK_EQ(pdx_kv_scatter_cpu(&b.hkv, ib, n, hb), PDX_OK);
		CHECK_EQ(pdx_kv_plan_copy_piece_cuda(pa, pb, &pc, first, count,
						     st),
			 PDX_OK);
		cudaStreamSynchronize(st);
		CHECK(pool_same(&b));
		bad.dst_off = bb - pc.len + 1; /* its last byte past the block */
		CHECK_EQ(pdx_kv_plan_copy_piece_cuda(pa, pb, &bad, 0, 1, st),
			 PDX_EINVAL);
		bad = pc;
		bad.rows = 0;
		CHECK_EQ(pdx_kv_plan_copy_piece_cuda(pa, pb, &bad, 0, 1, st),
			 PDX_EINVAL);
		bad = pc;
		bad.groups = 0;
		CHECK_EQ(pdx_kv_plan_copy_piece_cuda(pa, pb, &bad, 0, 1, st),
			 PDX_EINVAL);
	}

	tp_piece(&a, pa, ha, n, st);
	order_piece(&a, pa, ha, n, st);
	plan_errors(&a, pa, ia, n, d);
	cudaDeviceSynchronize();
out:
	if (check_failures)
		fprintf(stderr,
			"plans round %d: layers %u tensors %u blocks %u/%u bb %llu n %u range %llu+%llu\n",
			round, a.l.layers, a.l.tensors, a.l.blocks, b.l.blocks,
			(unsigned long long)bb, n, (unsigned long long)first,
			(unsigned long long)count);
	pdx_kv_plan_free_cuda(pa);
	pdx_kv_plan_free_cuda(pb);
	cudaStreamDestroy(st);
	cudaFree(d);
	free(ha);
	free(hb);
	free(hr);
	pool_free(&a);
	pool_free(&b);
}

/* The engine's forward pass: holds its stream until the test lets go. */
static atomic_int engine_done;

static void CUDART_CB engine_busy(void *arg)
{
	while (!atomic_load(&engine_done))
		usleep(100);
}

static void blocked(int sig)
{
	static const char msg[] = "plan call blocked behind the engine\n";

	(void)!write(2, msg, sizeof(msg) - 1);
	_exit(1);
}

/* The agent's use: its stream waits for the engine's "layer computed"
 * event. Building a plan, launching with it, freeing another, and a one-
 * shot gather (whose plan is freed behind the wait) must all return while
 * the engine is still busy. */
static void no_wait_for_engine(void)
{
	struct pool p;
	struct pdx_kv_plan *old = NULL, *pl = NULL;
	uint32_t ids[MAX_BLOCKS], n;
	uint64_t len;
	uint8_t *hs, *d1, *d2;
	cudaStream_t engine, agent;
	cudaEvent_t layer;

	if (pool_new(&p, NULL, 0)) {
		CHECK(!"device allocation");
		return;
	}
	n = p.l.blocks;
	distinct(ids, n, n);
	len = (uint64_t)p.l.layers * p.l.tensors * n *
	      pdx_kv_layout_block_bytes(&p.l);
	hs = malloc(len);
	cudaMalloc((void **)&d1, len);
	cudaMalloc((void **)&d2, len);
	cudaStreamCreateWithFlags(&engine, cudaStreamNonBlocking);
	cudaStreamCreateWithFlags(&agent, cudaStreamNonBlocking);
	cudaEventCreateWithFlags(&layer, cudaEventDisableTiming);
	CHECK_EQ(pdx_kv_plan_new_cuda(&p.dkv, ids, n, &old), PDX_OK);

	atomic_store(&engine_done, 0);
	CHECK_EQ(cudaLaunchHostFunc(engine, engine_busy, NULL), cudaSuccess);
	cudaEventRecord(layer, engine);
	cudaStreamWaitEvent(agent, layer, 0);
	signal(SIGALRM, blocked);
	alarm(30);
	CHECK_EQ(pdx_kv_gather_cuda(&p.dkv, ids, n, d1, agent), PDX_OK);
	CHECK_EQ(pdx_kv_plan_new_cuda(&p.dkv, ids, n, &pl), PDX_OK);
	CHECK_EQ(pdx_kv_plan_gather_cuda(pl, 0, pdx_kv_plan_segments(pl), d2,
					 agent),
		 PDX_OK);
	pdx_kv_plan_free_cuda(old);
	CHECK_EQ(cudaStreamQuery(agent), cudaErrorNotReady);
	alarm(0);
	atomic_store(&engine_done, 1);
	CHECK_EQ(cudaStreamSynchronize(agent), cudaSuccess);
	CHECK_EQ(pdx_kv_gather_cpu(&p.hkv, ids, n, hs), PDX_OK);
	CHECK(dev_same(d1, hs, len));
	CHECK(dev_same(d2, hs, len));
	pdx_kv_plan_free_cuda(pl);
	cudaEventDestroy(layer);
	cudaStreamDestroy(agent);
	cudaStreamDestroy(engine);
	cudaFree(d1);
	cudaFree(d2);
	free(hs);
	pool_free(&p);
}

int main(void)
{
	int count = 0, gate;

	gate = gpu_test_gate(cudaGetDeviceCount(&count), count);
	if (gate) {
		printf("no CUDA device: %s\n", gate == 77 ? "skipped" : "FAIL");
		return gate;
	}
	for (int i = 0; i < 200 && !check_failures; i++)
		one_layout(i);
	for (int i = 0; i < 200 && !check_failures; i++)
		plans(i);
	no_wait_for_engine();
	CHECK_DONE();
}
