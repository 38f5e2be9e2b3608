/* A stack of free ids and a reference count per block. */
#include "engine/block_alloc.h"

#include <stdbool.h>
#include <stdlib.h>

struct pdx_block_alloc {
	uint32_t total;
	uint32_t nfree;  /* free[0..nfree) are free, the next one on top */
	uint32_t shared; /* blocks with refs > 1 */
	uint32_t *free;
	uint32_t *refs;
	void (*on_free)(void *arg); /* pdx_block_alloc_on_free() */
	void *on_free_arg;
};

pdx_status_t pdx_block_alloc_new(uint32_t blocks, struct pdx_block_alloc **out)
{
	struct pdx_block_alloc *a;

	if (blocks == 0)
		return PDX_EINVAL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return PDX_ENOMEM;
	a->free = malloc((size_t)blocks * sizeof(*a->free));
	a->refs = calloc(blocks, sizeof(*a->refs));
	if (!a->free || !a->refs) {
		pdx_block_alloc_free(a);
		return PDX_ENOMEM;
	}
	a->total = a->nfree = blocks;
	for (uint32_t i = 0; i < blocks; i++)
		a->free[i] = blocks - 1 - i; /* 0 on top */
	*out = a;
	return PDX_OK;
}

void pdx_block_alloc_free(struct pdx_block_alloc *a)
{
	if (!a)
		return;
	free(a->free);
	free(a->refs);
	free(a);
}

pdx_status_t pdx_block_alloc_get(struct pdx_block_alloc *a, uint32_t n,
				 uint32_t *out)
{
	if (n > a->total)
		return PDX_ETOOBIG;
	if (n > a->nfree)
		return PDX_EAGAIN;
	for (uint32_t i = 0; i < n; i++) {
		out[i] = a->free[--a->nfree];
		a->refs[out[i]] = 1;
	}
	return PDX_OK;
}

static inline bool held(const struct pdx_block_alloc *a, uint32_t id)
{
	return id < a->total && a->refs[id] > 0;
}

static void ref_one(struct pdx_block_alloc *a, uint32_t id)
{
	if (++a->refs[id] == 2)
		a->shared++;
}

pdx_status_t pdx_block_alloc_ref(struct pdx_block_alloc *a,
				 const uint32_t *ids, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (!held(a, ids[i]) || a->refs[ids[i]] == UINT32_MAX)
			return PDX_ERANGE;
	for (uint32_t i = 0; i < n; i++)
		ref_one(a, ids[i]);
	return PDX_OK;
}

pdx_status_t pdx_block_alloc_put(struct pdx_block_alloc *a,
				 const uint32_t *ids, uint32_t n)
{
	uint32_t i, top = a->nfree;

	/* Applied as it goes, since an id may repeat, and undone in reverse
	 * on a bad one: the blocks it freed are then on top of the stack. */
	for (i = 0; i < n; i++) {
		uint32_t id = ids[i];

		if (!held(a, id))
			goto undo;
		if (--a->refs[id] == 1)
			a->shared--;
		else if (a->refs[id] == 0)
			a->free[a->nfree++] = id;
	}
	/* reversed, so the next get pops them in their order: a sequence's
	 * blocks stay ascending and its transfers coalesce into runs */
	for (uint32_t lo = top, hi = a->nfree; lo + 1 < hi; lo++, hi--) {
		uint32_t t = a->free[lo];

		a->free[lo] = a->free[hi - 1];
		a->free[hi - 1] = t;
	}
	if (a->nfree > top && a->on_free)
		a->on_free(a->on_free_arg);
	return PDX_OK;
undo:
	while (i-- > 0) {
		if (a->refs[ids[i]] == 0)
			a->nfree--;
		ref_one(a, ids[i]);
	}
	return PDX_ERANGE;
}

void pdx_block_alloc_on_free(struct pdx_block_alloc *a,
			     void (*cb)(void *arg), void *arg)
{
	a->on_free = cb;
	a->on_free_arg = arg;
}

void pdx_block_alloc_wake(struct pdx_block_alloc *a)
{
	if (a->on_free)
		a->on_free(a->on_free_arg);
}

uint32_t pdx_block_alloc_refs(const struct pdx_block_alloc *a, uint32_t id)
{
	return id < a->total ? a->refs[id] : 0;
}

void pdx_block_alloc_stats(const struct pdx_block_alloc *a,
			   struct pdx_block_stats *out)
{
	out->total = a->total;
	out->free = a->nfree;
	out->held = a->total - a->nfree;
	out->shared = a->shared;
}
