/* A circuit breaker per engine instance: after `failures` requests in a
 * row failed (no answer, a timeout, a 5xx), the instance gets no requests
 * for `open` time; then one trial request goes (half-open): its success
 * closes the breaker, its failure opens it again.
 *
 *   closed --failures in a row--> open --open time over, a trial picked-->
 *   half-open --trial ok--> closed
 *             --trial failed--> open
 *
 * Health checks that saw the instance go and come back since it opened
 * (one sent after it opened failed, a later one passed) let the trial go
 * at once: an instance restarted within the open time was otherwise kept
 * out of rotation for all of it, and the other instances' failures had
 * nowhere to be retried meanwhile. A check that only ever passes says
 * nothing of what opened it (a failed KV transfer, a 500).
 *
 * A trial whose result never comes (its client left, its call ended
 * before the leg started) does not wedge the breaker: another trial may
 * go once `open` time has passed since the last one.
 *
 * Pure: time comes in as an argument (pdx_now_ns()). One thread.
 */
#ifndef PDX_PROXY_BREAKER_H
#define PDX_PROXY_BREAKER_H

#include <stdbool.h>
#include <stdint.h>

enum pdx_breaker_state {
	PDX_BREAKER_CLOSED,
	PDX_BREAKER_OPEN,
	PDX_BREAKER_HALF_OPEN,
	PDX_BREAKER_STATES
};

struct pdx_breaker {
	unsigned failures; /* in a row that open it; 0: never opens */
	uint64_t open_ns;  /* how long it stays open */
	enum pdx_breaker_state state;
	unsigned fails;	   /* consecutive failures while closed */
	uint64_t until_ns; /* open, half-open: when a trial may go */
	bool check_failed; /* open: a check sent since it opened failed */
	uint64_t entered[PDX_BREAKER_STATES]; /* transitions into each */
};

/* May a request go to the instance now? */
bool pdx_breaker_usable(const struct pdx_breaker *b, uint64_t now);

/* Half-open, its trial under way: no other request may go now (but see
 * pool.c: one may, where no other instance can take it). */
bool pdx_breaker_on_trial(const struct pdx_breaker *b, uint64_t now);

/* A request was given to the instance (pdx_breaker_usable() said yes):
 * past the open time it is the trial, and the breaker turns half-open. */
void pdx_breaker_admit(struct pdx_breaker *b, uint64_t now);

/* A health check sent at sent_ns ended, ok or not: an open breaker
 * that saw one sent after it opened fail and then one pass lets its
 * trial go now. Returns whether it did. */
bool pdx_breaker_checked(struct pdx_breaker *b, bool ok, uint64_t sent_ns,
			 uint64_t now);

/* A request's result. Results that come while open (requests sent before
 * it opened) change nothing. Returns whether the state changed. */
bool pdx_breaker_result(struct pdx_breaker *b, bool ok, uint64_t now);

const char *pdx_breaker_state_name(enum pdx_breaker_state s);

#endif
