/* The block allocator: all or nothing, shared blocks freed by their last
 * holder, bad calls change nothing; and a long random run against a
 * plain model of it. */
#include <stdbool.h>
#include <string.h>

#include "engine/block_alloc.h"
#include "tests/check.h"

static struct pdx_block_stats stats(const struct pdx_block_alloc *a)
{
	struct pdx_block_stats s;

	pdx_block_alloc_stats(a, &s);
	return s;
}

static void basics(void)
{
	struct pdx_block_alloc *a;
	uint32_t ids[8], more[8];

	CHECK_EQ(pdx_block_alloc_new(0, &a), PDX_EINVAL);
	CHECK_EQ(pdx_block_alloc_new(8, &a), PDX_OK);
	/* a fresh pool hands out consecutive ids */
	CHECK_EQ(pdx_block_alloc_get(a, 4, ids), PDX_OK);
	for (uint32_t i = 0; i < 4; i++)
		CHECK_EQ(ids[i], i);
	CHECK_EQ(stats(a).free, 4);
	CHECK_EQ(stats(a).held, 4);
	CHECK_EQ(stats(a).total, 8);
	/* all or nothing */
	CHECK_EQ(pdx_block_alloc_get(a, 5, more), PDX_EAGAIN);
	CHECK_EQ(stats(a).free, 4);
	CHECK_EQ(pdx_block_alloc_get(a, 9, more), PDX_ETOOBIG);
	CHECK_EQ(pdx_block_alloc_get(a, 0, more), PDX_OK);
	/* freed blocks come back last first */
	CHECK_EQ(pdx_block_alloc_put(a, &ids[2], 1), PDX_OK);
	CHECK_EQ(pdx_block_alloc_get(a, 1, more), PDX_OK);
	CHECK_EQ(more[0], 2);
	CHECK_EQ(pdx_block_alloc_put(a, ids, 4), PDX_OK);
	CHECK_EQ(stats(a).free, 8);
	/* a sequence freed and taken again keeps its order (runs coalesce) */
	CHECK_EQ(pdx_block_alloc_get(a, 4, ids), PDX_OK);
	CHECK_EQ(pdx_block_alloc_put(a, ids, 4), PDX_OK);
	CHECK_EQ(pdx_block_alloc_get(a, 4, more), PDX_OK);
	for (uint32_t i = 0; i < 4; i++)
		CHECK_EQ(more[i], ids[i]);
	CHECK_EQ(more[1], more[0] + 1);
	pdx_block_alloc_free(a);
	pdx_block_alloc_free(NULL);
}

/* A shared prefix: two holders, freed when the second lets go. */
static void sharing(void)
{
	struct pdx_block_alloc *a;
	uint32_t ids[3], twice[2];

	CHECK_EQ(pdx_block_alloc_new(4, &a), PDX_OK);
	CHECK_EQ(pdx_block_alloc_get(a, 3, ids), PDX_OK);
	CHECK_EQ(pdx_block_alloc_ref(a, ids, 2), PDX_OK);
	CHECK_EQ(stats(a).shared, 2);
	CHECK_EQ(pdx_block_alloc_refs(a, ids[0]), 2);
	CHECK_EQ(pdx_block_alloc_put(a, ids, 3), PDX_OK);
	CHECK_EQ(stats(a).shared, 0);
	CHECK_EQ(stats(a).held, 2);
	CHECK_EQ(pdx_block_alloc_refs(a, ids[2]), 0);
	/* one list may name a block once per reference */
	twice[0] = twice[1] = ids[0];
	CHECK_EQ(pdx_block_alloc_ref(a, twice, 1), PDX_OK);
	CHECK_EQ(pdx_block_alloc_put(a, twice, 2), PDX_OK);
	CHECK_EQ(pdx_block_alloc_refs(a, ids[0]), 0);
	CHECK_EQ(stats(a).held, 1);
	pdx_block_alloc_free(a);
}

/* A bad id anywhere in a list: an error and no change at all. */
static void refusals(void)
{
	struct pdx_block_alloc *a;
	struct pdx_block_stats before;
	uint32_t ids[4], bad[3], next;

	CHECK_EQ(pdx_block_alloc_new(8, &a), PDX_OK);
	CHECK_EQ(pdx_block_alloc_get(a, 4, ids), PDX_OK);
	CHECK_EQ(pdx_block_alloc_ref(a, &ids[1], 1), PDX_OK);
	before = stats(a);

	bad[0] = ids[0]; /* would be freed */
	bad[1] = ids[1]; /* would be unshared */
	bad[2] = 6;      /* free: the error */
	CHECK_EQ(pdx_block_alloc_put(a, bad, 3), PDX_ERANGE);
	bad[2] = 8; /* out of range */
	CHECK_EQ(pdx_block_alloc_put(a, bad, 3), PDX_ERANGE);
	CHECK_EQ(pdx_block_alloc_ref(a, bad, 3), PDX_ERANGE);
	bad[1] = bad[0]; /* one reference put twice */
	CHECK_EQ(pdx_block_alloc_put(a, bad, 2), PDX_ERANGE);
	CHECK_EQ(stats(a).free, before.free);
	CHECK_EQ(stats(a).shared, before.shared);
	CHECK_EQ(pdx_block_alloc_refs(a, ids[0]), 1);
	CHECK_EQ(pdx_block_alloc_refs(a, ids[1]), 2);
	/* the free list is as it was: the next block is still 4 */
	CHECK_EQ(pdx_block_alloc_get(a, 1, &next), PDX_OK);
	CHECK_EQ(next, 4);
	pdx_block_alloc_free(a);
}

#define N 64
#define HOLDERS 32

static bool agrees(const struct pdx_block_alloc *a, const uint32_t *refs)
{
	struct pdx_block_stats s = stats(a);
	uint32_t held = 0, shared = 0;

	for (uint32_t i = 0; i < N; i++) {
		if (pdx_block_alloc_refs(a, i) != refs[i])
			return false;
		held += refs[i] > 0;
		shared += refs[i] > 1;
	}
	return s.held == held && s.shared == shared && s.free == N - held;
}

/* Random gets, shares and puts by holders; the allocator agrees with a
 * count of references kept beside it, and no id is handed out twice. */
static void random_run(void)
{
	static uint32_t held[HOLDERS][N], nheld[HOLDERS];
	uint32_t refs[N] = { 0 }, rng = 12345, failures = 0;
	struct pdx_block_alloc *a;

	CHECK_EQ(pdx_block_alloc_new(N, &a), PDX_OK);
	for (int step = 0; step < 200000 && !failures; step++) {
		uint32_t h, n, free_now = 0;

		rng = rng * 1103515245 + 12345;
		h = (rng >> 8) % HOLDERS;
		n = (rng >> 16) % 9;
		for (uint32_t i = 0; i < N; i++)
			free_now += refs[i] == 0;
		if (nheld[h]) {
			CHECK_EQ(pdx_block_alloc_put(a, held[h], nheld[h]),
				 PDX_OK);
			for (uint32_t i = 0; i < nheld[h]; i++)
				refs[held[h][i]]--;
			nheld[h] = 0;
		} else if ((rng >> 28) % 2 && nheld[(h + 1) % HOLDERS]) {
			uint32_t o = (h + 1) % HOLDERS;

			CHECK_EQ(pdx_block_alloc_ref(a, held[o], nheld[o]),
				 PDX_OK);
			memcpy(held[h], held[o], nheld[o] * sizeof(uint32_t));
			nheld[h] = nheld[o];
			for (uint32_t i = 0; i < nheld[h]; i++)
				refs[held[h][i]]++;
		} else if (pdx_block_alloc_get(a, n, held[h]) == PDX_OK) {
			CHECK(n <= free_now);
			for (uint32_t i = 0; i < n; i++) {
				CHECK_EQ(refs[held[h][i]], 0);
				refs[held[h][i]] = 1;
			}
			nheld[h] = n;
		} else {
			CHECK(n > free_now);
		}
		failures += !agrees(a, refs);
	}
	CHECK_EQ(failures, 0);
	pdx_block_alloc_free(a);
}

int main(void)
{
	basics();
	sharing();
	refusals();
	random_run();
	CHECK_DONE();
}
