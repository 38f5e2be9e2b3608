/* The prefix cache: hits are the cached blocks a prompt starts with,
 * shared by reference; evictable blocks count as free and are evicted
 * deepest first, least recently released first; and over a long random
 * run a request never fails that a pool without the cache would have
 * served. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/prefix_cache.h"
#include "engine/synth_model.h"
#include "tests/check.h"

#define BT 4 /* positions a block holds */

/* A request's prompt and blocks, as kv_seq.c keeps them. */
struct seq {
	uint32_t tokens[64];
	uint64_t hash[64];
	uint32_t n; /* prompt tokens */
	uint32_t blocks[16];
	uint32_t nb, hits;
	uint64_t salt; /* the request's cache salt, 0: none */
};

static void prompt(struct seq *s, uint32_t n, uint32_t seed, uint32_t from)
{
	/* tokens before `from` are shared by every seed */
	for (uint32_t i = 0; i < n; i++)
		s->tokens[i] = i < from ? i + 1 : seed * 1000 + i;
	s->n = n;
	s->salt = 0;
	pdx_synth_hashes(PDX_SYNTH_HASH_SEED, s->tokens, n, s->hash);
}

static pdx_status_t get(struct pdx_prefix_cache *c, struct seq *s,
			uint32_t nb)
{
	s->nb = nb;
	s->hits = UINT32_MAX;
	return pdx_prefix_cache_get(c, s->hash, s->salt, s->n, nb, s->blocks, &s->hits);
}

/* the request ends with its KV right: full prompt blocks offered */
static void end(struct pdx_prefix_cache *c, struct seq *s)
{
	pdx_prefix_cache_offer(c, s->hash, s->salt, s->blocks, s->n / BT);
	CHECK_EQ(pdx_prefix_cache_put(c, s->blocks, s->nb), PDX_OK);
}

static struct pdx_prefix_cache_stats stats(const struct pdx_prefix_cache *c)
{
	struct pdx_prefix_cache_stats st;

	pdx_prefix_cache_stats(c, &st);
	return st;
}

static uint32_t free_blocks(const struct pdx_block_alloc *a)
{
	struct pdx_block_stats bs;

	pdx_block_alloc_stats(a, &bs);
	return bs.free;
}

static int wakes;
static void on_wake(void *arg)
{
	(void)arg;
	wakes++;
}

static void hits(void)
{
	struct pdx_block_alloc *a;
	struct pdx_prefix_cache *c;
	struct seq s1, s2, s3, s4;

	CHECK_EQ(pdx_block_alloc_new(16, &a), PDX_OK);
	CHECK_EQ(pdx_prefix_cache_new(a, 0, &c), PDX_EINVAL);
	CHECK_EQ(pdx_prefix_cache_new(a, BT, &c), PDX_OK);
	pdx_block_alloc_on_free(a, on_wake, NULL);

	prompt(&s1, 10, 1, 10); /* two full blocks and a half */
	CHECK_EQ(get(c, &s1, 3), PDX_OK);
	CHECK_EQ(s1.hits, 0, "an empty cache has no hits");
	wakes = 0;
	end(c, &s1);
	CHECK_EQ(stats(c).cached, 2, "a finished prompt's full blocks are kept");
	CHECK_EQ(stats(c).evictable, 2);
	CHECK_EQ(free_blocks(a), 14, "its partial block is free again");
	CHECK(wakes >= 1, "whoever waits for blocks hears of evictable ones");

	prompt(&s2, 12, 2, 9); /* the same 9 tokens first, then others */
	CHECK_EQ(get(c, &s2, 3), PDX_OK);
	CHECK_EQ(s2.hits, 2, "a prompt sharing two full blocks hits both");
	CHECK_EQ(s2.blocks[0], s1.blocks[0]);
	CHECK_EQ(s2.blocks[1], s1.blocks[1]);
	CHECK_EQ(stats(c).evictable, 0, "blocks a request holds are not evictable");
	CHECK_EQ(pdx_block_alloc_refs(a, s2.blocks[0]), 2);

	prompt(&s3, 8, 3, 5); /* shares only the first block */
	CHECK_EQ(get(c, &s3, 2), PDX_OK);
	CHECK_EQ(s3.hits, 1, "a prompt sharing one block hits one");
	CHECK_EQ(pdx_block_alloc_refs(a, s3.blocks[0]), 3);

	/* block 1's tokens, but after another first block: no hit */
	prompt(&s4, 8, 4, 0);
	memcpy(s4.tokens + 4, s1.tokens + 4, 4 * sizeof(uint32_t));
	pdx_synth_hashes(PDX_SYNTH_HASH_SEED, s4.tokens, 8, s4.hash);
	CHECK_EQ(get(c, &s4, 2), PDX_OK);
	CHECK_EQ(s4.hits, 0, "a block is found only after the same prefix");

	CHECK_EQ(stats(c).query_tokens, 10 + 12 + 8 + 8);
	CHECK_EQ(stats(c).hit_tokens, (2 + 1) * BT);
	end(c, &s2);
	end(c, &s3);
	end(c, &s4);
	/* s2 added its third block, s3 its second, s4 two of its own */
	CHECK_EQ(stats(c).cached, 6);
	CHECK_EQ(stats(c).evictable, 6);
	CHECK_EQ(free_blocks(a), 16 - 6);
	pdx_prefix_cache_free(c);
	CHECK_EQ(free_blocks(a), 16, "freeing the cache frees its blocks");
	pdx_block_alloc_free(a);
	pdx_prefix_cache_free(NULL);
}

/* Under pressure cached blocks go, deepest and oldest first; a request
 * fails only when the blocks requests hold leave too few. */
/* vLLM's cache_salt: a salted request hits only blocks cached under its
 * own salt, and an unsalted one only unsalted blocks. */
static void salted(void)
{
	struct pdx_block_alloc *a;
	struct pdx_prefix_cache *c;
	struct seq s1, s2;

	CHECK_EQ(pdx_block_alloc_new(16, &a), PDX_OK);
	CHECK_EQ(pdx_prefix_cache_new(a, BT, &c), PDX_OK);
	prompt(&s1, 8, 1, 8);
	s1.salt = 0x7e11a47;
	CHECK_EQ(get(c, &s1, 2), PDX_OK);
	end(c, &s1);
	prompt(&s2, 8, 2, 8); /* the same tokens */
	CHECK_EQ(get(c, &s2, 2), PDX_OK);
	CHECK_EQ(s2.hits, 0, "no salt: none of the salted blocks");
	end(c, &s2);
	prompt(&s2, 8, 2, 8);
	s2.salt = 0x0be;
	CHECK_EQ(get(c, &s2, 2), PDX_OK);
	CHECK_EQ(s2.hits, 0, "another salt: none either");
	end(c, &s2);
	prompt(&s2, 8, 2, 8);
	s2.salt = s1.salt;
	CHECK_EQ(get(c, &s2, 2), PDX_OK);
	CHECK_EQ(s2.hits, 2, "the same salt: both blocks");
	CHECK(!memcmp(s2.blocks, s1.blocks, sizeof(s1.blocks[0]) * 2),
	      "the very blocks the first request cached");
	end(c, &s2);
	pdx_prefix_cache_free(c);
	pdx_block_alloc_free(a);
}

static void eviction(void)
{
	struct pdx_block_alloc *a;
	struct pdx_prefix_cache *c;
	struct seq old, young, big, more;
	uint32_t held[4];

	CHECK_EQ(pdx_block_alloc_new(8, &a), PDX_OK);
	CHECK_EQ(pdx_prefix_cache_new(a, BT, &c), PDX_OK);
	prompt(&old, 12, 1, 12);
	CHECK_EQ(get(c, &old, 3), PDX_OK);
	end(c, &old);
	prompt(&young, 12, 2, 0);
	CHECK_EQ(get(c, &young, 3), PDX_OK);
	end(c, &young);
	CHECK_EQ(stats(c).evictable, 6);
	CHECK_EQ(free_blocks(a), 2);

	/* three blocks needed, two free: one evicted, old's deepest */
	prompt(&big, 12, 3, 0);
	CHECK_EQ(get(c, &big, 3), PDX_OK, "a request that needs cached blocks gets them");
	CHECK_EQ(stats(c).evicted, 1);
	CHECK_EQ(pdx_prefix_cache_put(c, big.blocks, 3), PDX_OK);
	CHECK_EQ(get(c, &old, 3), PDX_OK);
	CHECK_EQ(old.hits, 2, "the least recently used prompt lost its deepest block only");
	CHECK_EQ(pdx_prefix_cache_put(c, old.blocks, 3), PDX_OK);
	CHECK_EQ(get(c, &young, 3), PDX_OK);
	CHECK_EQ(young.hits, 3);
	CHECK_EQ(pdx_prefix_cache_put(c, young.blocks, 3), PDX_OK);
	CHECK_EQ(get(c, &big, 3), PDX_OK);
	CHECK_EQ(stats(c).evicted, 1, "free blocks go before cached ones");

	/* 3 held by big; 5 cached and evictable */
	prompt(&more, 20, 4, 0);
	CHECK_EQ(get(c, &more, 6), PDX_EAGAIN, "more than free and evictable: wait");
	CHECK_EQ(stats(c).evictable, 5, "a refusal evicts nothing");
	CHECK_EQ(get(c, &more, 9), PDX_ETOOBIG);
	CHECK_EQ(get(c, &more, 5), PDX_OK, "every evictable block can be taken");
	CHECK_EQ(stats(c).cached, 0);
	CHECK_EQ(free_blocks(a), 0);
	CHECK_EQ(pdx_block_alloc_get(a, 1, held), PDX_EAGAIN);
	CHECK_EQ(pdx_prefix_cache_put(c, more.blocks, 5), PDX_OK);
	CHECK_EQ(pdx_prefix_cache_put(c, big.blocks, 3), PDX_OK);
	CHECK_EQ(free_blocks(a), 8);

	/* a hit that is evictable is not counted as room for the rest */
	CHECK_EQ(get(c, &old, 3), PDX_OK);
	end(c, &old); /* 3 cached, 5 free */
	CHECK_EQ(pdx_block_alloc_get(a, 4, held), PDX_OK); /* 1 free */
	prompt(&more, 16, 1, 12); /* old's 12 tokens and 4 more */
	CHECK_EQ(get(c, &more, 5), PDX_EAGAIN,
		 "hits of 3 and 1 free block do not make 5");
	CHECK_EQ(stats(c).evictable, 3);
	CHECK_EQ(get(c, &more, 4), PDX_OK);
	CHECK_EQ(more.hits, 3);
	CHECK_EQ(pdx_prefix_cache_put(c, more.blocks, 4), PDX_OK);
	CHECK_EQ(pdx_block_alloc_put(a, held, 4), PDX_OK);
	pdx_prefix_cache_free(c);
	pdx_block_alloc_free(a);
}

/* The same random requests against a pool with the cache and one
 * without: whatever the plain pool serves, the cached one serves. */
static void never_worse(void)
{
	enum { POOL = 24, LIVE = 6, ROUNDS = 20000 };
	struct pdx_block_alloc *a, *plain;
	struct pdx_prefix_cache *c;
	struct seq live[LIVE], plain_live[LIVE];
	bool on[LIVE] = {0};
	uint32_t rnd = 12345, worse = 0, hit_rounds = 0;

	CHECK_EQ(pdx_block_alloc_new(POOL, &a), PDX_OK);
	CHECK_EQ(pdx_block_alloc_new(POOL, &plain), PDX_OK);
	CHECK_EQ(pdx_prefix_cache_new(a, BT, &c), PDX_OK);
	for (int r = 0; r < ROUNDS; r++) {
		uint32_t i, n, nb;
		pdx_status_t st, pst;

		rnd = rnd * 1103515245 + 12345;
		i = (rnd >> 8) % LIVE;
		if (on[i]) {
			end(c, &live[i]);
			CHECK_EQ(pdx_block_alloc_put(plain, plain_live[i].blocks,
						     plain_live[i].nb),
				 PDX_OK);
			on[i] = false;
			continue;
		}
		n = 1 + (rnd >> 12) % 40;
		nb = (n + BT - 1) / BT + (rnd >> 20) % 3;
		/* a handful of prefixes, so that some requests hit */
		prompt(&live[i], n, (rnd >> 24) % 8, (rnd >> 16) % 2 ? 24 : 0);
		st = get(c, &live[i], nb);
		pst = pdx_block_alloc_get(plain, nb, plain_live[i].blocks);
		plain_live[i].nb = nb;
		if (pst == PDX_OK && st != PDX_OK)
			worse++;
		if (st == PDX_OK && live[i].hits)
			hit_rounds++;
		if (st == PDX_OK && pst == PDX_OK) {
			on[i] = true;
		} else {
			if (st == PDX_OK)
				CHECK_EQ(pdx_prefix_cache_put(c, live[i].blocks, nb), PDX_OK);
			if (pst == PDX_OK)
				CHECK_EQ(pdx_block_alloc_put(plain, plain_live[i].blocks, nb), PDX_OK);
		}
		CHECK(stats(c).evictable <= stats(c).cached);
	}
	CHECK_EQ(worse, 0, "the cache never refuses what a plain pool serves (%u rounds)",
		 (unsigned)ROUNDS);
	CHECK(hit_rounds > 100, "and requests hit it (%u)", hit_rounds);
	for (uint32_t i = 0; i < LIVE; i++)
		if (on[i])
			end(c, &live[i]);
	CHECK_EQ(free_blocks(a) + stats(c).evictable, POOL,
		 "with no request left every block is free or evictable");
	pdx_prefix_cache_free(c);
	CHECK_EQ(free_blocks(a), POOL);
	pdx_block_alloc_free(a);
	pdx_block_alloc_free(plain);
}

int main(void)
{
	hits();
	salted();
	eviction();
	never_worse();
	CHECK_DONE();
}
