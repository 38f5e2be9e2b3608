/* The ipc data path (host memory, one host): the sender copies each run
 * into the receiver's pool, mapped here from the shm names in its hello;
 * a copy is complete when it returns, so "done" needs no flush. */
#define PDX_LOG_TOPIC "push"
#include <string.h>

#include "agent/agent.h"

static pdx_status_t ipc_run(struct xfer *x, uint32_t layer, uint32_t t,
			    const struct pdx_run *r, const struct host_run *at)
{
	memcpy(x->peer->regions[at->ri].map + at->off, at->src, at->len);
	x->bytes += at->len;
	return PDX_OK;
}

static pdx_status_t ipc_push(struct xfer *x, uint32_t layer, uint32_t n)
{
	return host_each_run(x, layer, true, ipc_run);
}

const struct data_path_ops data_path_ipc_ops = {
	.ready = host_plan_runs,
	.push = ipc_push,
};

