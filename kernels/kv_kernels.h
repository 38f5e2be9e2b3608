/* KV kernels: move a transfer's paged blocks between an engine's KV pool
 * and a contiguous staging buffer, reorder and reshard them, fill and
 * checksum them. Each has a CPU reference (kernels/<name>_cpu.c, always built)
 * and a CUDA version (kernels/<name>.cu, built where nvcc is installed) with the
 * same contract; tests/gpu compares the two.
 *
 * Staging order. A transfer of n blocks (ids blocks[0..n)) is gathered
 * layer-major: the bytes of block blocks[i] of tensor t of layer l land at
 *
 *     ((l * tensors + t) * n + i) * block_bytes
 *
 * so one layer (all its tensors) is one contiguous run and can be sent as
 * soon as that layer is ready. MLA layouts (tensors == 1) have one latent
 * tensor per layer and fall out of the same formula. A staging buffer is
 * therefore layers * tensors * n "staging blocks" of block_bytes each, and
 * the buffer functions below (permute, reshard, hashes) take such a run.
 *
 * Memory. Every pointer belongs to the caller. The CPU functions take host
 * pointers; the CUDA ones take device pointers for the KV bytes and the
 * staging buffers, host pointers for the small tables (block ids, region
 * bases, shard pointer arrays), and a cudaStream_t passed as void * (NULL
 * is the legacy default stream). The CUDA functions are asynchronous with
 * respect to the host except where they return results in host memory
 * (the hashes), which synchronise the stream. Source and destination must
 * not overlap. Any thread may call them; they keep no state, apart from
 * plans (below), which the caller owns.
 */
#ifndef PDX_KERNELS_KV_KERNELS_H
#define PDX_KERNELS_KV_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <pdx/layout.h>
#include <pdx/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A paged KV pool in one address space: its layout and the base address of
 * each region the layout's pdx_kv_ref.region indexes. */
struct pdx_kv_region {
	const struct pdx_kv_layout *layout;
	uint8_t *const *base; /* n_regions entries */
	uint32_t n_regions;
};

/* The shape of one block: what permute and reshard need to know. */
struct pdx_kv_shape {
	uint32_t block_tokens;
	uint32_t kv_heads;
	uint32_t head_dim;
	uint32_t dtype_bytes;
	enum pdx_kv_order order;
};

/* The shape of l's blocks. */
struct pdx_kv_shape pdx_kv_shape_of(const struct pdx_kv_layout *l);

/* Bytes of one block of that shape. */
uint64_t pdx_kv_shape_bytes(const struct pdx_kv_shape *s);

/* Checks that every block id is below layout->blocks, every region index
 * below n_regions and the layout's shape is valid. Returns PDX_OK,
 * PDX_EINVAL (shape) or PDX_ERANGE (block id, region). Does not check that
 * the regions are large enough: that is pdx_kv_layout_check()'s job. */
pdx_status_t pdx_kv_region_check(const struct pdx_kv_region *kv,
				 const uint32_t *blocks, uint32_t n);

/* The first byte of block `block` of tensor t of layer l (host side). */
static inline uint8_t *pdx_kv_block_ptr(const struct pdx_kv_region *kv,
					uint32_t l, uint32_t t, uint32_t block)
{
	const struct pdx_kv_layer *ly = &kv->layout->layer[l];

	return kv->base[ly->base[t].region] + ly->base[t].offset +
	       (uint64_t)block * ly->block_stride;
}

/* One block of one tensor of one layer, as the CPU functions walk them:
 * staging segment `index` = (layer * tensors + tensor) * n + i holds
 * blocks[i] (= block), whose bytes start at p in the pool. */
struct pdx_kv_seg {
	uint8_t *p;
	uint64_t index, bytes;
	uint32_t layer, tensor, i, block;
};

/* Checks kv and blocks (pdx_kv_region_check) and calls fn for every
 * segment of blocks[0..n), in staging order. */
pdx_status_t pdx_kv_each_segment(const struct pdx_kv_region *kv,
				 const uint32_t *blocks, uint32_t n,
				 void (*fn)(const struct pdx_kv_seg *sg,
					    void *arg),
				 void *arg);

/* ---- gather / scatter ---------------------------------------------- */

/* Copies blocks[0..n) of every layer and tensor into staging, in staging
 * order (above). staging holds layers * tensors * n * block_bytes bytes. */
pdx_status_t pdx_kv_gather_cpu(const struct pdx_kv_region *kv,
			       const uint32_t *blocks, uint32_t n,
			       void *staging);

/* The inverse: writes staging back into blocks[0..n); no other byte of
 * the pool is written. */
pdx_status_t pdx_kv_scatter_cpu(const struct pdx_kv_region *kv,
				const uint32_t *blocks, uint32_t n,
				const void *staging);

/* Copies blocks src_blocks[0..n) of src to dst_blocks[0..n) of dst, block
 * by block, in every layer and tensor: the same bytes as gathering from
 * src and scattering into dst. The pools may differ in regions, offsets,
 * strides and block count, not in layers, tensors or block bytes
 * (PDX_EINVAL); PDX_ERANGE as gather. */
pdx_status_t pdx_kv_copy_cpu(const struct pdx_kv_region *src,
			     const uint32_t *src_blocks,
			     const struct pdx_kv_region *dst,
			     const uint32_t *dst_blocks, uint32_t n);

/* ---- permute ------------------------------------------------------- */

/* Rewrites nblocks consecutive blocks of shape s from s->order to the
 * other order (NHD [tokens][heads][dim] <-> HND [heads][tokens][dim]),
 * src to dst. Applying it twice (the second time with the other order) is
 * the identity. With one head both orders are the same bytes. */
void pdx_kv_permute_cpu(const struct pdx_kv_shape *s, const void *src,
			void *dst, uint64_t nblocks);

/* ---- heads: split, merge, reshard ---------------------------------- */

/* Tensor parallelism shards KV heads evenly: of H heads, rank r of a TP=a
 * instance holds heads [r * H / a, (r + 1) * H / a), in the same order
 * (NHD or HND) with kv_heads = H / a.
 *
 * pdx_kv_heads_reshard_cpu() turns the a shards of nblocks blocks each
 * (src[0..a), shard shape: full_heads / a heads) into the b shards of a
 * TP=b instance (dst[0..b), full_heads / b heads each). s describes the
 * full block (s->kv_heads == H); a and b must both divide H. Returns
 * PDX_EINVAL otherwise. Split is a = 1, merge is b = 1; any other pair
 * (2 -> 4, 4 -> 2, 2 -> 3 with H = 6) is the same function. MLA's latent
 * tensor is replicated, not sharded: do not reshard it. */
pdx_status_t pdx_kv_heads_reshard_cpu(const struct pdx_kv_shape *s,
				      uint32_t a, const void *const *src,
				      uint32_t b, void *const *dst,
				      uint64_t nblocks);

/* One full block run (s->kv_heads heads) into parts shards. */
pdx_status_t pdx_kv_heads_split_cpu(const struct pdx_kv_shape *s,
				    const void *src, uint32_t parts,
				    void *const *dst, uint64_t nblocks);

/* parts shards into one full block run: the inverse of split. */
pdx_status_t pdx_kv_heads_merge_cpu(const struct pdx_kv_shape *s,
				    uint32_t parts, const void *const *src,
				    void *dst, uint64_t nblocks);

/* ---- fill and checksum --------------------------------------------- */

/* splitmix64's finaliser: a bijection of 64-bit words. */
static inline uint64_t pdx_kv_mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* Deterministic fill. Byte o of block `block` of tensor t of layer l is
 *
 *     key  = mix64(seed ^ mix64((l << 40) ^ (t << 32) ^ block))
 *     word = mix64(key + (o >> 3))
 *     byte = (word >> (8 * (o & 7))) & 0xff
 *
 * i.e. little-endian 8-byte words of a counter-mode stream keyed by
 * (seed, layer, tensor, block id). The block id is the pool's id, so a
 * receiver checks a transfer by filling a staging buffer with the
 * sender's ids. */
static inline uint8_t pdx_kv_fill_byte(uint64_t seed, uint32_t layer,
				       uint32_t tensor, uint32_t block,
				       uint64_t o)
{
	uint64_t key = pdx_kv_mix64(seed ^ pdx_kv_mix64(((uint64_t)layer << 40) ^
						      ((uint64_t)tensor << 32) ^
						      block));

	return (uint8_t)(pdx_kv_mix64(key + (o >> 3)) >> (8 * (o & 7)));
}

/* Fills blocks[0..n) of every layer and tensor of the pool. */
pdx_status_t pdx_kv_fill_cpu(const struct pdx_kv_region *kv,
			     const uint32_t *blocks, uint32_t n,
			     uint64_t seed);

/* Writes, in staging order, what pdx_kv_gather_cpu() would read from a pool
 * whose blocks[0..n) were filled with seed (only l's shape is used). */
void pdx_kv_fill_staging_cpu(const struct pdx_kv_layout *l,
			     const uint32_t *blocks, uint32_t n,
			     uint64_t seed, void *staging);

/* Block hash. For a block of len bytes, w_k its k-th little-endian 8-byte
 * word (the last one zero-padded):
 *
 *     hash = mix64(len) + sum_k mix64(w_k + k * 0x9e3779b97f4a7c15)  (mod 2^64)
 *
 * A sum of bijections of (word, position): any change to one word changes
 * the hash, and the terms can be summed in any order (a parallel
 * reduction gives the same result as a loop). */
uint64_t pdx_kv_block_hash(const void *p, uint64_t len);

/* Hashes of nblocks consecutive blocks of block_bytes each, into out. */
void pdx_kv_buf_hashes_cpu(const void *buf, uint64_t block_bytes,
			   uint64_t nblocks, uint64_t *out);

/* Hashes of blocks[0..n) of every layer and tensor, in staging order
 * (out has layers * tensors * n entries): the same values as
 * pdx_kv_buf_hashes_cpu() on the gathered staging buffer. */
pdx_status_t pdx_kv_hashes_cpu(const struct pdx_kv_region *kv,
			       const uint32_t *blocks, uint32_t n,
			       uint64_t *out);

/* A transfer's checksum from its block hashes, order-sensitive:
 *     c = 0xcbf29ce484222325; for each h: c = (c ^ h) * 0x100000001b3;
 *     return mix64(c ^ count)
 * (FNV-1a over 64-bit words). */
uint64_t pdx_kv_checksum_combine(const uint64_t *hashes, uint64_t count);

/* ---- CUDA (kernels/<name>.cu; link pdx_kernels_cuda) -------------------- */

/* The same contracts as the _cpu functions, with device pointers for KV
 * bytes (kv->base[], staging, src, dst) and host pointers for blocks[],
 * the shard pointer arrays and out[]. Return PDX_EIO on a CUDA error
 * (launch or allocation), PDX_EINVAL/PDX_ERANGE as the CPU ones. A
 * launch reads and drops the calling thread's last CUDA error first
 * (cudaGetLastError), so an earlier call that failed is not reported as
 * the launch's failure.
 *
 * gather, scatter and fill build a plan (below) for the call: they block
 * for its upload, which waits for nothing queued on any other stream, then
 * queue their work and the plan's release on `stream`. Per-layer callers
 * should hold a plan instead. */
pdx_status_t pdx_kv_gather_cuda(const struct pdx_kv_region *kv,
				const uint32_t *blocks, uint32_t n,
				void *staging, void *stream);
pdx_status_t pdx_kv_scatter_cuda(const struct pdx_kv_region *kv,
				 const uint32_t *blocks, uint32_t n,
				 const void *staging, void *stream);
pdx_status_t pdx_kv_permute_cuda(const struct pdx_kv_shape *s,
				 const void *src, void *dst, uint64_t nblocks,
				 void *stream);
pdx_status_t pdx_kv_heads_reshard_cuda(const struct pdx_kv_shape *s,
				       uint32_t a, const void *const *src,
				       uint32_t b, void *const *dst,
				       uint64_t nblocks, void *stream);
pdx_status_t pdx_kv_fill_cuda(const struct pdx_kv_region *kv,
			      const uint32_t *blocks, uint32_t n,
			      uint64_t seed, void *stream);
/* Synchronises the stream: out[] is host memory. */
pdx_status_t pdx_kv_buf_hashes_cuda(const void *buf, uint64_t block_bytes,
				    uint64_t nblocks, uint64_t *out,
				    void *stream);

/* ---- plans (kernels/plan.cu) ------------------------------------------ */

/* A set of blocks of one pool (kv, blocks[0..n)) resolved once on the
 * device: what a per-layer gather, scatter or copy needs, so those launch
 * with nothing to upload and never synchronise. A plan holds the segments
 * of the staging order above, segment s = (l * tensors + t) * n + i being
 * block blocks[i] of tensor t of layer l, so layer l is the segments
 * [l * tensors * n, (l + 1) * tensors * n).
 *
 * pdx_kv_plan_new_cuda() checks kv and blocks as pdx_kv_region_check()
 * (PDX_EINVAL, PDX_ERANGE; n may be 0) and builds the plan on the calling
 * thread's current device: synchronously, on a private non-blocking stream
 * and from a memory pool of its own, so it never waits for work queued on
 * other streams. The plan records the pool's addresses, not kv or blocks,
 * which the caller may free on return; the pool's memory must outlive the
 * plan. Returns PDX_ENOMEM or PDX_EIO (CUDA) on failure, and sets *out
 * only on success.
 *
 * A plan is immutable: any thread may launch with it, on any stream of its
 * device, concurrently. Free it only after all work using it has
 * completed (an event or stream synchronised, not merely queued);
 * pdx_kv_plan_free_cuda() does not wait for other streams either.
 *
 * The launches below queue one kernel on `stream` (a cudaStream_t; NULL is
 * the legacy default stream) and return: no allocation, no copy, no
 * synchronisation. They return PDX_EINVAL when [first, first + count) is
 * not within the plan's segments (count 0 is a no-op) or a plan or
 * staging pointer is NULL, PDX_EIO when the launch fails; errors while the
 * kernel runs surface on the stream. */
struct pdx_kv_plan;

pdx_status_t pdx_kv_plan_new_cuda(const struct pdx_kv_region *kv,
				  const uint32_t *blocks, uint32_t n,
				  struct pdx_kv_plan **out);
void pdx_kv_plan_free_cuda(struct pdx_kv_plan *p); /* NULL-safe */
/* layers * tensors * n */
uint64_t pdx_kv_plan_segments(const struct pdx_kv_plan *p);
/* the block bytes */
uint64_t pdx_kv_plan_segment_bytes(const struct pdx_kv_plan *p);

/* Segments [first, first + count) into staging, which holds segment
 * `first` at offset 0 (count * segment bytes, device memory). */
pdx_status_t pdx_kv_plan_gather_cuda(const struct pdx_kv_plan *p,
				     uint64_t first, uint64_t count,
				     void *staging, void *stream);
/* The inverse: staging back into segments [first, first + count); no
 * other byte of the pool is written. With repeated block ids, which copy
 * lands is unspecified. */
pdx_status_t pdx_kv_plan_scatter_cuda(const struct pdx_kv_plan *p,
				      uint64_t first, uint64_t count,
				      const void *staging, void *stream);
/* Segment by segment, [first, first + count) of src's blocks to the same
 * segments of dst's blocks: the agent's same-host GPU path. The plans must
 * have equal segment counts and segment bytes (else PDX_EINVAL); the pools
 * may differ in regions, strides and block ids, and dst's may be another
 * process's memory opened with CUDA IPC on this device. */
pdx_status_t pdx_kv_plan_copy_cuda(const struct pdx_kv_plan *src,
				   const struct pdx_kv_plan *dst,
				   uint64_t first, uint64_t count,
				   void *stream);

/* A share of one block: groups of rows of len bytes, the first at
 * src_off and dst_off from the block's first byte on each side, the next
 * row src_stride and dst_stride further, the next group src_group and
 * dst_group further (groups and rows at least 1). A TP leg's heads
 * (docs/protocol.md, "TP legs"): HND one row, NHD one per token; between
 * an NHD and an HND block a row per head and token, in the sender's
 * order (agent/tp_slice.c). */
struct pdx_kv_piece {
	uint64_t src_off, dst_off, len;
	uint32_t rows, groups;
	uint64_t src_stride, dst_stride;
	uint64_t src_group, dst_group;
};

/* A whole block (or run of blocks) of len bytes as one piece. */
static inline struct pdx_kv_piece pdx_kv_piece_whole(uint64_t len)
{
	struct pdx_kv_piece p = { 0, 0, len, 1, 1, 0, 0, 0, 0 };

	return p;
}

/* The bytes a piece moves. */
static inline uint64_t pdx_kv_piece_bytes(const struct pdx_kv_piece *p)
{
	return (uint64_t)p->groups * p->rows * p->len;
}

/* Whether the piece's rows, from off with these steps, all end within bb
 * bytes, without wrapping (one side: src or dst). */
static inline int pdx_kv_piece_fits(const struct pdx_kv_piece *p,
				    uint64_t off, uint64_t stride,
				    uint64_t group, uint64_t bb)
{
	uint64_t r = p->rows ? p->rows - 1 : 0;
	uint64_t g = p->groups ? p->groups - 1 : 0;
	uint64_t last = off;

	if (!p->rows || !p->groups || !p->len || off > bb)
		return 0;
	if (r && stride > (bb - last) / r)
		return 0;
	last += r * stride;
	if (g && group > (bb - last) / g)
		return 0;
	last += g * group;
	return p->len <= bb - last;
}

/* Copies piece p from the block at src to the block at dst in host
 * memory, group by group, row by row (pdx_kv_piece_row()'s order). */
static inline void pdx_kv_piece_copy(uint8_t *dst, const uint8_t *src,
				     const struct pdx_kv_piece *p)
{
	/* nested, not pdx_kv_piece_row(): its divisions cost as much as a
	 * row of a few hundred bytes */
	for (uint32_t g = 0; g < p->groups; g++) {
		uint8_t *to = dst + p->dst_off + g * p->dst_group;
		const uint8_t *from = src + p->src_off + g * p->src_group;

		for (uint32_t r = 0; r < p->rows; r++)
			memcpy(to + r * p->dst_stride, from + r * p->src_stride,
			       p->len);
	}
}

enum pdx_kv_side { PDX_KV_SRC, PDX_KV_DST };

/* p with one side packed: its rows end to end from that side's first
 * byte, in p's order (pdx_kv_piece_row()'s), as a slice message carries
 * them (agent/am_slice.c). */
static inline struct pdx_kv_piece pdx_kv_piece_packed(struct pdx_kv_piece p,
						      enum pdx_kv_side side)
{
	uint64_t group = (uint64_t)p.rows * p.len;

	if (side == PDX_KV_SRC) {
		p.src_off = 0;
		p.src_stride = p.len;
		p.src_group = group;
	} else {
		p.dst_off = 0;
		p.dst_stride = p.len;
		p.dst_group = group;
	}
	return p;
}

/* Row k of a piece's groups * rows (group-major): where it lies from
 * the block's first byte on each side. */
static inline void pdx_kv_piece_row(const struct pdx_kv_piece *p, uint64_t k,
				    uint64_t *src, uint64_t *dst)
{
	uint64_t g = k / p->rows, r = k % p->rows;

	*src = p->src_off + g * p->src_group + r * p->src_stride;
	*dst = p->dst_off + g * p->dst_group + r * p->dst_stride;
}

/* pdx_kv_plan_copy_cuda() of only the piece of each segment: the plans
 * must have equal segment counts, their segment bytes may differ, and
 * the piece must lie within a segment on both sides (else PDX_EINVAL). */
pdx_status_t pdx_kv_plan_copy_piece_cuda(const struct pdx_kv_plan *src,
					 const struct pdx_kv_plan *dst,
					 const struct pdx_kv_piece *piece,
					 uint64_t first, uint64_t count,
					 void *stream);

#ifdef __cplusplus
}
#endif
#endif
