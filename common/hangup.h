/* Whether SIGHUP is ignored now: a program started under nohup (or by a
 * launcher that ignores it) must keep ignoring it, where pdx-engine,
 * pdx-proxy and pdx-agent otherwise stop cleanly at a hangup (a closed
 * terminal). pdx-agent asks before any library's constructor runs: UCX's
 * installs its debug handler on SIGHUP (UCX_DEBUG_SIGNO). */
#ifndef PDX_COMMON_HANGUP_H
#define PDX_COMMON_HANGUP_H

#include <signal.h>
#include <stdbool.h>

static inline bool pdx_sighup_ignored(void)
{
	struct sigaction sa;

	return sigaction(SIGHUP, NULL, &sa) == 0 && sa.sa_handler == SIG_IGN;
}

#endif
