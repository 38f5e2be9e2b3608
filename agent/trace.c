/* The control path's timeline: its marks cost one clock read each, and
 * only with PDX_AGENT_TRACE=1 (a->trace); the line is logged when the
 * transfer ends, after its event went out, so the write never sits on
 * the path it measures. pdx-xferbench --one-block reads it back
 * (docs/benchmarking.md). */
#define PDX_LOG_TOPIC "trace"
#include <stdio.h>

#include "agent/agent.h"
#include "common/log.h"

void xfer_trace_log(const struct xfer *x)
{
	char line[512], hex[33];
	size_t n = 0;

	for (enum xfer_mark m = 0; m < MARK_N; m++)
		if (x->marks[m] && n < sizeof(line))
			n += (size_t)snprintf(line + n, sizeof(line) - n,
					      " %s=%llu", xfer_mark_name(m),
					      (unsigned long long)x->marks[m]);
	pdx_xfer_id_hex(&x->id, hex);
	log_info("%s %s%s", hex, x->role == XFER_SEND ? "send" : "recv",
		 n ? line : "");
}
