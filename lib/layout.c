#include <pdx/layout.h>

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/kv_order.h"

uint64_t pdx_kv_layout_block_bytes(const struct pdx_kv_layout *l)
{
	if (!l)
		return 0;
	return (uint64_t)l->block_tokens * l->kv_heads * l->head_dim *
	       l->dtype_bytes;
}

uint64_t pdx_kv_layout_block_bytes_all(const struct pdx_kv_layout *l)
{
	if (!l)
		return 0;
	return pdx_kv_layout_block_bytes(l) * l->layers * l->tensors;
}

/* Whether two tensors' blocks, both at stride s (>= bb) from offsets a and
 * b of one region, share a byte: block i of one starts d + k * s from
 * block j of the other (d = |a - b|, |k| < blocks), and they overlap where
 * that is under bb; only the k nearest d / s can be. */
static bool blocks_overlap(uint64_t a, uint64_t b, uint64_t s,
			   uint32_t blocks, uint64_t bb)
{
	uint64_t d = a > b ? a - b : b - a, k = d / s, rem = d % s;

	if (k >= blocks)
		return false;
	return rem < bb || (k + 1 < blocks && s - rem < bb);
}

/* No two tensors of the layout may share a byte (the KV of one would be
 * written over the other's). Checked between tensors at the same block
 * stride, as every engine's layout has them; other pairs are not. */
static pdx_status_t layout_overlap_check(const struct pdx_kv_layout *l,
					 uint64_t bb, char *err, size_t errlen)
{
	uint32_t n = l->layers * l->tensors;

	for (uint32_t x = 0; x < n; x++) {
		const struct pdx_kv_layer *lx = &l->layer[x / l->tensors];
		const struct pdx_kv_ref *rx = &lx->base[x % l->tensors];

		for (uint32_t y = x + 1; y < n; y++) {
			const struct pdx_kv_layer *ly = &l->layer[y / l->tensors];
			const struct pdx_kv_ref *ry = &ly->base[y % l->tensors];

			if (rx->region != ry->region ||
			    lx->block_stride != ly->block_stride ||
			    !blocks_overlap(rx->offset, ry->offset,
					    lx->block_stride, l->blocks, bb))
				continue;
			snprintf(err, errlen,
				 "layout.bases[%u][%u] and [%u][%u] (layer %u "
				 "tensor %u, layer %u tensor %u): their blocks "
				 "overlap in region %u",
				 x / l->tensors, x % l->tensors, y / l->tensors,
				 y % l->tensors, x / l->tensors, x % l->tensors,
				 y / l->tensors, y % l->tensors, rx->region);
			return PDX_ERANGE;
		}
	}
	return PDX_OK;
}

pdx_status_t pdx_kv_layout_check(const struct pdx_kv_layout *l,
				 const uint64_t *region_sizes, size_t n_regions,
				 char *err, size_t errlen)
{
	uint64_t bb;

	if (!l || (n_regions && !region_sizes) || (errlen && !err)) {
		if (err && errlen)
			snprintf(err, errlen, "layout: needs a layout, and "
				 "region_sizes for n_regions");
		return PDX_EINVAL;
	}
	if (l->layers == 0 || l->layers > PDX_MAX_LAYERS || !l->layer) {
		snprintf(err, errlen, "layout.layers: %u outside 1..%u",
			 l->layers, PDX_MAX_LAYERS);
		return PDX_EINVAL;
	}
	if (l->tensors != 1 && l->tensors != 2) {
		snprintf(err, errlen, "layout.tensors: %u is neither 1 (MLA) "
			 "nor 2 (K, V)", l->tensors);
		return PDX_EINVAL;
	}
	{
		const struct {
			const char *name;
			uint32_t v, max;
		} f[] = {
			{ "blocks", l->blocks, UINT32_MAX },
			{ "block_tokens", l->block_tokens, 65536 },
			{ "kv_heads", l->kv_heads, 65536 },
			{ "head_dim", l->head_dim, 65536 },
			{ "dtype_bytes", l->dtype_bytes, 16 },
		};

		for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
			if (f[i].v == 0 || f[i].v > f[i].max) {
				snprintf(err, errlen, "layout.%s: %u outside 1..%u",
					 f[i].name, f[i].v, f[i].max);
				return PDX_EINVAL;
			}
		}
	}
	if (l->order != PDX_KV_NHD && l->order != PDX_KV_HND) {
		snprintf(err, errlen, "layout.order: %d is neither NHD nor HND",
			 (int)l->order);
		return PDX_EINVAL;
	}
	bb = pdx_kv_layout_block_bytes(l);
	for (uint32_t i = 0; i < l->layers; i++) {
		const struct pdx_kv_layer *ly = &l->layer[i];

		if (ly->block_stride < bb) {
			snprintf(err, errlen,
				 "layout.strides[%u]: %llu < block bytes %llu", i,
				 (unsigned long long)ly->block_stride,
				 (unsigned long long)bb);
			return PDX_ERANGE;
		}
		for (uint32_t t = 0; t < l->tensors; t++) {
			const struct pdx_kv_ref *r = &ly->base[t];
			/* end = offset + (blocks - 1) * stride + bb, overflow-safe */
			unsigned __int128 end = (unsigned __int128)(l->blocks - 1) *
							ly->block_stride +
						r->offset + bb;

			if (r->region >= n_regions) {
				snprintf(err, errlen,
					 "layout.bases[%u][%u] (layer %u tensor %u): "
					 "region %u, but there are %zu", i, t, i,
					 t, r->region, n_regions);
				return PDX_ERANGE;
			}
			if (end > region_sizes[r->region]) {
				snprintf(err, errlen,
					 "layout.bases[%u][%u] (layer %u tensor %u): "
					 "blocks end past region %u (%llu bytes)",
					 i, t, i, t, r->region,
					 (unsigned long long)region_sizes[r->region]);
				return PDX_ERANGE;
			}
		}
	}
	return layout_overlap_check(l, bb, err, errlen);
}

static uint64_t fnv1a(uint64_t h, uint64_t v)
{
	for (int i = 0; i < 8; i++) {
		h ^= (v >> (8 * i)) & 0xff;
		h *= 0x100000001b3ULL;
	}
	return h;
}

uint64_t pdx_kv_layout_compat_hash(const struct pdx_kv_layout *l)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	if (!l)
		return 0;
	h = fnv1a(h, l->layers);
	h = fnv1a(h, l->tensors);
	h = fnv1a(h, l->block_tokens);
	h = fnv1a(h, l->kv_heads);
	h = fnv1a(h, l->head_dim);
	h = fnv1a(h, l->dtype_bytes);
	h = fnv1a(h, (uint64_t)l->order);
	return h;
}

/* A layout field's value as a refusal shows it: kinds by name ("tensors
 * 1 (MLA)", "order HND"), never an enum's number. */
static void field_value(char *buf, size_t len, const char *field, uint32_t v)
{
	if (strcmp(field, "order") == 0)
		snprintf(buf, len, "%s", pdx_kv_order_name(v));
	else if (strcmp(field, "tensors") == 0 && (v == 1 || v == 2))
		snprintf(buf, len, "%u (%s)", v, v == 1 ? "MLA" : "K and V");
	else if (strcmp(field, "dtype_bytes") == 0 && (v == 1 || v == 2 || v == 4))
		snprintf(buf, len, "%u (%s)", v,
			 v == 1 ? "8-bit: fp8, int8"
			 : v == 2 ? "16-bit: bf16, fp16" : "32-bit: fp32");
	else
		snprintf(buf, len, "%u", v);
}

static int layout_diff(const struct pdx_kv_layout *a,
		       const struct pdx_kv_layout *b, char *out, size_t outlen)
{
	const struct {
		const char *name;
		uint32_t x, y;
	} f[] = {
		{ "layers", a->layers, b->layers },
		{ "tensors", a->tensors, b->tensors },
		{ "block_tokens", a->block_tokens, b->block_tokens },
		{ "kv_heads", a->kv_heads, b->kv_heads },
		{ "head_dim", a->head_dim, b->head_dim },
		{ "dtype_bytes", a->dtype_bytes, b->dtype_bytes },
		{ "order", (uint32_t)a->order, (uint32_t)b->order },
	};
	size_t used = 0;
	int differs = 0;

	if (outlen)
		out[0] = '\0';
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
		char x[32], y[32];
		int n;

		if (f[i].x == f[i].y)
			continue;
		field_value(x, sizeof(x), f[i].name, f[i].x);
		field_value(y, sizeof(y), f[i].name, f[i].y);
		n = snprintf(out + used, used < outlen ? outlen - used : 0,
			     "%s%s %s != %s", differs ? ", " : "", f[i].name, x,
			     y);
		if (n > 0)
			used += (size_t)n;
		differs = 1;
	}
	return differs;
}

int pdx_kv_layout_diff(const struct pdx_kv_layout *a,
		       const struct pdx_kv_layout *b, char *out, size_t outlen)
{
	if (!out)
		outlen = 0;
	if (a && b)
		return layout_diff(a, b, out, outlen);
	if (outlen)
		snprintf(out, outlen, "no layout to compare (NULL)");
	return 1;
}
