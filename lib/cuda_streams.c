/* The events libpdx makes for a GPU engine (cuda.c), tied to the link:
 * pdx_engine_register_cuda_streams() registers with them, and
 * pdx_engine_layer_done_stream() records one on the engine's stream and
 * says layer_done naming its slot (announce.c), so the agent reads the
 * layer once the GPU has computed it, without the engine waiting for it.
 */
#include "lib/client.h"

static pdx_status_t register_streams(struct pdx_engine *e,
				     const struct pdx_kv_layout *layout,
				     const struct pdx_engine_region *regions,
				     size_t n_regions, uint32_t slots,
				     char *peer_addr, size_t peer_addr_len)
{
	struct pdx_engine_cuda_events evs;
	struct pdx__cuda *c;
	pdx_status_t st;
	int dev = -1;

	if (!layout || !layout->layers || layout->layers > PDX_MAX_LAYERS ||
	    !regions)
		return pdx__fail(e, PDX_EINVAL,
				 "register_cuda_streams: needs a layout of 1 "
				 "to %d layers, and regions",
				 PDX_MAX_LAYERS);
	if (slots == 0 || slots > 64)
		return pdx__fail(e, PDX_EINVAL,
				 "register_cuda_streams: %u event slots, want "
				 "1 to 64",
				 slots);
	for (size_t i = 0; i < n_regions && dev < 0; i++)
		if (regions[i].type == PDX_MEM_CUDA)
			dev = regions[i].cuda_device;
	if (dev < 0)
		return pdx__fail(e, PDX_EINVAL,
				 "register_cuda_streams: no PDX_MEM_CUDA region "
				 "(the events live on the KV's device)");
	st = pdx__cuda_events_new(e, dev, slots, layout->layers, &c);
	if (st != PDX_OK)
		return st;
	pdx__cuda_events_of(c, &evs);
	st = pdx__register(e, layout, regions, n_regions, &evs, peer_addr,
			   peer_addr_len);
	if (st != PDX_OK) {
		pdx__cuda_free(c); /* the agent keeps what it had */
		return st;
	}
	pdx__cuda_free(e->cuda);
	e->cuda = c;
	return pdx__peer_out(e, peer_addr, peer_addr_len);
}

pdx_status_t pdx_engine_register_cuda_streams(
    struct pdx_engine *e, const struct pdx_kv_layout *layout,
    const struct pdx_engine_region *regions, size_t n_regions, uint32_t slots,
    char *peer_addr, size_t peer_addr_len)
{
	pdx_status_t st = pdx__enter(e, "register_cuda_streams");

	if (st == PDX_OK)
		st = pdx__leave(e, register_streams(e, layout, regions,
						    n_regions, slots,
						    peer_addr, peer_addr_len));
	return st;
}

static pdx_status_t layer_done_stream(struct pdx_engine *e, uint32_t layer,
				      void *stream,
				      const struct pdx_xfer_id *xfers,
				      size_t n)
{
	pdx_status_t st;
	uint32_t slot;

	if (!e->cuda)
		return pdx__fail(e, PDX_EINVAL,
				 "layer_done_stream: not registered with "
				 "pdx_engine_register_cuda_streams");
	if (!xfers || n == 0)
		return pdx__fail(e, PDX_EINVAL, "layer_done_stream: no transfers");
	st = pdx__cuda_record(e, layer, stream, &slot);
	if (st != PDX_OK)
		return st;
	return pdx__layer_done(e, layer, slot, xfers, n);
}

pdx_status_t pdx_engine_layer_done_stream(struct pdx_engine *e, uint32_t layer,
					  void *stream,
					  const struct pdx_xfer_id *xfers,
					  size_t n)
{
	pdx_status_t st = pdx__enter(e, "layer_done_stream");

	if (st == PDX_OK)
		st = pdx__leave(e, layer_done_stream(e, layer, stream, xfers,
						     n));
	return st;
}
