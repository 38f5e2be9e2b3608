/* The control path's timeline (pdx-xferbench --one-block): with
 * PDX_AGENT_TRACE=1 the agent stamps a transfer's last steps and logs
 * them in one line when it ends. */
#ifndef PDX_AGENT_TRACE_H
#define PDX_AGENT_TRACE_H

#include <stdbool.h>
#include <stdint.h>

/* In the order a push goes through them; the last of each kind wins
 * (a layer_done, a push per layer). */
enum xfer_mark {
	MARK_LAYER_DONE, /* sender: layer_done read off the engine link */
	MARK_PUSH,	 /* sender: a layer's push begins */
	MARK_PUSHED,	 /* sender: it returned (ipc: copied) */
	MARK_FLUSHED,	 /* sender: every byte is at the receiver */
	/* the sends are stamped as they begin: a stamp after one would race
	 * the receiver, which may read the message first */
	MARK_DONE_SENT,	 /* sender: "done" built, being sent */
	MARK_DONE_HEARD, /* receiver: "done" read off the peer link */
	MARK_EVENT,	 /* the engine's event about to be built and sent */
	MARK_N,
};

/* The mark's name in the trace line (pdx-xferbench parses it). */
static inline const char *xfer_mark_name(enum xfer_mark m)
{
	static const char *const names[MARK_N] = {
		[MARK_LAYER_DONE] = "layer_done", [MARK_PUSH] = "push",
		[MARK_PUSHED] = "pushed",	  [MARK_FLUSHED] = "flushed",
		[MARK_DONE_SENT] = "done_sent",	  [MARK_DONE_HEARD] = "done_heard",
		[MARK_EVENT] = "event",
	};

	return names[m];
}

struct xfer;

/* One line: "trace HEX send|recv NAME=NS ..." (CLOCK_MONOTONIC, the
 * clock of the engines' pdx_engine_event.t_*_ns). */
void xfer_trace_log(const struct xfer *x);

#endif
