/* The data path's driver: the sender pushes each computed layer into the
 * receiver's blocks through the operations of the path chosen at the
 * handshake (struct data_path_ops: host_path.c, gpu_path.c, staged.c),
 * then flushes and says "done" (complete.c). The receiver's UCX hands
 * each active message to the handler its path gave its id, registered
 * here. */
#define PDX_LOG_TOPIC "push"
#include "agent/agent.h"
#include "agent/am.h"
#include "common/log.h"

bool push_prepare(struct xfer *x)
{
	const struct data_path_ops *ops;
	char why[PDX_REASON_MAX];
	pdx_status_t st;

	if (x->finished || !x->announced || x->role != XFER_SEND || !x->peer ||
	    x->peer->state != PEER_READY || !x->sm.blocks_known)
		return false;
	if (x->path_ready)
		return true;
	ops = x->peer->ops;
	if (x->n_remote != x->n_blocks) {
		xfer_fail(x, PDX_EINVAL, true, "receiver has %u blocks, sender %u",
			  x->n_remote, x->n_blocks);
		return false;
	}
	if (x->peer->layout.layers != x->sm.layers) {
		xfer_fail(x, PDX_EINCOMPAT, true, "layer counts differ");
		return false;
	}
	tp_order_slice(x, x->peer);
	if (tp_peer_refusal(x, x->peer, why, sizeof(why))) {
		xfer_fail(x, PDX_EINCOMPAT, true, "%s", why);
		return false;
	}
	st = ops->ready ? ops->ready(x) : PDX_OK;
	if (st) {
		xfer_fail(x, st, true, "%s", st == PDX_ENOMEM ?
			  "out of memory" : pdx_status_str(st));
		return false;
	}
	x->path_ready = true;
	return true;
}

void push_try(struct xfer *x)
{
	const struct data_path_ops *ops;
	int layer;

	if (!push_prepare(x))
		return;
	ops = x->peer->ops;
	if (x->pull && x->skip < x->n_blocks) {
		pull_offer(x); /* the receiver reads them */
		return;
	}
	/* the loop's turn may be spent: the rest, and the flush, from the
	 * loop */
	while (!xfer_yield(x, push_try) &&
	       (layer = pdx_xfer_sm_next(&x->sm)) >= 0) {
		pdx_status_t st;
		uint32_t n = 1;

		if (x->skip == x->n_blocks)
			continue; /* the receiver holds them all: done alone */
		xfer_mark(x, MARK_PUSH);
		if (ops->layer_runs) { /* the ready layers after it too */
			n += pdx_xfer_sm_take_run(&x->sm, (uint32_t)layer + 1,
						  UINT32_MAX);
			log_debug("push layers %d..%u", layer, layer + n - 1);
		} else { /* tests wait for this line */
			log_debug("push layer %d: %zu runs", layer, x->n_runs);
		}
		st = ops->push(x, (uint32_t)layer, n);
		xfer_mark(x, MARK_PUSHED);
		if (st) {
			xfer_fail(x, st, true, "push of layer %d to %s: %s",
				  layer, x->peer_addr, pdx_status_str(st));
			return;
		}
	}
	if (!x->later)
		complete_try_flush(x);
}

pdx_status_t push_am_register(struct agent *a)
{
	static const struct data_path_ops *const paths[] = {
		&data_path_ipc_ops,	 &data_path_put_ops,
		&data_path_am_ops,	 &data_path_cuda_put_ops,
		&data_path_cuda_ipc_ops, &data_path_staged_ops,
	};

	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
		for (uint32_t k = 0; k < paths[i]->n_am; k++) {
			const struct data_path_am *m = &paths[i]->am[k];
			pdx_status_t st = pdx_ucx_am_handler(a->ucx, m->id,
							     m->on_message, a);

			if (st)
				return st;
		}
	/* not a data path's: "done" on the ipc lane (complete.c) */
	return pdx_ucx_am_handler(a->ucx, AM_DONE, complete_on_done_am, a);
}
