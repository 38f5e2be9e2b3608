/* An incremental parser for server-sent events (text/event-stream), as
 * OpenAI-compatible servers stream completions: "data: {...}" lines, an
 * empty line ending each event, "data: [DONE]" last.
 *
 * Bytes may arrive split anywhere (inside a line, between "\r" and "\n");
 * pdx_sse_feed() keeps what it has not finished and calls the event
 * callback once per complete event with the event's data (several data
 * lines joined by "\n", as the SSE specification says). Comment lines
 * (":" first) and fields other than "data" are skipped; a line without a
 * colon is a field with an empty value (and so skipped unless it is
 * "data"). Pure: no I/O, no clock; one parser per stream; not thread-safe. */
#ifndef PDX_BENCH_LOAD_SSE_H
#define PDX_BENCH_LOAD_SSE_H

#include <stdbool.h>
#include <stddef.h>

/* Called for each complete event. 'data' is NUL-terminated (len bytes) and
 * valid only during the call. Return 0 to go on, non-zero to stop: feed
 * then returns that value. */
typedef int (*pdx_sse_event_cb)(void *arg, const char *data, size_t len);

struct pdx_sse {
	char *line; /* the line being assembled */
	size_t line_len, line_cap;
	char *data; /* the event's data so far */
	size_t data_len, data_cap;
	bool has_data; /* a data field was seen in this event */
	bool after_cr; /* the last byte was "\r": skip a following "\n" */
	size_t max;    /* limit for one line or one event's data */
};

/* max_event: the most bytes one line or one event's data may hold (0: 16
 * MiB); a longer one makes feed fail with -1. */
void pdx_sse_init(struct pdx_sse *p, size_t max_event);
void pdx_sse_free(
    struct pdx_sse *p); /* NULL-safe; p may be reused after init */

/* Consumes all of buf. Returns 0, -1 on an over-long line or event or out
 * of memory, or the callback's non-zero return. */
int pdx_sse_feed(struct pdx_sse *p, const char *buf, size_t len,
		 pdx_sse_event_cb cb, void *arg);

/* At end of stream: an unterminated last line is taken as a line, and an
 * event still pending (no empty line after it) is delivered. Servers that
 * end the stream right after "data: [DONE]" are common, and vllm's client
 * accepts them too. Same returns as feed. */
int pdx_sse_finish(struct pdx_sse *p, pdx_sse_event_cb cb, void *arg);

#endif
