/* Registering the engine's KV memory and layout with its agent: the
 * register checked, packed and sent, and its answer awaited (events that
 * come meanwhile are queued). The register accepted is kept, for the
 * agent that restarts and has forgotten it (liveness.c sends it again).
 */
#define PDX_LOG_TOPIC "engine"

#include "lib/client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/kv_dtype.h"
#include "common/layout_mp.h"
#include "common/log.h"

#define SHM_NAME_MAX 255 /* NAME_MAX for shm_open() */

pdx_status_t pdx_engine_set_tp(struct pdx_engine *e, uint32_t rank,
			       uint32_t size)
{
	pdx_status_t st = pdx__enter(e, "set_tp");

	if (st != PDX_OK)
		return st;
	if (!size || (size & (size - 1)) || rank >= size)
		return pdx__leave(e, pdx__fail(e, PDX_EINVAL, "set_tp: rank "
					       "%u of size %u (a power of two "
					       "above the rank)", rank, size));
	e->tp_rank = rank;
	e->tp_size = size;
	return pdx__leave(e, PDX_OK);
}

pdx_status_t pdx_engine_set_kv_dtype(struct pdx_engine *e, const char *name)
{
	pdx_status_t st = pdx__enter(e, "set_kv_dtype");

	if (st != PDX_OK)
		return st;
	if (name && name[0] && !pdx_kv_dtype_name_ok(name))
		return pdx__leave(e, pdx__fail(e, PDX_EINVAL, "set_kv_dtype: "
					       "want a name of at most %d "
					       "letters, digits, '_', '.' or "
					       "'-'",
					       PDX_KV_DTYPE_MAX - 1));
	snprintf(e->kv_dtype, sizeof(e->kv_dtype), "%s", name ? name : "");
	return pdx__leave(e, PDX_OK);
}

static pdx_status_t check_regions(struct pdx_engine *e,
				  const struct pdx_engine_region *regions,
				  size_t n_regions, uint64_t *sizes)
{
	for (size_t i = 0; i < n_regions; i++) {
		const struct pdx_engine_region *r = &regions[i];

		if (r->size == 0)
			return pdx__fail(e, PDX_EINVAL,
					 "region %zu: needs a size", i);
		if (r->type == PDX_MEM_CUDA) {
			if (r->cuda_device < 0)
				return pdx__fail(e, PDX_EINVAL,
						 "region %zu: cuda device %d",
						 i, r->cuda_device);
		} else if (r->type != PDX_MEM_SHM || !r->shm_name ||
			   !r->shm_name[0] ||
			   strnlen(r->shm_name, SHM_NAME_MAX + 1) >
			       SHM_NAME_MAX) {
			return pdx__fail(e, PDX_EINVAL,
					 "region %zu: needs type shm or cuda, "
					 "and an shm name",
					 i);
		}
		sizes[i] = r->size;
	}
	return PDX_OK;
}

static void pack_region(msgpack_packer *pk, const struct pdx_engine_region *r)
{
	if (r->type == PDX_MEM_CUDA) {
		msgpack_pack_map(pk, 4);
		pdx_mp_kv_str(pk, "type", "cuda");
		pdx_mp_kv_u64(pk, "size", r->size);
		pdx_mp_kv_u64(pk, "device", (uint64_t)r->cuda_device);
		pdx_mp_str(pk, "ipc");
		pdx_mp_bin(pk, r->cuda_ipc, PDX_CUDA_IPC_BYTES);
		return;
	}
	msgpack_pack_map(pk, 3);
	pdx_mp_kv_str(pk, "type", "shm");
	pdx_mp_kv_str(pk, "name", r->shm_name);
	pdx_mp_kv_u64(pk, "size", r->size);
}

/* Sends a packed register and waits for its answer (the peer address
 * in e->peer); events that come meanwhile are queued. */
static pdx_status_t register_exchange(struct pdx_engine *e, const void *buf,
				      size_t len)
{
	uint64_t deadline = pdx_now_ns() + (uint64_t)e->timeout_ms * 1000000ULL;
	struct pdx__lane_offer offer = {0};
	pdx_status_t st;

	st = pdx__drain(e);
	if (st == PDX_OK)
		st = pdx__link_send(e, buf, len, true);
	if (st != PDX_OK)
		return st; /* they said why */
	for (;;) {
		struct pdx_engine_event ev;
		msgpack_unpacked up;
		struct pdx__frame f;
		char op[32];
		int rc, left;

		rc = pdx__link_recv(e, &f);
		if (rc < 0)
			return PDX_EIO;
		if (rc == 0) {
			if (pdx__freed(e))
				return pdx__freed_fail(e, "register");
			left = pdx__ms_left(deadline);
			if (left == 0) {
				return pdx__fail_log(e, PDX_LOG_WARN,
						     PDX_ETIMEDOUT,
						     "register: no answer from "
						     "the agent in %d ms",
						     e->timeout_ms);
			}
			if (pdx__link_wait(e, left, false) < 0 &&
			    errno != EINTR)
				return pdx__fail(e, PDX_EIO,
						 "poll agent socket: %s",
						 zmq_strerror(errno));
			continue;
		}
		rc = 0;
		switch (pdx__classify(&f, &up, op, sizeof(op), &ev)) {
		case PDX__MSG_SKIP:
			break;
		case PDX__MSG_EVENT:
			pdx__event_keep(e, &up.data, &ev);
			break;
		case PDX__MSG_OTHER:
			rc = pdx__register_answer(&up.data, op, e->peer,
						  sizeof(e->peer), &st, e->why,
						  sizeof(e->why));
			if (rc && st == PDX_OK) {
				pdx__lane_offer_read(&up.data, &offer);
				pdx__kv_dtype_heard(&up.data, e->kv_dtype);
			}
			if (!rc && pdx__on_other(e, &up.data, op, &ev) &&
			    pdx__queue_push(e, &ev))
				log_error(
				    "event queue full: an event was lost");
			break;
		}
		msgpack_unpacked_destroy(&up);
		pdx__frame_close(&f);
		if (!rc)
			continue;
		/* the handshake of the connection the register went out on was
		 * reported long before its answer came: it carries our register
		 * (a refused one leaves the agent's as it was) */
		pdx__link_watch(e);
		if (st == PDX_OK) {
			e->registered = e->up;
			e->displaced = false;
			pdx__link_lane_open(e, &offer);
		}
		return st;
	}
}

/* A register accepted: the agent's peer address to the caller's buffer
 * (NULL: not wanted). Only after the engine's state took the register,
 * which the agent holds whether or not its answer fits here. */
pdx_status_t pdx__peer_out(struct pdx_engine *e, char *peer_addr,
			   size_t peer_addr_len)
{
	size_t n = strlen(e->peer);

	if (!peer_addr)
		return PDX_OK;
	if (n >= peer_addr_len)
		return pdx__fail(e, PDX_ETOOBIG,
				 "register: the agent's peer address is over "
				 "%zu bytes (%zu; registered all the same: "
				 "pdx_engine_peer_addr() gives it)",
				 peer_addr_len - 1, n);
	memcpy(peer_addr, e->peer, n + 1);
	return PDX_OK;
}

/* Registers with the engine's own events, or none: those of
 * register_cuda_streams are then no longer the agent's, and
 * layer_done_stream must not name them. */
static pdx_status_t register_own(struct pdx_engine *e,
				 const struct pdx_kv_layout *layout,
				 const struct pdx_engine_region *regions,
				 size_t n_regions,
				 const struct pdx_engine_cuda_events *ev,
				 char *peer_addr, size_t peer_addr_len)
{
	pdx_status_t st;

	st = pdx__register(e, layout, regions, n_regions, ev, peer_addr,
			   peer_addr_len);
	if (st != PDX_OK)
		return st;
	pdx__cuda_free(e->cuda);
	e->cuda = NULL;
	return pdx__peer_out(e, peer_addr, peer_addr_len);
}

pdx_status_t pdx_engine_register(struct pdx_engine *e,
				 const struct pdx_kv_layout *layout,
				 const struct pdx_engine_region *regions,
				 size_t n_regions, char *peer_addr,
				 size_t peer_addr_len)
{
	pdx_status_t st = pdx__enter(e, "register");

	if (st == PDX_OK)
		st = pdx__leave(e, register_own(e, layout, regions, n_regions,
						NULL, peer_addr,
						peer_addr_len));
	return st;
}

pdx_status_t pdx_engine_register_cuda(struct pdx_engine *e,
				      const struct pdx_kv_layout *layout,
				      const struct pdx_engine_region *regions,
				      size_t n_regions,
				      const struct pdx_engine_cuda_events *ev,
				      char *peer_addr, size_t peer_addr_len)
{
	pdx_status_t st = pdx__enter(e, "register_cuda");

	if (st == PDX_OK)
		st = pdx__leave(e, register_own(e, layout, regions, n_regions,
						ev, peer_addr, peer_addr_len));
	return st;
}

/* Registers with the events given (NULL: none); the engine's own events
 * (e->cuda) and the peer address (pdx__peer_out) are the callers'. */
pdx_status_t pdx__register(struct pdx_engine *e,
			   const struct pdx_kv_layout *layout,
			   const struct pdx_engine_region *regions,
			   size_t n_regions,
			   const struct pdx_engine_cuda_events *ev,
			   const char *peer_addr, size_t peer_addr_len)
{
	struct pdx_mp_out o;
	uint64_t *sizes, n_ev = 0;
	char err[256];
	pdx_status_t st;

	if (!layout || !layout->layer || !regions || n_regions == 0 ||
	    n_regions > PDX_MAX_REGIONS || (peer_addr && peer_addr_len == 0))
		return pdx__fail(e, PDX_EINVAL,
				 "register: needs a layout with its layers, 1 "
				 "to %d regions, and room for the peer address",
				 PDX_MAX_REGIONS);
	if (ev) {
		n_ev = (uint64_t)ev->slots * layout->layers;
		if (!ev->handles || ev->slots == 0 || ev->slots > 64)
			return pdx__fail(e, PDX_EINVAL,
					 "register: cuda events need handles "
					 "and 1 to 64 slots (%u)",
					 ev->slots);
	}
	sizes = calloc(n_regions, sizeof(*sizes));
	if (!sizes)
		return pdx__fail(e, PDX_ENOMEM, "register: no memory");
	st = check_regions(e, regions, n_regions, sizes);
	if (st == PDX_OK) {
		st = pdx_kv_layout_check(layout, sizes, n_regions, err,
					 sizeof(err));
		if (st != PDX_OK) {
			pdx__fail_log(e, PDX_LOG_ERROR, st,
				      "register: layout refused: %s", err);
		}
	}
	free(sizes);
	if (st != PDX_OK)
		return st;

	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, (ev ? 6 : 4) + (e->tp_size ? 1 : 0) +
				    (e->kv_dtype[0] ? 1 : 0));
	pdx_mp_kv_str(&o.pk, "op", "register");
	if (e->kv_dtype[0])
		pdx_mp_kv_str(&o.pk, "kv_dtype", e->kv_dtype);
	if (e->tp_size) {
		pdx_mp_str(&o.pk, "tp");
		msgpack_pack_map(&o.pk, 2);
		pdx_mp_kv_u64(&o.pk, "rank", e->tp_rank);
		pdx_mp_kv_u64(&o.pk, "size", e->tp_size);
	}
	pdx_mp_kv_u64(&o.pk, "v", PDX__PROTOCOL_VERSION);
	pdx_mp_str(&o.pk, "layout");
	pdx_layout_pack(&o.pk, layout);
	pdx_mp_str(&o.pk, "regions");
	msgpack_pack_array(&o.pk, n_regions);
	for (size_t i = 0; i < n_regions; i++)
		pack_region(&o.pk, &regions[i]);
	if (ev) {
		pdx_mp_kv_u64(&o.pk, "cuda_event_slots", ev->slots);
		pdx_mp_str(&o.pk, "cuda_events");
		msgpack_pack_array(&o.pk, n_ev);
		for (uint64_t i = 0; i < n_ev; i++)
			pdx_mp_bin(&o.pk, ev->handles[i], PDX_CUDA_IPC_BYTES);
	}
	st = register_exchange(e, o.buf.data, o.buf.size);
	if (st == PDX_OK) { /* kept to register again: the message itself
			     * (a copy that failed left the engine taken
			     * for one that never registered) */
		free(e->reg);
		e->reg_len = o.buf.size;
		e->reg = msgpack_sbuffer_release(&o.buf);
	}
	pdx_mp_out_free(&o);
	return st;
}
