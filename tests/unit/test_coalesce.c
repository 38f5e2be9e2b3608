#include "agent/coalesce.h"
#include "tests/check.h"

int main(void)
{
	struct pdx_run r[8];
	size_t n;

	{ /* both sides consecutive: one run */
		uint32_t s[] = { 10, 11, 12, 13 }, d[] = { 3, 4, 5, 6 };

		n = pdx_coalesce(s, d, 0, 4, 0, r);
		CHECK_EQ(n, 1);
		CHECK_EQ(r[0].src, 10);
		CHECK_EQ(r[0].dst, 3);
		CHECK_EQ(r[0].count, 4);
		CHECK_EQ(r[0].index, 0);
	}
	{ /* a break on either side splits */
		uint32_t s[] = { 1, 2, 3, 7, 8 }, d[] = { 5, 6, 9, 10, 11 };

		n = pdx_coalesce(s, d, 0, 5, 0, r);
		CHECK_EQ(n, 3);
		CHECK_EQ(r[0].count, 2);
		CHECK_EQ(r[1].src, 3);
		CHECK_EQ(r[1].dst, 9);
		CHECK_EQ(r[1].count, 1);
		CHECK_EQ(r[1].index, 2);
		CHECK_EQ(r[2].src, 7);
		CHECK_EQ(r[2].count, 2);
	}
	{ /* skipped leading blocks and a run cap */
		uint32_t s[] = { 0, 1, 2, 3, 4, 5 }, d[] = { 0, 1, 2, 3, 4, 5 };

		n = pdx_coalesce(s, d, 2, 6, 3, r);
		CHECK_EQ(n, 2);
		CHECK_EQ(r[0].index, 2);
		CHECK_EQ(r[0].count, 3);
		CHECK_EQ(r[1].index, 5);
		CHECK_EQ(r[1].count, 1);
		n = pdx_coalesce(s, d, 0, 6, 1, r);
		CHECK_EQ(n, 6);
	}
	{ /* descending ids never merge */
		uint32_t s[] = { 5, 4 }, d[] = { 5, 4 };

		CHECK_EQ(pdx_coalesce(s, d, 0, 2, 0, r), 2);
	}
	CHECK_DONE();
}
