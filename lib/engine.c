/* An engine's life on the client side: pdx_engine_connect() makes what
 * every other file works on, pdx_engine_free() lets it go. This is the top
 * of libpdx's files (client.h lists them from the bottom): the only one
 * that may reach all of what an engine holds.
 */
#define PDX_LOG_TOPIC "engine"
#include "lib/client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT_MS 10000
#define DEFAULT_LIVENESS_MS 1000

/* All that e holds (pdx_engine_free(), now or at the end of the call it
 * came during). */
static void destroy(struct pdx_engine *e)
{
	/* In a forked child the link and the CUDA context are the parent's:
	 * ZeroMQ's calls there may wait on a lock an I/O thread, absent in
	 * the child, held at the fork. Only the memory is the child's (and
	 * the copies of descriptors the fork made). */
	if (!pdx__forked(e)) {
		pdx__link_close(e);
		pdx__cuda_free(e->cuda);
	} else {
		pdx__direct_close(e, true);
	}
	close(e->wake);
	pdx__inflight_free(e);
	pdx__meta_free(e);
	free(e->reg);
	free(e);
}

pdx_status_t pdx_engine_connect(const struct pdx_engine_params *params,
				struct pdx_engine **out)
{
	struct pdx_engine *e;
	unsigned fork_generation;
	pdx_status_t st;

	if (!out) {
		log_error("pdx_engine_connect: no place for the engine (NULL)");
		return PDX_EINVAL;
	}
	*out = NULL;
	if (!params || !params->agent || !params->agent[0] ||
	    strnlen(params->agent, PDX_ADDR_MAX) >= PDX_ADDR_MAX) {
		log_error("pdx_engine_connect: want the agent's address, "
			  "ipc://PATH, of under %d bytes",
			  PDX_ADDR_MAX);
		return PDX_EINVAL;
	}
	if (params->timeout_ms < 0 || params->liveness_ms < 0 ||
	    params->xfer_timeout_ms > PDX_XFER_TIMEOUT_MAX_MS) {
		log_error("pdx_engine_connect: timeout_ms %d, liveness_ms %d: "
			  "want 0 (the default) or more; xfer_timeout_ms %u: "
			  "want at most %u",
			  params->timeout_ms, params->liveness_ms,
			  (unsigned)params->xfer_timeout_ms,
			  (unsigned)PDX_XFER_TIMEOUT_MAX_MS);
		return PDX_EINVAL;
	}
	st = pdx__fork_generation(&fork_generation);
	if (st != PDX_OK)
		return st;
	e = calloc(1, sizeof(*e));
	if (!e)
		return PDX_ENOMEM;
	e->efd = -1;
	e->lane.fd = -1;
	e->destroy = destroy;
	/* before anything that may fail: pdx_engine_free() closes it */
	e->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (e->wake < 0) {
		st = errno == ENOMEM ? PDX_ENOMEM : PDX_EIO; /* EMFILE: EIO */
		free(e);
		return st;
	}
	e->fork_generation = fork_generation;
	e->pid = getpid();
	e->timeout_ms =
	    params->timeout_ms ? params->timeout_ms : DEFAULT_TIMEOUT_MS;
	e->liveness_ms =
	    params->liveness_ms ? params->liveness_ms : DEFAULT_LIVENESS_MS;
	e->xfer_timeout_ms = params->xfer_timeout_ms;
	snprintf(e->why_down, sizeof(e->why_down),
		 "no connection to the agent at %s yet", params->agent);
	st = pdx__link_open(e, params->agent);
	if (st != PDX_OK) {
		pdx_engine_free(e);
		return st;
	}
	*out = e;
	return PDX_OK;
}

void pdx_engine_free(struct pdx_engine *e)
{
	if (!e)
		return;
	/* A call in another thread frees it as it returns. Not in a forked
	 * child: no thread of its runs a call at the fork. */
	if (pdx__forked(e) || !pdx__free_defer(e))
		destroy(e);
}
