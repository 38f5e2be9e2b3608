/* The HTTP side of pdx-bench: sends prebuilt streaming requests at their
 * arrival times over libevent's evhttp, reads the server-sent events as
 * they come, and times every token chunk.
 *
 * Times are taken from each request's intended send time: its arrival
 * time, or the moment a --max-concurrency slot freed up when it had to
 * wait for one (that wait is reported as its client queue time). A
 * request the tool itself sends late is still timed from when it should
 * have gone (no coordinated omission); the worst such lag is reported.
 * A request that follows another (a chat session's next round) becomes
 * ready at the later of its arrival and the end of the one it follows,
 * and is timed from then.
 * A request may also be cancelled on purpose: the client closes its
 * connection a given delay after sending it, if it has not ended by then
 * (the server sees a client that left); it is counted as aborted.
 * Runs one event loop on the calling thread until every request has
 * finished, failed, timed out or been aborted. */
#ifndef PDX_BENCH_LOAD_HTTP_H
#define PDX_BENCH_LOAD_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "bench/load_metrics.h"

struct pdx_load_run_params {
	const char *host; /* numeric address or name */
	int port;
	const char *path; /* e.g. "/v1/completions" */
	bool chat;	  /* parse chat deltas rather than completions text */
	char *const *bodies; /* one JSON body per request */
	const size_t *body_lens;
	const int *prompt_lens; /* per request, unless usage says otherwise */
	const double *arrivals; /* seconds from the start, non-decreasing */
	/* NULL, or per request: sent only after request i - 1 has ended
	 * (follows[0] is ignored). */
	const bool *follows;
	size_t n;
	int max_concurrency; /* 0: unlimited */
	double timeout_s;    /* per request, from its send; <= 0: 6 hours */
	/* NULL, or per request: seconds from its send after which the
	 * client closes the connection unless the request has ended; < 0:
	 * never (bench/load_abort.h draws them). */
	const double *abort_after;
	bool progress;	     /* redraw a progress line on stderr every 0.1 s */
	bool keep_text;	     /* keep generated text in the results */
	const char *api_key; /* "Authorization: Bearer" when not NULL */
};

struct pdx_load_run_stats {
	double duration_s;     /* start to the last request's end */
	double max_send_lag_s; /* worst (actual - intended) send time */
};

/* Fills res[0..n-1] (clear them with pdx_load_result_clear). Returns 0
 * when the run took place (requests may still have failed), -1 with the
 * reason in err when it could not start. */
int pdx_load_run(const struct pdx_load_run_params *p,
		 struct pdx_load_result *res, struct pdx_load_run_stats *st,
		 char *err, size_t errlen);

/* A plain GET (for /v1/models); *body_out malloc'd. -1 on a transport
 * failure; otherwise 0 with the HTTP status in *status_out. */
int pdx_load_http_get(const char *host, int port, const char *path,
		      double timeout_s, char **body_out, int *status_out);

#endif
