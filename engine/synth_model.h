/* The synthetic model: what its KV cache holds and how it picks tokens.
 *
 * KV contents. A token's slot (one position of one tensor of one layer:
 * kv_heads * head_dim * dtype_bytes bytes) holds the 64-bit words
 *   w[i] = key + i * 0x9e3779b97f4a7c15,
 * i counted head by head (head_dim * dtype_bytes / 8 words each). An NHD
 * block keeps a slot's words side by side, an HND one each head's words
 * in that head's run of the block's tokens: the same values, elsewhere.
 * i counts the whole model's heads: a pool that holds only heads
 * [h0, h0 + k) (one rank of a tensor-parallel instance, tp_slice.h) holds
 * words i = h0 * head_words + j of the slot, so a head's bytes do not
 * depend on which rank computes them.
 *   key  = mix(hash[p] ^ mix(p | tensor << 32 | layer << 33)),
 * where mix is splitmix64's finalizer and hash[p] the prefix hash of tokens
 * 0..p (pdx_synth_hashes()). Like a transformer's KV, it depends on the
 * whole prefix: requests sharing a prefix share its blocks, and any engine
 * computes the same bytes from the same tokens wherever the blocks lie.
 *
 * Next token. Read back from the pool, never recomputed from the tokens:
 * for a sequence of n filled positions, in every block of it and every
 * layer and tensor, the first and last word of head 0 of the slot at
 * in-block offset
 * (n - 1) % block_tokens (the last position itself, in the last block) are
 * mixed into a sum (head 0: what rank 0 of any TP size holds, so the
 * tokens do not depend on the TP size); the token is mix(sum ^ n) % vocab. The offset moves
 * with n, so over block_tokens steps every slot is read. Two engines with
 * the same KV bytes pick the same tokens; a block that lost its data
 * changes the very next token.
 *
 * Order of a request: prefill fills positions [0, n) layer by layer, then
 * the first token is pdx_synth_next_token(n). A decode step fills the
 * position of the newest token, n, in every layer, then picks token
 * next_token(n + 1). The decode side of a transfer checks what it received
 * with pdx_synth_check() and starts from the prefill side's first token.
 *
 * Pure functions over caller-owned memory; any thread may call them for
 * disjoint slots.
 */
#ifndef PDX_ENGINE_SYNTH_MODEL_H
#define PDX_ENGINE_SYNTH_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/layout.h>
#include <pdx/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The hash "before position 0". */
#define PDX_SYNTH_HASH_SEED 0x70647873796e7468ULL /* "pdxsynth" */

/* Extends a prefix hash by tokens[0..n): out[i] is the hash of the prefix
 * ending at tokens[i]. prev is the hash of the prefix before tokens[0]
 * (PDX_SYNTH_HASH_SEED when tokens[0] is position 0). O(n). */
void pdx_synth_hashes(uint64_t prev, const uint32_t *tokens, size_t n,
		      uint64_t *out);

/* One sequence in a pool. */
struct pdx_synth_seq {
	/* passed pdx_synth_layout_check() */
	const struct pdx_kv_layout *layout;
	/* region 0: every layer's offsets start here */
	uint8_t *base;
	/* position p lies in blocks[p / block_tokens] */
	const uint32_t *blocks;
	/* hash[p] for every position used */
	const uint64_t *hash;
	/* the pool's first head in the whole model's (tp_slice.h); 0 */
	uint32_t head0;
};

/* Positions [a, b) of one sequence, written (or checked) in a forward
 * pass, and the token after [0, b) read back when want_token: the unit
 * of work of a pass over a pool wherever it lives (kv_pool.h). */
struct pdx_synth_run {
	const uint32_t *blocks; /* the block table: blocks[0..ceil(b / bt)) */
	const uint64_t *hash;	/* hash[p] for p in [a, b) */
	uint32_t a, b;		/* a == b: nothing to write */
	bool want_token;	/* b > 0 and [0, a) already filled */
	uint32_t token;		/* out: pdx_synth_next_token(b) */
};

/* PDX_OK when the layout is one the functions below handle: NHD or HND,
 * two tensors or one, heads a multiple of 8 bytes, every tensor in
 * region 0. */
pdx_status_t pdx_synth_layout_check(const struct pdx_kv_layout *l);

/* Writes the slots of positions [a, b) of every tensor of one layer. */
void pdx_synth_fill(const struct pdx_synth_seq *s, uint32_t layer, uint32_t a,
		    uint32_t b);

/* Checks positions [a, b) of every layer and tensor. True when all match;
 * else false and the lowest position that does not in *bad. */
bool pdx_synth_check(const struct pdx_synth_seq *s, uint32_t a, uint32_t b,
		     uint32_t *bad);

/* As pdx_synth_check(), reading only the first, middle and last word of
 * each slot: what a decode engine runs over received KV on its critical
 * path (reading every byte of 8k tokens costs ~30 ms here; this ~1 ms).
 * Finds a block misplaced, missing or from another sequence; a few
 * flipped bytes inside a slot need pdx_synth_check(). */
bool pdx_synth_probe(const struct pdx_synth_seq *s, uint32_t a, uint32_t b,
		     uint32_t *bad);

/* The token after positions [0, n) (n > 0, all filled), in [0, vocab). */
uint32_t pdx_synth_next_token(const struct pdx_synth_seq *s, uint32_t n,
			      uint32_t vocab);

#ifdef __cplusplus
}
#endif
#endif
