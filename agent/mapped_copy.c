/* Copies between KV pools mapped here from shared memory: a peer's (the
 * ipc lane, a pull's reads) and our engine's. Another process owns those
 * objects and may shrink one under us (ftruncate); touching a page past
 * its new end raises SIGBUS, which would kill the agent and every
 * transfer it serves for one engine's mistake. A copy here runs with a
 * SIGBUS handler that jumps back out of it, so only its transfer fails.
 *
 * The handler is installed at the first copy, after UCX installed its
 * own (it prints a backtrace): a SIGBUS outside a copy here puts that one
 * back and returns, so the fault, raised again, reaches it. One thread
 * copies (the agent's loop); the jump buffer is the thread's anyway. */
#define PDX_LOG_TOPIC "push"
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>

#include "agent/agent.h"
#include "common/log.h"

static __thread sigjmp_buf *volatile copying;
static struct sigaction before;

static void on_sigbus(int sig, siginfo_t *info, void *uc)
{
	(void)uc;
	if (copying && info->si_code > 0) /* a fault, not a kill */
		siglongjmp(*copying, 1);
	sigaction(sig, &before, NULL);
	if (info->si_code <= 0) /* sent: raised again for that handler */
		raise(sig);
}

static void install(void)
{
	static bool done;
	struct sigaction sa = { .sa_sigaction = on_sigbus };

	if (done)
		return;
	done = true;
	/* SA_NODEFER: the jump leaves the handler without restoring the
	 * mask, so SIGBUS must not be blocked in it */
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, &before);
}

bool mapped_copy_piece(uint8_t *dst, const uint8_t *src,
		       const struct pdx_kv_piece *p)
{
	sigjmp_buf here;

	install();
	/* no signal mask saved: nothing changes it between here and a jump */
	if (sigsetjmp(here, 0)) {
		copying = NULL;
		return false;
	}
	copying = &here;
	pdx_kv_piece_copy(dst, src, p);
	copying = NULL;
	return true;
}
