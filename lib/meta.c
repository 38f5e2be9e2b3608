/* Bytes beside the KV (pdx_engine_meta() on the sending side): a
 * "received" event may carry them as "meta". They are shelved by transfer
 * when the event is read off the link, which may be long before the
 * engine takes it (register queues events), and handed out with it:
 * pdx_engine_event_meta() then gives the last event's until the next.
 */
#define PDX_LOG_TOPIC "engine"

#include "lib/client.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"

struct pdx__meta {
	struct pdx_xfer_id id;
	size_t len;
	UT_hash_handle hh;
	unsigned char data[];
};

void pdx__meta_shelve(struct pdx_engine *e, const msgpack_object *event,
		      const struct pdx_engine_event *ev)
{
	const msgpack_object *o = pdx_mp_get(event, "meta");
	struct pdx__meta *m, *old;
	size_t n;

	if (!o || ev->kind != PDX_EVENT_RECEIVED ||
	    !pdx__inflight_has(e, &ev->xfer))
		return;
	if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size > PDX_META_MAX) {
		log_warn("an event's meta is not a bin of at most %d bytes: "
			 "dropped", PDX_META_MAX);
		return;
	}
	n = o->via.bin.size;
	m = malloc(sizeof(*m) + n);
	if (!m) {
		log_error("out of memory: an event's %zu bytes of meta lost", n);
		return;
	}
	m->id = ev->xfer;
	m->len = n;
	memcpy(m->data, o->via.bin.ptr, n);
	HASH_REPLACE(hh, e->metas, id.b, sizeof(m->id.b), m, old);
	free(old);
}

void pdx__meta_hand_out(struct pdx_engine *e, const struct pdx_xfer_id *x)
{
	struct pdx__meta *m;

	free(e->meta_out);
	e->meta_out = NULL;
	if (!x)
		return;
	HASH_FIND(hh, e->metas, x->b, sizeof(x->b), m);
	if (m) {
		HASH_DEL(e->metas, m);
		e->meta_out = m;
	}
}

static void meta_drop(struct pdx_engine *e, const struct pdx_xfer_id *x)
{
	struct pdx__meta *m;

	HASH_FIND(hh, e->metas, x->b, sizeof(x->b), m);
	if (m) {
		HASH_DEL(e->metas, m);
		free(m);
	}
}

void pdx__event_keep(struct pdx_engine *e, const msgpack_object *event,
		     const struct pdx_engine_event *ev)
{
	pdx__meta_shelve(e, event, ev);
	if (!pdx__queue_keep(e, ev))
		meta_drop(e, &ev->xfer);
}

void pdx__meta_free(struct pdx_engine *e)
{
	struct pdx__meta *m, *tmp;

	HASH_ITER(hh, e->metas, m, tmp)
	{
		HASH_DEL(e->metas, m);
		free(m);
	}
	pdx__meta_hand_out(e, NULL);
}

pdx_status_t pdx_engine_event_meta(struct pdx_engine *e, const void **data,
				   size_t *len)
{
	pdx_status_t st = pdx__enter(e, "event_meta");

	if (st != PDX_OK)
		return st;
	if (!data || !len)
		return pdx__leave(e, pdx__fail(e, PDX_EINVAL, "event_meta: "
					       "needs where to put data and "
					       "len"));
	*data = e->meta_out ? e->meta_out->data : NULL;
	*len = e->meta_out ? e->meta_out->len : 0;
	return pdx__leave(e, PDX_OK);
}
