/* CPU reference: a transfer's blocks between the paged pool and a
 * contiguous staging buffer (kernels/kv_kernels.h has the order), and
 * between two pools. */
#include "kernels/kv_kernels.h"

#include <string.h>

struct pdx_kv_shape pdx_kv_shape_of(const struct pdx_kv_layout *l)
{
	struct pdx_kv_shape s = {
		.block_tokens = l->block_tokens,
		.kv_heads = l->kv_heads,
		.head_dim = l->head_dim,
		.dtype_bytes = l->dtype_bytes,
		.order = l->order,
	};

	return s;
}

uint64_t pdx_kv_shape_bytes(const struct pdx_kv_shape *s)
{
	return (uint64_t)s->block_tokens * s->kv_heads * s->head_dim *
	       s->dtype_bytes;
}

pdx_status_t pdx_kv_region_check(const struct pdx_kv_region *kv,
				 const uint32_t *blocks, uint32_t n)
{
	const struct pdx_kv_layout *l = kv->layout;

	if (!l || !l->layer || !kv->base || l->layers == 0 ||
	    l->layers > PDX_MAX_LAYERS || (l->tensors != 1 && l->tensors != 2) ||
	    !l->block_tokens || !l->kv_heads || !l->head_dim ||
	    !l->dtype_bytes ||
	    (l->order != PDX_KV_NHD && l->order != PDX_KV_HND))
		return PDX_EINVAL;
	if (n && !blocks)
		return PDX_EINVAL;
	for (uint32_t i = 0; i < l->layers; i++)
		for (uint32_t t = 0; t < l->tensors; t++)
			if (l->layer[i].base[t].region >= kv->n_regions)
				return PDX_ERANGE;
	for (uint32_t i = 0; i < n; i++)
		if (blocks[i] >= l->blocks)
			return PDX_ERANGE;
	return PDX_OK;
}

pdx_status_t pdx_kv_each_segment(const struct pdx_kv_region *kv,
				 const uint32_t *blocks, uint32_t n,
				 void (*fn)(const struct pdx_kv_seg *sg,
					    void *arg),
				 void *arg)
{
	const struct pdx_kv_layout *l = kv->layout;
	pdx_status_t st = pdx_kv_region_check(kv, blocks, n);
	struct pdx_kv_seg sg = { 0 };

	if (st)
		return st;
	sg.bytes = pdx_kv_layout_block_bytes(l);
	for (sg.layer = 0; sg.layer < l->layers; sg.layer++)
		for (sg.tensor = 0; sg.tensor < l->tensors; sg.tensor++)
			for (sg.i = 0; sg.i < n; sg.i++, sg.index++) {
				sg.block = blocks[sg.i];
				sg.p = pdx_kv_block_ptr(kv, sg.layer, sg.tensor,
							sg.block);
				fn(&sg, arg);
			}
	return PDX_OK;
}

static void gather_seg(const struct pdx_kv_seg *sg, void *staging)
{
	memcpy((uint8_t *)staging + sg->index * sg->bytes, sg->p, sg->bytes);
}

pdx_status_t pdx_kv_gather_cpu(const struct pdx_kv_region *kv,
			       const uint32_t *blocks, uint32_t n,
			       void *staging)
{
	return pdx_kv_each_segment(kv, blocks, n, gather_seg, staging);
}

static void scatter_seg(const struct pdx_kv_seg *sg, void *staging)
{
	memcpy(sg->p, (const uint8_t *)staging + sg->index * sg->bytes,
	       sg->bytes);
}

pdx_status_t pdx_kv_scatter_cpu(const struct pdx_kv_region *kv,
				const uint32_t *blocks, uint32_t n,
				const void *staging)
{
	return pdx_kv_each_segment(kv, blocks, n, scatter_seg,
				   (void *)staging);
}

struct copy_from {
	const struct pdx_kv_region *src;
	const uint32_t *blocks;
};

static void copy_seg(const struct pdx_kv_seg *sg, void *arg)
{
	const struct copy_from *c = arg;

	memcpy(sg->p,
	       pdx_kv_block_ptr(c->src, sg->layer, sg->tensor, c->blocks[sg->i]),
	       sg->bytes);
}

pdx_status_t pdx_kv_copy_cpu(const struct pdx_kv_region *src,
			     const uint32_t *src_blocks,
			     const struct pdx_kv_region *dst,
			     const uint32_t *dst_blocks, uint32_t n)
{
	const struct pdx_kv_layout *a = src->layout, *b = dst->layout;
	struct copy_from from = { src, src_blocks };
	pdx_status_t st = pdx_kv_region_check(src, src_blocks, n);

	if (!st)
		st = pdx_kv_region_check(dst, dst_blocks, n);
	if (st)
		return st;
	if (a->layers != b->layers || a->tensors != b->tensors ||
	    pdx_kv_layout_block_bytes(a) != pdx_kv_layout_block_bytes(b))
		return PDX_EINVAL;
	return pdx_kv_each_segment(dst, dst_blocks, n, copy_seg, &from);
}
