/* How pdx-xferbench gives up: one message on stderr, "pdx-xferbench: "
 * first, then exit. Every file of the program ends through these, so the
 * message shape and the exit codes (1: the run failed, 2: a bad command
 * line) are decided in one place. */
#ifndef PDX_BENCH_XB_FAIL_H
#define PDX_BENCH_XB_FAIL_H

/* The run failed: exit 1. The cleanup registry (bench/pdx_bench.h) kills
 * and unlinks what was made, at exit. */
void xb_fail(const char *fmt, ...)
	__attribute__((format(printf, 1, 2), noreturn));

/* The command line is wrong: exit 2, pointing at --help. */
void xb_bad(const char *fmt, ...)
	__attribute__((format(printf, 1, 2), noreturn));

#endif
