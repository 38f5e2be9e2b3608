/* KV contents, their check, and the next token; the rules are in
 * synth_model.h. */
#include "engine/synth_model.h"

#include "common/mix64.h"

void pdx_synth_hashes(uint64_t prev, const uint32_t *tokens, size_t n,
		      uint64_t *out)
{
	for (size_t i = 0; i < n; i++) {
		prev = pdx_mix64(prev ^ ((uint64_t)tokens[i] + PDX_GOLDEN_STEP));
		out[i] = prev;
	}
}

pdx_status_t pdx_synth_layout_check(const struct pdx_kv_layout *l)
{
	uint64_t head = (uint64_t)l->head_dim * l->dtype_bytes;

	if ((l->order != PDX_KV_NHD && l->order != PDX_KV_HND) ||
	    l->tensors < 1 || l->tensors > 2 || !l->layer ||
	    l->block_tokens == 0 || l->kv_heads == 0 || head == 0 || head % 8)
		return PDX_EINVAL;
	for (uint32_t i = 0; i < l->layers; i++)
		for (uint32_t t = 0; t < l->tensors; t++)
			if (l->layer[i].base[t].region != 0)
				return PDX_EINVAL;
	return PDX_OK;
}

static inline uint64_t slot_words(const struct pdx_kv_layout *l)
{
	return (uint64_t)l->kv_heads * l->head_dim * l->dtype_bytes / 8;
}

static inline uint64_t head_words(const struct pdx_kv_layout *l)
{
	return (uint64_t)l->head_dim * l->dtype_bytes / 8;
}

/* Where a slot's words lie from its first: in n runs of `words`, run k
 * `step` words after run 0. NHD: one run of all its heads; HND: a run
 * per head, a block's worth of that head's tokens apart. Head 0 is run
 * 0's start in both. mid and last: where the slot's middle and last
 * words are (what pdx_synth_probe() reads, found once a layout). */
struct slot_runs {
	uint64_t n, words, step, mid, last;
};

static inline uint64_t run_word(uint64_t words, uint64_t step, uint64_t i)
{
	return i / words * step + i % words;
}

static struct slot_runs runs_of(const struct pdx_kv_layout *l)
{
	uint64_t hw = head_words(l), all = slot_words(l), step;

	if (l->order != PDX_KV_HND)
		return (struct slot_runs){ 1, all, 0, all / 2, all - 1 };
	step = hw * l->block_tokens;
	return (struct slot_runs){ l->kv_heads, hw, step,
				   run_word(hw, step, all / 2),
				   run_word(hw, step, all - 1) };
}

/* Word j of a slot here is word head0 * head_words + j of the whole
 * model's slot: its value is that many steps on. */
static inline uint64_t word0(const struct pdx_synth_seq *s)
{
	return s->head0 * head_words(s->layout) * PDX_GOLDEN_STEP;
}

/* The slot's first word (head 0's). */
static inline uint64_t *slot_at(const struct pdx_synth_seq *s, uint32_t layer,
				uint32_t tensor, uint32_t p)
{
	const struct pdx_kv_layout *l = s->layout;
	const struct pdx_kv_layer *ly = &l->layer[layer];
	uint32_t block = s->blocks[p / l->block_tokens];
	uint64_t row = l->order == PDX_KV_HND ? head_words(l) : slot_words(l);

	return (uint64_t *)(s->base + ly->base[tensor].offset +
			    (uint64_t)block * ly->block_stride) +
	       (uint64_t)(p % l->block_tokens) * row;
}

static inline uint64_t salt(uint32_t layer, uint32_t tensor, uint32_t p)
{
	return pdx_mix64((uint64_t)p | (uint64_t)tensor << 32 |
		     (uint64_t)layer << 33);
}

static inline uint64_t slot_key(const struct pdx_synth_seq *s, uint32_t layer,
				uint32_t tensor, uint32_t p)
{
	return pdx_mix64(s->hash[p] ^ salt(layer, tensor, p));
}

void pdx_synth_fill(const struct pdx_synth_seq *s, uint32_t layer, uint32_t a,
		    uint32_t b)
{
	struct slot_runs r = runs_of(s->layout);

	for (uint32_t t = 0; t < s->layout->tensors; t++) {
		for (uint32_t p = a; p < b; p++) {
			uint64_t *w = slot_at(s, layer, t, p);
			uint64_t key = slot_key(s, layer, t, p) + word0(s);

			for (uint64_t k = 0; k < r.n; k++) {
				uint64_t *run = w + k * r.step;
				uint64_t rkey = key + k * r.words * PDX_GOLDEN_STEP;

				for (uint64_t i = 0; i < r.words; i++)
					run[i] = rkey + i * PDX_GOLDEN_STEP;
			}
		}
	}
}

/* OR of the differences: zero when the slot matches (each run
 * vectorizes). */
static uint64_t slot_diff(const uint64_t *w, const struct slot_runs *r,
			  uint64_t key)
{
	uint64_t d = 0;

	for (uint64_t k = 0; k < r->n; k++) {
		const uint64_t *run = w + k * r->step;
		uint64_t rkey = key + k * r->words * PDX_GOLDEN_STEP;

		for (uint64_t i = 0; i < r->words; i++)
			d |= run[i] ^ (rkey + i * PDX_GOLDEN_STEP);
	}
	return d;
}

/* The first, middle and last word of a slot: what pdx_synth_probe()
 * compares. A misplaced, missing or foreign slot differs in all three. */
static uint64_t slot_probe(const uint64_t *w, const struct slot_runs *r,
			   uint64_t key)
{
	uint64_t words = r->n * r->words, mid = words / 2, last = words - 1;

	return (w[0] ^ key) | (w[r->mid] ^ (key + mid * PDX_GOLDEN_STEP)) |
	       (w[r->last] ^ (key + last * PDX_GOLDEN_STEP));
}

static bool check(const struct pdx_synth_seq *s, uint32_t a, uint32_t b,
		  uint32_t *bad,
		  uint64_t (*diff)(const uint64_t *, const struct slot_runs *,
				   uint64_t))
{
	const struct pdx_kv_layout *l = s->layout;
	struct slot_runs r = runs_of(l);

	for (uint32_t p = a; p < b; p++) {
		for (uint32_t layer = 0; layer < l->layers; layer++) {
			for (uint32_t t = 0; t < l->tensors; t++) {
				if (!diff(slot_at(s, layer, t, p), &r,
					  slot_key(s, layer, t, p) + word0(s)))
					continue;
				*bad = p;
				return false;
			}
		}
	}
	return true;
}

bool pdx_synth_check(const struct pdx_synth_seq *s, uint32_t a, uint32_t b,
		     uint32_t *bad)
{
	return check(s, a, b, bad, slot_diff);
}

bool pdx_synth_probe(const struct pdx_synth_seq *s, uint32_t a, uint32_t b,
		     uint32_t *bad)
{
	return check(s, a, b, bad, slot_probe);
}

uint32_t pdx_synth_next_token(const struct pdx_synth_seq *s, uint32_t n,
			      uint32_t vocab)
{
	const struct pdx_kv_layout *l = s->layout;
	uint32_t bt = l->block_tokens, off = (n - 1) % bt;
	uint64_t last = head_words(l) - 1, sum = 0;

	for (uint32_t p = off; p < n; p += bt) {
		for (uint32_t layer = 0; layer < l->layers; layer++) {
			for (uint32_t t = 0; t < l->tensors; t++) {
				const uint64_t *w = slot_at(s, layer, t, p);
				uint64_t tail = w[last] << 32 | w[last] >> 32;

				/* a sum, not a xor: equal terms never cancel */
				sum += pdx_mix64(w[0] ^ tail ^ salt(layer, t, p));
			}
		}
	}
	return (uint32_t)(pdx_mix64(sum ^ n) % vocab);
}
