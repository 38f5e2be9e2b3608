/* pdx-bench's progress line: tqdm's counts, times and rate. */
#include "bench/load_progress.h"
#include "tests/check.h"

#include <math.h>

int main(void)
{
	char buf[160];

	/* 37 of 100 in 12 s: 3.08 req/s, 63 left take 20 s. */
	pdx_load_progress_format(buf, sizeof(buf), 37, 100, 12.0);
	CHECK_STR_CONTAINS(buf, " 37%|#######             |");
	CHECK_STR_CONTAINS(buf, "  37/100 [00:12<00:20, 3.1 req/s]");
	/* Nothing done yet: no rate, no estimate. */
	pdx_load_progress_format(buf, sizeof(buf), 0, 5, 0.3);
	CHECK(
	    !strcmp(buf, "  0%|                    | 0/5 [00:00<?, ? req/s]"));
	/* Done: the whole bar; slow runs print the rate with 2 decimals. */
	pdx_load_progress_format(buf, sizeof(buf), 5, 5, 20.0);
	CHECK(!strcmp(
	    buf, "100%|####################| 5/5 [00:20<00:00, 0.25 req/s]"));
	/* Never wider than asked. */
	CHECK(pdx_load_progress_format(buf, 8, 3, 1000, 1.0) > 8);
	CHECK_EQ(strlen(buf), 7);

	pdx_load_progress_time(3725.9, buf, sizeof(buf));
	CHECK(!strcmp(buf, "1:02:05"));
	pdx_load_progress_time(59.99, buf, sizeof(buf));
	CHECK(!strcmp(buf, "00:59"));
	pdx_load_progress_time(NAN, buf, sizeof(buf));
	CHECK(!strcmp(buf, "?"));
	pdx_load_progress_time(INFINITY, buf, sizeof(buf));
	CHECK(!strcmp(buf, "?"));
	CHECK_DONE();
}
