/* The data path's driver: the sender pushes each computed layer into the
 * receiver's blocks by the path chosen at the handshake (host_path.c,
 * gpu_path.c), then flushes and says "done" (complete.c). The receiver's
 * UCX hands each active message to its kind's handler, registered here. */
#define PDX_LOG_TOPIC "push"
#include "agent/agent.h"
#include "common/log.h"

void push_try(struct xfer *x)
{
	int layer;

	if (x->finished || !x->announced || x->role != XFER_SEND || !x->peer ||
	    x->peer->state != PEER_READY || !x->sm.blocks_known)
		return;
	if (!x->runs) {
		if (x->n_remote != x->n_blocks) {
			xfer_fail(x, PDX_EINVAL, true,
				  "receiver has %u blocks, sender %u", x->n_remote,
				  x->n_blocks);
			return;
		}
		if (x->peer->layout.layers != x->sm.layers) {
			xfer_fail(x, PDX_EINCOMPAT, true, "layer counts differ");
			return;
		}
		if (host_plan_runs(x)) {
			xfer_fail(x, PDX_ENOMEM, true, "out of memory");
			return;
		}
	}
	while ((layer = pdx_xfer_sm_next(&x->sm)) >= 0) {
		pdx_status_t st;
		uint32_t n = 1;

		if (x->skip == x->n_blocks)
			continue; /* the receiver holds them all: done alone */
		if (data_path_gpu(x->peer->path)) {
			/* the ready layers after it too: one launch */
			n += pdx_xfer_sm_take_run(&x->sm, (uint32_t)layer + 1,
						  UINT32_MAX);
			log_debug("push layers %d..%u", layer, layer + n - 1);
			st = gpu_push_layers(x, (uint32_t)layer, n);
		} else {
			log_debug("push layer %d: %zu runs", layer, x->n_runs);
			st = push_layer_runs(x, (uint32_t)layer);
		}
		if (st) {
			xfer_fail(x, st, true, "push of layer %d to %s: %s",
				  layer, x->peer_addr, pdx_status_str(st));
			return;
		}
	}
	push_maybe_flush(x);
}

pdx_status_t push_am_register(struct agent *a)
{
	static const struct {
		enum am_id id;
		pdx_ucx_am_cb cb;
	} handlers[] = {
		{ AM_RUN, host_on_run },
		{ AM_STAGED_CHUNK, staged_on_chunk },
		{ AM_STAGED_READY, staged_on_ready },
		{ AM_STAGED_FREE, staged_on_free },
	};

	for (size_t i = 0; i < sizeof(handlers) / sizeof(handlers[0]); i++) {
		pdx_status_t st = pdx_ucx_am_handler(a->ucx, handlers[i].id,
						     handlers[i].cb, a);

		if (st)
			return st;
	}
	return PDX_OK;
}
