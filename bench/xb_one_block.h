/* pdx-xferbench --one-block: the control path's cost, measured where it is
 * all there is. One-block transfers one after another, each followed by a
 * ping over the decode agent's engine link (the yardstick: the same
 * sockets and loop, no transfer), and the agents' trace lines
 * (PDX_AGENT_TRACE=1, agent/trace.h) matched to each transfer so the report
 * can say where the time goes (bench/xb_report.h). */
#ifndef PDX_BENCH_XB_ONE_BLOCK_H
#define PDX_BENCH_XB_ONE_BLOCK_H

#include <stdint.h>

#include "agent/trace.h"
#include "bench/xb_measure.h"

/* One measured transfer. The agents' marks (agent/trace.h) come later,
 * through their logs. */
struct xb_ob_sample {
	char hex[33];
	uint64_t t_ld;           /* P: the last layer_done called */
	uint64_t t_ev;           /* D: the engine read "received" */
	uint64_t rtt_ns;         /* the ping right after it */
	uint64_t p[MARK_N];      /* the prefill agent's marks */
	uint64_t d[MARK_N];      /* the decode agent's */
};

struct xb_one_block {
	struct xb_ob_sample *s;
	uint32_t n;
};

/* After the run's iterations: --one-block's transfers (the run's own
 * arm, whole), into ob. A mismatch clears the arm's verified. */
void xb_one_block_run(struct xb_run *r, struct xb_one_block *ob);

/* A line of an agent's log (an xb_trace_fn, arg the xb_one_block): a
 * trace line's marks go to the sample of its transfer, if any. */
void xb_one_block_trace(void *arg, const char *line);

#endif
