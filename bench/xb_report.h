/* pdx-xferbench's report: a run's samples (bench/xb_measure.h,
 * bench/xb_one_block.h) turned into figures (medians, percentiles, rates,
 * ratios against the yardsticks) and printed once, as a table or, with
 * --json, as one JSON object on stdout. The keys and their meaning are
 * --help's (bench/xb_opts.c); scripts and tests read them, so a key never
 * changes its name or its unit. */
#ifndef PDX_BENCH_XB_REPORT_H
#define PDX_BENCH_XB_REPORT_H

#include "bench/xb_measure.h"
#include "bench/xb_one_block.h"

/* Prints r's figures (and, with --one-block, ob's); sorts their samples. */
void xb_report_print(struct xb_run *r, const struct xb_one_block *ob);

#endif
