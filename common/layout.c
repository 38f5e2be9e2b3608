#include <pdx/layout.h>

#include <stdio.h>
#include <string.h>

uint64_t pdx_kv_layout_block_bytes(const struct pdx_kv_layout *l)
{
	return (uint64_t)l->block_tokens * l->kv_heads * l->head_dim *
	       l->dtype_bytes;
}

uint64_t pdx_kv_layout_block_bytes_all(const struct pdx_kv_layout *l)
{
	return pdx_kv_layout_block_bytes(l) * l->layers * l->tensors;
}

pdx_status_t pdx_kv_layout_check(const struct pdx_kv_layout *l,
				 const uint64_t *region_sizes, size_t n_regions,
				 char *err, size_t errlen)
{
	uint64_t bb;

	if (l->layers == 0 || l->layers > PDX_MAX_LAYERS || !l->layer) {
		snprintf(err, errlen, "layers %u outside 1..%u", l->layers,
			 PDX_MAX_LAYERS);
		return PDX_EINVAL;
	}
	if (l->tensors != 1 && l->tensors != 2) {
		snprintf(err, errlen, "tensors %u is neither 1 (MLA) nor 2 (K, V)",
			 l->tensors);
		return PDX_EINVAL;
	}
	if (!l->blocks || !l->block_tokens || !l->kv_heads || !l->head_dim ||
	    !l->dtype_bytes || l->block_tokens > 65536 || l->kv_heads > 65536 ||
	    l->head_dim > 65536 || l->dtype_bytes > 16) {
		snprintf(err, errlen,
			 "shape out of bounds: blocks %u block_tokens %u kv_heads %u head_dim %u dtype_bytes %u",
			 l->blocks, l->block_tokens, l->kv_heads, l->head_dim,
			 l->dtype_bytes);
		return PDX_EINVAL;
	}
	if (l->order != PDX_KV_NHD && l->order != PDX_KV_HND) {
		snprintf(err, errlen, "order %d is neither NHD nor HND", l->order);
		return PDX_EINVAL;
	}
	bb = pdx_kv_layout_block_bytes(l);
	for (uint32_t i = 0; i < l->layers; i++) {
		const struct pdx_kv_layer *ly = &l->layer[i];

		if (ly->block_stride < bb) {
			snprintf(err, errlen,
				 "layer %u: block stride %llu < block bytes %llu",
				 i, (unsigned long long)ly->block_stride,
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
					 "layer %u tensor %u: region %u of %zu", i,
					 t, r->region, n_regions);
				return PDX_ERANGE;
			}
			if (end > region_sizes[r->region]) {
				snprintf(err, errlen,
					 "layer %u tensor %u: blocks end past region %u (%llu bytes)",
					 i, t, r->region,
					 (unsigned long long)region_sizes[r->region]);
				return PDX_ERANGE;
			}
		}
	}
	return PDX_OK;
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

	h = fnv1a(h, l->layers);
	h = fnv1a(h, l->tensors);
	h = fnv1a(h, l->block_tokens);
	h = fnv1a(h, l->kv_heads);
	h = fnv1a(h, l->head_dim);
	h = fnv1a(h, l->dtype_bytes);
	h = fnv1a(h, (uint64_t)l->order);
	return h;
}

int pdx_kv_layout_diff(const struct pdx_kv_layout *a,
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
		int n;

		if (f[i].x == f[i].y)
			continue;
		n = snprintf(out + used, used < outlen ? outlen - used : 0,
			     "%s%s %u != %u", differs ? ", " : "", f[i].name,
			     f[i].x, f[i].y);
		if (n > 0)
			used += (size_t)n;
		differs = 1;
	}
	return differs;
}
