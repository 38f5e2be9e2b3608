/* The synthetic model: KV contents as documented, the check that finds a
 * bad position, and next tokens that follow the KV bytes, not the block
 * ids they lie in. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/shm_pool.h"
#include "engine/synth_model.h"
#include "tests/check.h"

#define BLOCKS 64
#define PROMPT 30 /* tiny: 4 tokens a block, the last one partial */
#define MAXPOS 64

struct side {
	struct pdx_shm_pool pool;
	uint32_t table[MAXPOS / 4];
	struct pdx_synth_seq seq;
};

static uint32_t tokens[MAXPOS];
static uint64_t hash[MAXPOS];

static int side_init(struct side *s, char tag, int reversed)
{
	char name[64], err[128];

	snprintf(name, sizeof(name), "/pdx-unit-synth-%d-%c", (int)getpid(),
		 tag);
	if (pdx_shm_pool_create(&s->pool, name, pdx_model_find("tiny"), BLOCKS,
				err, sizeof(err))) {
		fprintf(stderr, "pool: %s\n", err);
		return -1;
	}
	memset(s->pool.base, 0xab, s->pool.size);
	for (uint32_t i = 0; i < MAXPOS / 4; i++)
		s->table[i] = reversed ? BLOCKS - 1 - 3 * i : i;
	s->seq = (struct pdx_synth_seq){ .layout = &s->pool.layout,
					 .base = s->pool.base,
					 .blocks = s->table,
					 .hash = hash };
	return 0;
}

static void prefill(struct side *s, uint32_t n)
{
	for (uint32_t l = 0; l < s->pool.layout.layers; l++)
		pdx_synth_fill(&s->seq, l, 0, n);
}

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static void hashes(void)
{
	uint64_t a[MAXPOS], b[MAXPOS];
	uint32_t t[MAXPOS];

	memcpy(t, tokens, sizeof(t));
	pdx_synth_hashes(PDX_SYNTH_HASH_SEED, t, MAXPOS, a);
	/* extending a prefix gives the hashes of the whole */
	pdx_synth_hashes(PDX_SYNTH_HASH_SEED, t, 10, b);
	pdx_synth_hashes(b[9], t + 10, MAXPOS - 10, b + 10);
	CHECK(!memcmp(a, b, sizeof(a)));
	/* a changed token changes its hash and every later one */
	t[20]++;
	pdx_synth_hashes(PDX_SYNTH_HASH_SEED, t, MAXPOS, b);
	CHECK(!memcmp(a, b, 20 * sizeof(a[0])));
	for (int i = 20; i < MAXPOS; i++)
		CHECK(a[i] != b[i]);
}

/* The words of a slot are those docs/engine.md gives. */
static void documented_words(struct side *s)
{
	uint32_t p = 9, layer = 2, tensor = 1;
	/* tiny: 2 heads * 16 dims * 2 bytes = 8 words a slot */
	const uint64_t *w =
		(const uint64_t *)pdx_shm_pool_block(&s->pool, layer, tensor,
						     s->table[p / 4]) +
		(p % 4) * 8;
	uint64_t salt = (uint64_t)p | (uint64_t)tensor << 32 |
			(uint64_t)layer << 33;
	uint64_t key = mix64(hash[p] ^ mix64(salt));

	CHECK(w[0] == key);
	CHECK(w[7] == key + 7 * 0x9e3779b97f4a7c15ULL);
}

static void fill_and_check(struct side *s)
{
	uint8_t *slot;
	uint32_t bad = 99;

	CHECK(pdx_synth_check(&s->seq, 0, PROMPT, &bad));
	CHECK_EQ(bad, 99);
	/* unused blocks, and the unused slots of the last block, untouched */
	CHECK_EQ(pdx_shm_pool_block(&s->pool, 3, 1, 20)[0], 0xab);
	CHECK_EQ(pdx_shm_pool_block(&s->pool, 0, 0, s->table[7])[2 * 64], 0xab);
	CHECK(!pdx_synth_check(&s->seq, 0, PROMPT + 1, &bad));
	CHECK_EQ(bad, PROMPT);

	/* one byte of position 13, layer 3, tensor 1 */
	slot = pdx_shm_pool_block(&s->pool, 3, 1, s->table[3]) + 1 * 64;
	slot[17] ^= 1;
	CHECK(!pdx_synth_check(&s->seq, 0, PROMPT, &bad));
	CHECK_EQ(bad, 13);
	CHECK(pdx_synth_check(&s->seq, 0, 13, &bad));
	CHECK(pdx_synth_check(&s->seq, 14, PROMPT, &bad));
	/* the probe reads three words of a slot: byte 17 is not one */
	CHECK(pdx_synth_probe(&s->seq, 0, PROMPT, &bad));
	slot[17] ^= 1;
	CHECK(pdx_synth_check(&s->seq, 0, PROMPT, &bad));

	/* a slot cleared (a block never written) fails both */
	memset(slot, 0, 64);
	CHECK(!pdx_synth_probe(&s->seq, 0, PROMPT, &bad));
	CHECK_EQ(bad, 13);
	CHECK(!pdx_synth_check(&s->seq, 0, PROMPT, &bad));
	pdx_synth_fill(&s->seq, 3, 13, 14);
	CHECK(pdx_synth_probe(&s->seq, 0, PROMPT, &bad));
	CHECK(pdx_synth_check(&s->seq, 0, PROMPT, &bad));
}

/* Filling in chunks, layer by layer, writes what one go writes. */
static void chunks(struct side *s, struct side *t)
{
	memset(t->pool.base, 0xab, t->pool.size);
	memcpy(t->table, s->table, sizeof(t->table));
	for (uint32_t l = 0; l < 4; l++) {
		pdx_synth_fill(&t->seq, l, 0, 7);
		pdx_synth_fill(&t->seq, l, 7, 8);
		pdx_synth_fill(&t->seq, l, 8, PROMPT);
	}
	CHECK(!memcmp(s->pool.base, t->pool.base, s->pool.size));
}

#define HEAD_WORDS 4 /* tiny: 16 dims * 2 bytes */

/* Head k of position p of layer l, tensor t on side x: its words. */
static uint64_t *head_of(const struct side *x, uint32_t l, uint32_t t,
			 uint32_t p, uint32_t k)
{
	uint64_t *blk = (uint64_t *)pdx_shm_pool_block(&x->pool, l, t,
						       x->table[p / 4]);

	if (x->pool.layout.order == PDX_KV_HND) /* [head][token][dim] */
		return blk + (k * 4 + p % 4) * HEAD_WORDS;
	return blk + (p % 4 * 2 + k) * HEAD_WORDS; /* [token][head][dim] */
}

/* HND (a block holds each head's tokens side by side: vLLM's layout for
 * its KV connectors): the words NHD holds, each head's in that head's run
 * of the block; the check and the probe read them there, a head's run
 * cleared is found, and the tokens are NHD's. */
static void hnd(struct side *s, struct side *h)
{
	bool same = true;
	uint32_t bad = 99;

	memset(h->pool.base, 0xab, h->pool.size);
	memcpy(h->table, s->table, sizeof(h->table));
	h->pool.layout.order = PDX_KV_HND;
	prefill(h, PROMPT);
	CHECK(pdx_synth_check(&h->seq, 0, PROMPT, &bad));
	CHECK(pdx_synth_probe(&h->seq, 0, PROMPT, &bad));
	CHECK_EQ(bad, 99);
	CHECK_EQ(pdx_synth_next_token(&h->seq, PROMPT, 1024),
		 pdx_synth_next_token(&s->seq, PROMPT, 1024));
	for (uint32_t l = 0; l < 4; l++)
		for (uint32_t t = 0; t < 2; t++)
			for (uint32_t p = 0; p < PROMPT; p++)
				for (uint32_t k = 0; k < 2; k++)
					same &= !memcmp(head_of(s, l, t, p, k),
							head_of(h, l, t, p, k),
							HEAD_WORDS * 8);
	CHECK(same);
	/* head 1 of position 13, layer 3, tensor 1: the slot's last words */
	memset(head_of(h, 3, 1, 13, 1), 0, HEAD_WORDS * 8);
	CHECK(!pdx_synth_probe(&h->seq, 0, PROMPT, &bad));
	CHECK_EQ(bad, 13);
	CHECK(!pdx_synth_check(&h->seq, 0, PROMPT, &bad));
	CHECK_EQ(bad, 13);
	pdx_synth_fill(&h->seq, 3, 13, 14);
	CHECK(pdx_synth_check(&h->seq, 0, PROMPT, &bad));
	/* read as NHD, the same bytes are not the prompt's KV */
	h->pool.layout.order = PDX_KV_NHD;
	CHECK(!pdx_synth_check(&h->seq, 0, PROMPT, &bad));
}

/* Colocated (s) and disaggregated (d: other block ids, KV copied block by
 * block as an agent would) pick the same tokens; then every single
 * block, cleared in turn on d, changes d's next token. */
static void same_tokens(struct side *s, struct side *d)
{
	uint32_t nb = (PROMPT + 3) / 4, out_s[16], out_d[16];
	uint64_t bb = s->pool.block_bytes;

	for (uint32_t l = 0; l < 4; l++)
		for (uint32_t t = 0; t < 2; t++)
			for (uint32_t b = 0; b < nb; b++)
				memcpy(pdx_shm_pool_block(&d->pool, l, t,
							  d->table[b]),
				       pdx_shm_pool_block(&s->pool, l, t,
							  s->table[b]),
				       bb);
	CHECK(pdx_synth_check(&d->seq, 0, PROMPT, &(uint32_t){ 0 }));
	out_s[0] = pdx_synth_next_token(&s->seq, PROMPT, 1024);
	for (uint32_t l = 0; l < 4; l++)
		for (uint32_t t = 0; t < 2; t++)
			for (uint32_t b = 0; b < nb; b++) {
				uint8_t *blk = pdx_shm_pool_block(
					&d->pool, l, t, d->table[b]);
				uint8_t keep[256];

				memcpy(keep, blk, bb);
				memset(blk, 0, bb);
				CHECK(pdx_synth_next_token(&d->seq, PROMPT,
							   1024) != out_s[0]);
				memcpy(blk, keep, bb);
			}
	/* the newest position is read, not only the start of its block */
	{
		uint8_t *last = pdx_shm_pool_block(&d->pool, 3, 0,
						   d->table[(PROMPT - 1) / 4]) +
				(PROMPT - 1) % 4 * 64;

		last[0] ^= 1;
		CHECK(pdx_synth_next_token(&d->seq, PROMPT, 1024) != out_s[0]);
		last[0] ^= 1;
	}
	/* decode: the prefill side's first token, then step by step */
	out_d[0] = out_s[0];
	for (uint32_t i = 1; i < 16; i++) {
		uint32_t n = PROMPT + i;

		tokens[n - 1] = out_s[i - 1];
		pdx_synth_hashes(hash[n - 2], &tokens[n - 1], 1, &hash[n - 1]);
		for (uint32_t l = 0; l < 4; l++) {
			pdx_synth_fill(&s->seq, l, n - 1, n);
			pdx_synth_fill(&d->seq, l, n - 1, n);
		}
		out_s[i] = pdx_synth_next_token(&s->seq, n, 1024);
		out_d[i] = pdx_synth_next_token(&d->seq, n, 1024);
		CHECK(out_s[i] < 1024);
	}
	CHECK(!memcmp(out_s, out_d, sizeof(out_s)));
	/* the tokens are not all alike */
	CHECK(out_s[1] != out_s[2] || out_s[2] != out_s[3]);
}

/* MLA (deepseek-v3: one latent tensor a layer, 576 bf16 a token, 64-token
 * blocks): the check finds a flipped byte of the rotary part of one
 * position in the last layer, the probe a cleared slot, and the next token
 * depends on that layer's latent. */
static void mla(void)
{
	struct pdx_shm_pool pool;
	const uint32_t n = 100, slot = 576 * 2; /* two blocks, one partial */
	uint32_t table[2] = { 3, 1 }, bad = 0, tok[100], first;
	uint64_t h[100];
	struct pdx_synth_seq q;
	char name[64], err[128];
	uint8_t *pos70;

	snprintf(name, sizeof(name), "/pdx-unit-synth-%d-mla", (int)getpid());
	if (pdx_shm_pool_create(&pool, name, pdx_model_find("deepseek-v3"), 4,
				err, sizeof(err))) {
		fprintf(stderr, "pool: %s\n", err);
		check_failures++;
		return;
	}
	CHECK_EQ(pool.layout.tensors, 1);
	CHECK_EQ(pool.block_bytes, 64 * slot);
	CHECK_EQ(pdx_synth_layout_check(&pool.layout), PDX_OK);
	for (uint32_t i = 0; i < n; i++)
		tok[i] = (i * 104729 + 7) % 129280;
	pdx_synth_hashes(PDX_SYNTH_HASH_SEED, tok, n, h);
	q = (struct pdx_synth_seq){ .layout = &pool.layout, .base = pool.base,
				    .blocks = table, .hash = h };
	for (uint32_t l = 0; l < pool.layout.layers; l++)
		pdx_synth_fill(&q, l, 0, n);
	CHECK(pdx_synth_check(&q, 0, n, &bad));
	CHECK(pdx_synth_probe(&q, 0, n, &bad));
	first = pdx_synth_next_token(&q, n, 129280);

	pos70 = pdx_shm_pool_block(&pool, 60, 0, table[1]) + (70 - 64) * slot;
	pos70[512 * 2 + 5] ^= 0x10; /* in qk_rope_head_dim's 64 values */
	CHECK(!pdx_synth_check(&q, 0, n, &bad));
	CHECK_EQ(bad, 70);
	pos70[512 * 2 + 5] ^= 0x10;
	memset(pos70, 0, slot);
	CHECK(!pdx_synth_probe(&q, 0, n, &bad));
	CHECK_EQ(bad, 70);
	memset(pdx_shm_pool_block(&pool, 60, 0, table[1]), 0, pool.block_bytes);
	CHECK(pdx_synth_next_token(&q, n, 129280) != first);
	pdx_synth_fill(&q, 60, 64, n);
	CHECK(pdx_synth_check(&q, 0, n, &bad));
	CHECK_EQ(pdx_synth_next_token(&q, n, 129280), first);
	pdx_shm_pool_destroy(&pool);
}

static void layouts(const struct side *s)
{
	struct pdx_kv_layout l = s->pool.layout;
	struct pdx_kv_layer ly[4];

	CHECK_EQ(pdx_synth_layout_check(&l), PDX_OK);
	l.order = PDX_KV_HND;
	CHECK_EQ(pdx_synth_layout_check(&l), PDX_OK);
	l.order = (enum pdx_kv_order)2;
	CHECK_EQ(pdx_synth_layout_check(&l), PDX_EINVAL);
	l = s->pool.layout;
	l.head_dim = 3; /* 12-byte slots */
	CHECK_EQ(pdx_synth_layout_check(&l), PDX_EINVAL);
	l = s->pool.layout;
	memcpy(ly, l.layer, sizeof(ly));
	ly[2].base[1].region = 1;
	l.layer = ly;
	CHECK_EQ(pdx_synth_layout_check(&l), PDX_EINVAL);
}

int main(void)
{
	struct side s = { 0 }, t = { 0 }, d = { 0 };

	for (int i = 0; i < MAXPOS; i++)
		tokens[i] = (uint32_t)(i * 7919 + 13) % 1024;
	pdx_synth_hashes(PDX_SYNTH_HASH_SEED, tokens, PROMPT, hash);
	if (side_init(&s, 's', 0) || side_init(&t, 't', 0) ||
	    side_init(&d, 'd', 1)) {
		check_failures++;
		goto out;
	}
	hashes();
	prefill(&s, PROMPT);
	documented_words(&s);
	fill_and_check(&s);
	chunks(&s, &t);
	hnd(&s, &t);
	same_tokens(&s, &d);
	layouts(&s);
	mla();
out:
	pdx_shm_pool_destroy(&s.pool);
	pdx_shm_pool_destroy(&t.pool);
	pdx_shm_pool_destroy(&d.pool);
	CHECK_DONE();
}
