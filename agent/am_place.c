/* Where the am lane's data messages land (path_am.c's runs, am_slice.c's
 * TP slices): both headers name the transfer, layer, tensor and first
 * block (agent/am.h); the receiver checks them against what it awaits
 * and places the bytes where its own layout says. */
#define PDX_LOG_TOPIC "push"
#include <string.h>

#include "agent/agent.h"
#include "common/log.h"

void am_place_header(uint8_t hdr[AM_RUN_BYTES], const struct xfer *x,
		     uint32_t layer, uint32_t t, uint32_t index)
{
	uint16_t l16 = (uint16_t)layer;

	memset(hdr, 0, AM_RUN_BYTES);
	memcpy(hdr, x->id.b, 16);
	memcpy(hdr + 16, &l16, 2);
	hdr[18] = (uint8_t)t;
	memcpy(hdr + 20, &index, 4);
}

struct xfer *am_place_xfer(struct agent *a, const void *hdr, size_t hdr_len,
			   struct am_place *at)
{
	const uint8_t *h = hdr;
	struct pdx_xfer_id id;
	uint16_t l16;
	struct xfer *x;

	if (hdr_len != AM_RUN_BYTES || !a->reg.ok)
		return NULL;
	memcpy(id.b, h, 16);
	memcpy(&l16, h + 16, 2);
	memcpy(&at->index, h + 20, 4);
	at->layer = l16;
	at->tensor = h[18];
	x = xfer_find(a, &id);
	return x && x->role == XFER_RECV && x->announced && !x->finished ? x
									 : NULL;
}

bool am_place_awaited(const struct xfer *x, const struct am_place *at,
		      uint64_t n)
{
	const struct pdx_kv_layout *l = &x->agent->reg.layout;

	return at->layer < l->layers && at->tensor < l->tensors && n &&
	       at->index >= x->skip && at->index < x->n_blocks &&
	       n <= x->n_blocks - at->index;
}

uint8_t *am_place_blocks(struct xfer *x, const struct am_place *at, uint64_t n)
{
	const struct registration *g = &x->agent->reg;
	uint64_t bb = pdx_kv_layout_block_bytes(&g->layout);

	if (!am_place_awaited(x, at, n))
		return NULL;
	if (n > 1 && g->layout.layer[at->layer].block_stride != bb)
		return NULL;
	for (uint64_t k = 1; k < n; k++)
		if (x->blocks[at->index + k] != x->blocks[at->index] + k)
			return NULL;
	return host_block_addr(g, at->layer, at->tensor, x->blocks[at->index]);
}

void am_place_drop(struct agent *a, const void *hdr, size_t hdr_len,
		   void *data, size_t len, bool rndv)
{
	/* the transfer whose messages were dropped last: one warning for
	 * its first, the rest at debug (a sender's queue of a transfer that
	 * ended here, once a firewall opened, was 64 lines of warning that
	 * named neither the transfer nor the peer) */
	static uint8_t last[16];
	char hex[33] = "(unreadable header)";
	struct pdx_xfer_id id;
	bool again = false;

	if (hdr_len == AM_RUN_BYTES) {
		memcpy(id.b, hdr, sizeof(id.b));
		pdx_xfer_id_hex(&id, hex);
		again = memcmp(last, id.b, sizeof(last)) == 0;
		memcpy(last, id.b, sizeof(last));
	}
	if (again)
		log_debug("data message (%zu bytes) of xfer %s for no awaited "
			  "blocks: dropped", len, hex);
	else
		log_warn("data message (%zu bytes, header %zu) of xfer %s for "
			 "no awaited blocks (it ended here, or is not ours): "
			 "dropped, and the rest of it too", len, hdr_len, hex);
	if (rndv)
		pdx_ucx_am_drop(a->ucx, data);
}

void am_place_received(void *arg, pdx_status_t status)
{
	struct xfer *x = arg;

	xfer_unhold(x);
	if (status)
		xfer_fail(x, status, true, "receiving from %s: %s", x->peer_addr,
			  pdx_status_str(status));
	complete_try_received(x);
	xfer_maybe_release(x);
}
