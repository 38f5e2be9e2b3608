/* pdx-bench's progress line, in tqdm's shape (what vllm bench serve
 * draws): " 37%|#######             |  37/100 [00:12<00:20, 3.1 req/s]".
 * Pure: the caller decides where and how often to draw it (load_http.c:
 * on stderr when it is a terminal, at most ten times a second). */
#ifndef PDX_BENCH_LOAD_PROGRESS_H
#define PDX_BENCH_LOAD_PROGRESS_H

#include <stddef.h>

/* tqdm's time: "MM:SS", or "H:MM:SS" from an hour on; "?" when unknown
 * (negative, NaN or infinite). */
void pdx_load_progress_time(double s, char *buf, size_t len);

/* The line for done of total requests after elapsed_s seconds: the
 * remaining time assumes the rate so far (done / elapsed), "?" before
 * the first request ends. Returns snprintf's count. */
int pdx_load_progress_format(char *buf, size_t len, size_t done, size_t total,
			     double elapsed_s);

#endif
