/* A hash table of cached blocks (chained through the blocks themselves)
 * and a list of the evictable ones, least recently released first. */
#include "engine/prefix_cache.h"

#include <stdbool.h>
#include <stdlib.h>

#define NONE UINT32_MAX

struct pdx_prefix_cache {
	struct pdx_block_alloc *alloc;
	uint32_t bt;	       /* positions a block holds */
	uint32_t total;	       /* blocks in the pool */
	uint32_t mask;	       /* buckets - 1 */
	uint32_t *bucket;      /* [mask + 1]: first block of the chain */
	uint32_t *chain;       /* [total]: next block in its bucket */
	uint64_t *key;	       /* [total]: a cached block's key */
	bool *cached;	       /* [total] */
	bool *idle;	       /* [total]: on the evictable list */
	uint32_t *prev, *next; /* [total]: the evictable list */
	uint32_t head, tail;   /* least and most recently released */
	struct pdx_prefix_cache_stats st;
};

pdx_status_t pdx_prefix_cache_new(struct pdx_block_alloc *a,
				  uint32_t block_tokens,
				  struct pdx_prefix_cache **out)
{
	struct pdx_block_stats bs;
	struct pdx_prefix_cache *c;
	uint32_t nb = 1;

	pdx_block_alloc_stats(a, &bs);
	if (block_tokens == 0)
		return PDX_EINVAL;
	while (nb < bs.total && nb < (1u << 31))
		nb <<= 1;
	c = calloc(1, sizeof(*c));
	if (!c)
		return PDX_ENOMEM;
	c->alloc = a;
	c->bt = block_tokens;
	c->total = bs.total;
	c->mask = nb - 1;
	c->head = c->tail = NONE;
	c->bucket = malloc(sizeof(*c->bucket) * nb);
	c->chain = malloc(sizeof(*c->chain) * bs.total);
	c->key = malloc(sizeof(*c->key) * bs.total);
	c->cached = calloc(bs.total, sizeof(*c->cached));
	c->idle = calloc(bs.total, sizeof(*c->idle));
	c->prev = malloc(sizeof(*c->prev) * bs.total);
	c->next = malloc(sizeof(*c->next) * bs.total);
	if (!c->bucket || !c->chain || !c->key || !c->cached || !c->idle ||
	    !c->prev || !c->next) {
		pdx_prefix_cache_free(c);
		return PDX_ENOMEM;
	}
	for (uint32_t i = 0; i < nb; i++)
		c->bucket[i] = NONE;
	*out = c;
	return PDX_OK;
}

void pdx_prefix_cache_free(struct pdx_prefix_cache *c)
{
	if (!c)
		return;
	for (uint32_t id = 0; c->cached && id < c->total; id++)
		if (c->cached[id])
			pdx_block_alloc_put(c->alloc, &id, 1);
	free(c->bucket);
	free(c->chain);
	free(c->key);
	free(c->cached);
	free(c->idle);
	free(c->prev);
	free(c->next);
	free(c);
}

/* The keys are prefix hashes, already mixed: their low bits will do. */
static uint32_t *slot_of(struct pdx_prefix_cache *c, uint64_t key)
{
	return &c->bucket[key & c->mask];
}

static uint32_t find(struct pdx_prefix_cache *c, uint64_t key)
{
	uint32_t id = *slot_of(c, key);

	while (id != NONE && c->key[id] != key)
		id = c->chain[id];
	return id;
}

static void lru_append(struct pdx_prefix_cache *c, uint32_t id)
{
	c->prev[id] = c->tail;
	c->next[id] = NONE;
	if (c->tail != NONE)
		c->next[c->tail] = id;
	else
		c->head = id;
	c->tail = id;
	c->idle[id] = true;
	c->st.evictable++;
}

static void lru_remove(struct pdx_prefix_cache *c, uint32_t id)
{
	if (c->prev[id] != NONE)
		c->next[c->prev[id]] = c->next[id];
	else
		c->head = c->next[id];
	if (c->next[id] != NONE)
		c->prev[c->next[id]] = c->prev[id];
	else
		c->tail = c->prev[id];
	c->idle[id] = false;
	c->st.evictable--;
}

/* The least recently released evictable block goes back to the free
 * list. */
static void evict_one(struct pdx_prefix_cache *c)
{
	uint32_t id = c->head, *p;

	lru_remove(c, id);
	for (p = slot_of(c, c->key[id]); *p != id; p = &c->chain[*p])
		;
	*p = c->chain[id];
	c->cached[id] = false;
	c->st.cached--;
	c->st.evicted++;
	pdx_block_alloc_put(c->alloc, &id, 1);
}

pdx_status_t pdx_prefix_cache_get(struct pdx_prefix_cache *c,
				  const uint64_t *hash, uint64_t salt,
				  uint32_t n_prompt,
				  uint32_t n, uint32_t *out, uint32_t *hits)
{
	uint32_t full = n_prompt / c->bt, h = 0, idle_hits = 0, id;
	struct pdx_block_stats bs;
	pdx_status_t st;

	if (n > c->total)
		return PDX_ETOOBIG;
	if (full > n)
		full = n;
	for (; h < full; h++) {
		id = find(c, hash[(h + 1) * c->bt - 1] ^ salt);
		if (id == NONE)
			break;
		out[h] = id;
		idle_hits += c->idle[id];
	}
	/* the hits that are evictable now will not be once taken */
	pdx_block_alloc_stats(c->alloc, &bs);
	if ((uint64_t)bs.free + c->st.evictable - idle_hits < n - h)
		return PDX_EAGAIN;
	for (uint32_t i = 0; i < h; i++) {
		if (c->idle[out[i]])
			lru_remove(c, out[i]);
	}
	st = pdx_block_alloc_ref(c->alloc, out, h);
	if (st != PDX_OK)
		return st; /* cannot happen: every cached block is held */
	while (bs.free < n - h) {
		evict_one(c);
		bs.free++;
	}
	st = pdx_block_alloc_get(c->alloc, n - h, out + h);
	if (st != PDX_OK) {
		pdx_prefix_cache_put(c, out, h);
		return st;
	}
	c->st.query_tokens += n_prompt;
	c->st.hit_tokens += (uint64_t)h * c->bt;
	*hits = h;
	return PDX_OK;
}

void pdx_prefix_cache_offer(struct pdx_prefix_cache *c, const uint64_t *hash,
			    uint64_t salt,
			    const uint32_t *ids, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		uint64_t key = hash[(i + 1) * c->bt - 1] ^ salt;
		uint32_t id = ids[i], *slot;

		/* the same KV computed twice (two requests at once): one
		 * copy is enough */
		if (c->cached[id] || find(c, key) != NONE)
			continue;
		if (pdx_block_alloc_ref(c->alloc, &id, 1) != PDX_OK)
			continue; /* not held: not the caller's to offer */
		slot = slot_of(c, key);
		c->key[id] = key;
		c->chain[id] = *slot;
		*slot = id;
		c->cached[id] = true;
		c->st.cached++;
	}
}

pdx_status_t pdx_prefix_cache_put(struct pdx_prefix_cache *c,
				  const uint32_t *ids, uint32_t n)
{
	bool woke = false;
	pdx_status_t st;

	st = pdx_block_alloc_put(c->alloc, ids, n);
	if (st != PDX_OK)
		return st;
	/* last first: a prompt's deepest blocks are evicted before the
	 * ones it starts with, which every longer hit needs */
	for (uint32_t i = n; i-- > 0;) {
		uint32_t id = ids[i];

		if (!c->cached[id] || c->idle[id] ||
		    pdx_block_alloc_refs(c->alloc, id) != 1)
			continue;
		lru_append(c, id);
		woke = true;
	}
	if (woke)
		pdx_block_alloc_wake(c->alloc);
	return PDX_OK;
}

void pdx_prefix_cache_stats(const struct pdx_prefix_cache *c,
			    struct pdx_prefix_cache_stats *out)
{
	*out = c->st;
}
