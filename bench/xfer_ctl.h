/* pdx-xferbench --one-block: the pieces of the control-path figure that
 * are not the transfers themselves. The yardstick is a ping over an
 * agent's engine link (ZeroMQ, ipc://, answered by the agent's loop);
 * the breakdown comes from the agents' trace lines (PDX_AGENT_TRACE=1,
 * agent/trace.h). */
#ifndef PDX_BENCH_XFER_CTL_H
#define PDX_BENCH_XFER_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/trace.h"

struct xc_ping;

/* A DEALER of its own to the agent at engine (ipc://PATH). NULL, with
 * why in err, on failure. */
struct xc_ping *xc_ping_open(const char *engine, char *err, size_t errlen);
/* One ping and its pong: 0 with the round trip in *rtt_ns, or -1 with
 * why in err. */
int xc_ping(struct xc_ping *p, int timeout_ms, uint64_t *rtt_ns, char *err,
	    size_t errlen);
void xc_ping_close(struct xc_ping *p);

/* A trace line of an agent's log ("... trace: HEX send|recv NAME=NS
 * ..."): true with the transfer's id in hex, its role and the marks it
 * names (the others 0); false for any other line. */
bool xc_trace_parse(const char *line, char hex[33], bool *send,
		    uint64_t marks[MARK_N]);

#endif
