/* KV cache layout: where block b of layer l lives in an engine's memory.
 *
 * An engine's KV pool is one or more registered memory regions. Each layer
 * has one tensor (MLA) or two (K and V). Block b of tensor t of layer l
 * starts at region[base.region] + base[t].offset + b * block_stride, and is
 * block_tokens * kv_heads * head_dim * dtype_bytes bytes long (the "block
 * bytes"). NHD and HND only name the order inside a block; the two sides
 * of a transfer may differ in it (the agents convert each block,
 * docs/protocol.md, "Converting the order").
 *
 * The structs are plain data owned by the caller; the functions are pure.
 * Given NULL they fail (pdx_kv_layout_check: PDX_EINVAL; _diff: 1, "no
 * layout") or return 0.
 */
#ifndef PDX_LAYOUT_H
#define PDX_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include <pdx/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PDX_MAX_LAYERS 1024
#define PDX_MAX_REGIONS 1024

enum pdx_kv_order {
	PDX_KV_NHD = 0, /* [tokens][heads][head_dim] inside a block */
	PDX_KV_HND = 1, /* [heads][tokens][head_dim] inside a block */
};

struct pdx_kv_ref {
	uint32_t region; /* index into the registered regions */
	uint64_t offset; /* bytes from the start of that region */
};

struct pdx_kv_layer {
	struct pdx_kv_ref base[2]; /* K, V; only base[0] when tensors == 1 */
	uint64_t block_stride;     /* bytes from block b to block b + 1 */
};

struct pdx_kv_layout {
	uint32_t layers;
	uint32_t tensors; /* 2: separate K and V; 1: one MLA tensor */
	uint32_t blocks;  /* blocks in the pool */
	uint32_t block_tokens;
	uint32_t kv_heads;
	uint32_t head_dim;
	uint32_t dtype_bytes;
	enum pdx_kv_order order;
	struct pdx_kv_layer *layer; /* layers entries, owned by the caller */
};

/* Bytes of one block of one tensor of one layer. */
uint64_t pdx_kv_layout_block_bytes(const struct pdx_kv_layout *l);

/* Bytes of one block across all layers and tensors. */
uint64_t pdx_kv_layout_block_bytes_all(const struct pdx_kv_layout *l);

/* Checks the shape, that every block of every layer lies inside its
 * region (region_sizes has n_regions entries), and that no two tensors at
 * the same block stride share a byte. On failure writes the reason to err
 * (errlen bytes) and returns PDX_EINVAL or PDX_ERANGE. */
pdx_status_t pdx_kv_layout_check(const struct pdx_kv_layout *l,
				 const uint64_t *region_sizes, size_t n_regions,
				 char *err, size_t errlen);

/* Hash of a block's shape, dtype and order; not the block count or the
 * addresses, which are each engine's own. Each agent sends its own in its
 * hello; the two ends must share all of it but the order (which they
 * convert) and, between TP sizes, kv_heads. */
uint64_t pdx_kv_layout_compat_hash(const struct pdx_kv_layout *l);

/* Writes what differs between a and b in the fields the compatibility hash
 * covers, e.g. "kv_heads 8 != 4", "order NHD != HND". Returns 0 when they
 * are the same, else 1. */
int pdx_kv_layout_diff(const struct pdx_kv_layout *a,
		       const struct pdx_kv_layout *b, char *out, size_t outlen);

#ifdef __cplusplus
}
#endif
#endif
