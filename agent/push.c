/* The data path: the sender pushes each computed layer into the receiver's
 * blocks (RMA put, or active messages the receiver places itself), flushes,
 * then says "done"; the receiver counts what arrived. */
#define PDX_LOG_TOPIC "push"
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "common/log.h"

#define AM_ID 1
#define AM_HDR_BYTES 24

static uint8_t *block_addr(const struct registration *g, uint32_t layer,
			   uint32_t tensor, uint32_t block)
{
	const struct pdx_kv_layer *ly = &g->layout.layer[layer];

	return (uint8_t *)g->regions[ly->base[tensor].region].addr +
	       ly->base[tensor].offset + (uint64_t)block * ly->block_stride;
}

/* Runs may span several blocks only where every layer's blocks are packed
 * (stride == block bytes) on both sides. */
static bool packed(const struct pdx_kv_layout *l)
{
	uint64_t bb = pdx_kv_layout_block_bytes(l);

	for (uint32_t i = 0; i < l->layers; i++)
		if (l->layer[i].block_stride != bb)
			return false;
	return true;
}

static int plan_runs(struct xfer *x)
{
	struct agent *a = x->agent;
	uint32_t max = packed(&a->reg.layout) && packed(&x->peer->layout) ? 0 : 1;

	x->runs = calloc(x->n_blocks, sizeof(*x->runs));
	if (!x->runs)
		return -1;
	x->n_runs = pdx_coalesce(x->blocks, x->remote_blocks, x->skip,
				 x->n_blocks, max, x->runs);
	return 0;
}

void push_op_done(struct xfer *x, pdx_status_t status)
{
	xfer_unhold(x);
	pdx_xfer_sm_op_finished(&x->sm);
	if (status && !x->finished)
		xfer_fail(x, status, true, "data operation to %s failed: %s",
			  x->peer_addr, pdx_status_str(status));
	push_maybe_flush(x);
	xfer_maybe_release(x);
}

void push_op_done_cb(void *arg, pdx_status_t status)
{
	push_op_done(arg, status);
}

static pdx_status_t push_run(struct xfer *x, uint32_t layer, uint32_t t,
			     const struct pdx_run *r)
{
	const struct registration *g = &x->agent->reg;
	struct peer *p = x->peer;
	uint64_t len = pdx_kv_layout_block_bytes(&g->layout) * r->count;
	uint8_t *src = block_addr(g, layer, t, r->src);
	struct pdx_ucx_mem *mem =
		g->regions[g->layout.layer[layer].base[t].region].mem;
	pdx_status_t st;

	if (p->path == DATA_IPC || p->path == DATA_PUT ||
	    p->path == DATA_CUDA_PUT) {
		const struct pdx_kv_layer *rl = &p->layout.layer[layer];
		uint32_t ri = rl->base[t].region;
		/* the peer's numbers: 128 bits, so none can wrap past its
		 * region */
		unsigned __int128 end =
		    (unsigned __int128)rl->base[t].offset +
		    (unsigned __int128)r->dst * rl->block_stride + len;
		uint64_t off;

		if (ri >= p->n_regions || end > p->regions[ri].size)
			return PDX_ERANGE;
		off = (uint64_t)(end - len);
		if (p->path == DATA_IPC) {
			memcpy(p->regions[ri].map + off, src, len);
			x->bytes += len;
			return PDX_OK;
		}
		st = pdx_ucx_put(p->ep, src, len, mem, p->regions[ri].addr + off,
				 p->regions[ri].rkey, push_op_done_cb, x);
	} else {
		uint8_t hdr[AM_HDR_BYTES] = { 0 };
		uint16_t l16 = (uint16_t)layer;

		memcpy(hdr, x->id.b, 16);
		memcpy(hdr + 16, &l16, 2);
		hdr[18] = (uint8_t)t;
		memcpy(hdr + 20, &r->index, 4);
		st = pdx_ucx_am_send(p->ep, AM_ID, hdr, sizeof(hdr), src, len, mem,
				     push_op_done_cb, x);
		if (!st)
			x->am_bytes += len;
	}
	if (!st) {
		xfer_hold(x);
		pdx_xfer_sm_op_started(&x->sm);
		x->bytes += len;
	}
	return st;
}

/* Every byte is at the receiver: tell it. */
static void send_done(struct xfer *x)
{
	struct pdx_mp_out o;

	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, 6);
	pdx_mp_kv_str(&o.pk, "op", "done");
	pdx_mp_kv_i64(&o.pk, "first_token", x->first_token);
	pdx_mp_kv_str(&o.pk, "from", x->agent->peer_addr);
	pdx_mp_kv_xfer(&o.pk, "xfer", &x->id);
	pdx_mp_kv_u64(&o.pk, "bytes", x->bytes);
	pdx_mp_kv_u64(&o.pk, "am_bytes", x->am_bytes);
	if (agent_zsend(x->peer->dealer, NULL, 0, o.buf.data, o.buf.size))
		xfer_fail(x, PDX_EPEER, false, "cannot send done to %s",
			  x->peer_addr);
	else
		xfer_succeed(x);
	log_debug("done sent to %s", x->peer_addr);
	pdx_mp_out_free(&o);
}

static void flush_done(void *arg, pdx_status_t status)
{
	struct xfer *x = arg;

	xfer_unhold(x);
	if (!x->finished && status)
		xfer_fail(x, status, true, "flush to %s failed: %s",
			  x->peer_addr, pdx_status_str(status));
	else if (!x->finished)
		send_done(x);
	xfer_maybe_release(x);
}

/* "done" only after every byte is at the receiver: UCX operations are
 * flushed first; ipc copies are complete when they return, cuda-ipc ones
 * when their stream callback ran. */
void push_maybe_flush(struct xfer *x)
{
	pdx_status_t st;

	if (x->finished || !pdx_xfer_sm_take_flush(&x->sm))
		return;
	if (x->peer->path == DATA_IPC || x->peer->path == DATA_CUDA_IPC) {
		send_done(x);
		return;
	}
	log_debug("flush to %s", x->peer_addr);
	st = pdx_ucx_flush(x->peer->ep, flush_done, x);
	if (st)
		xfer_fail(x, st, true, "flush to %s: %s", x->peer_addr,
			  pdx_status_str(st));
	else
		xfer_hold(x);
}

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
		if (plan_runs(x)) {
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

pdx_status_t push_layer_runs(struct xfer *x, uint32_t layer)
{
	for (size_t i = 0; i < x->n_runs; i++)
		for (uint32_t t = 0; t < x->agent->reg.layout.tensors; t++) {
			pdx_status_t st = push_run(x, layer, t, &x->runs[i]);

			if (st)
				return st;
		}
	return PDX_OK;
}

void recv_try_complete(struct xfer *x)
{
	if (x->finished || !x->done_seen || x->inflight)
		return;
	if (x->am_bytes == x->am_expected)
		xfer_succeed(x);
	else if (x->am_bytes > x->am_expected)
		xfer_fail(x, PDX_EINVAL, true, "received %llu bytes, sender sent %llu",
			  (unsigned long long)x->am_bytes,
			  (unsigned long long)x->am_expected);
}

static void am_recv_done(void *arg, pdx_status_t status)
{
	struct xfer *x = arg;

	xfer_unhold(x);
	if (status)
		xfer_fail(x, status, true, "receiving from %s: %s", x->peer_addr,
			  pdx_status_str(status));
	recv_try_complete(x);
	xfer_maybe_release(x);
}

/* Where a message's payload goes, computed from our own layout; NULL if
 * it does not fall exactly on blocks this transfer awaits. */
static uint8_t *am_target(struct xfer *x, uint32_t layer, uint32_t t,
			  uint32_t index, size_t len)
{
	const struct registration *g = &x->agent->reg;
	uint64_t bb = pdx_kv_layout_block_bytes(&g->layout);
	uint64_t n = len / bb;

	if (layer >= g->layout.layers || t >= g->layout.tensors || len == 0 ||
	    len % bb || index < x->skip || index >= x->n_blocks ||
	    n > x->n_blocks - index)
		return NULL;
	if (n > 1 && g->layout.layer[layer].block_stride != bb)
		return NULL;
	for (uint64_t k = 1; k < n; k++)
		if (x->blocks[index + k] != x->blocks[index] + k)
			return NULL;
	return block_addr(g, layer, t, x->blocks[index]);
}

void push_am_handler(void *arg, const void *hdr, size_t hdr_len, void *data,
		     size_t len, bool rndv)
{
	struct agent *a = arg;
	struct pdx_xfer_id id;
	uint16_t layer;
	uint32_t index;
	struct xfer *x;
	uint8_t *dst = NULL;

	if (hdr_len == STAGED_HDR_BYTES || hdr_len == STAGED_READY_BYTES ||
	    hdr_len == STAGED_FREE_BYTES) {
		staged_on_message(a, hdr, hdr_len, data, len, rndv);
		return;
	}
	if (hdr_len == AM_HDR_BYTES) {
		const uint8_t *h = hdr;

		memcpy(id.b, h, 16);
		memcpy(&layer, h + 16, 2);
		memcpy(&index, h + 20, 4);
		x = xfer_find(a, &id);
		if (x && x->role == XFER_RECV && x->announced && !x->finished &&
		    a->reg.ok)
			dst = am_target(x, layer, h[18], index, len);
	}
	if (!dst) {
		log_warn("data message (%zu bytes, header %zu) for no awaited blocks: dropped",
			 len, hdr_len);
		if (rndv)
			pdx_ucx_am_drop(a->ucx, data);
		return;
	}
	x->am_bytes += len;
	if (!rndv) {
		memcpy(dst, data, len);
		recv_try_complete(x);
		return;
	}
	xfer_hold(x);
	if (pdx_ucx_am_recv(a->ucx, data, dst, len, am_recv_done, x)) {
		xfer_unhold(x);
		xfer_fail(x, PDX_EIO, true, "cannot receive data from %s",
			  x->peer_addr);
	}
}
