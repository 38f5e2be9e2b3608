/* The staged path for GPU memory (docs/gpu.md): the sender gathers a
 * chunk of computed layers' blocks into device staging, copies it to a
 * pinned host buffer and sends it as one UCX active message by rendezvous;
 * the receiver fetches it into a pinned host buffer of its own, copies it
 * to the device and scatters it into its blocks. Each step is queued on the
 * agent's stream (gpu.h) and handed back to the loop when done.
 *
 * Memory is bounded: --staging-mb of slots, each a pinned host buffer and
 * a device buffer of --staging-chunk-mb, half of them for sending and half
 * for receiving (an agent both sending and receiving cannot starve one
 * direction with the other). A chunk waits for a free slot; a receiver with
 * none leaves the payload at the sender (rendezvous) until one frees, so
 * the sender is held back rather than copies piling up. With two or more
 * slots a side, one chunk's UCX send overlaps the next chunk's gather.
 *
 * Message header (STAGED_HDR_BYTES, little-endian): xfer id (16 bytes),
 * first segment u64, segment count u32, magic "PDXS". A segment is one
 * block of one tensor of one layer, in the staging order of
 * kernels/kv_kernels.h over the transfer's blocks [skip, n), so sender and
 * receiver agree on it whatever their block ids. */
#define PDX_LOG_TOPIC "staged"
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "common/log.h"

#define AM_ID 1
#define MAGIC 0x53584450u /* "PDXS" */

struct slot {
	struct slot *next;
	void *dev, *host;
	struct pdx_ucx_mem *mem; /* host, registered with UCX */
};

/* A chunk on its way: queued, staged, then sent or placed. */
struct chunk {
	struct chunk *next;
	struct agent *agent;
	struct xfer *x;
	struct slot *slot;
	uint64_t first, count, len;
	bool send;	 /* sender; else receiver */
	void *desc;	 /* receiver, rendezvous: UCX's payload descriptor */
};

struct side {
	struct slot *free;
	struct chunk *head, *tail; /* waiting for a slot */
};

struct staging {
	size_t slot_bytes;
	struct side side[2]; /* [1] sending, [0] receiving */
	struct slot *all;
	uint32_t n_slots;
};

static void slots_free(struct agent *a, struct staging *s)
{
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct slot *sl = &s->all[i];

		pdx_ucx_mem_free(a->ucx, sl->mem);
		gpu_host_free(a->gpu, sl->host);
		gpu_dev_free(a->gpu, sl->dev);
	}
	free(s->all);
}

/* At stop, after the transfers were freed: chunks still waiting for a
 * slot only hold memory (and, received, a UCX descriptor). */
void staged_free(struct agent *a)
{
	if (!a->staging)
		return;
	for (int i = 0; i < 2; i++)
		while (a->staging->side[i].head) {
			struct chunk *c = a->staging->side[i].head;

			a->staging->side[i].head = c->next;
			if (c->desc)
				pdx_ucx_am_drop(a->ucx, c->desc);
			free(c);
		}
	slots_free(a, a->staging);
	free(a->staging);
	a->staging = NULL;
}

/* The slots, made at first use: n_slots of slot_bytes (at least one block
 * and two a side). */
static struct staging *staging_get(struct agent *a)
{
	uint64_t bb = pdx_kv_layout_block_bytes(&a->reg.layout);
	uint64_t chunk = (uint64_t)a->cfg.staging_chunk_mb << 20;
	struct staging *s;

	if (a->staging)
		return a->staging;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->slot_bytes = chunk > bb ? chunk - chunk % bb : bb;
	s->n_slots = (uint32_t)(((uint64_t)a->cfg.staging_mb << 20) /
				s->slot_bytes);
	if (s->n_slots < 4)
		s->n_slots = 4;
	s->all = calloc(s->n_slots, sizeof(*s->all));
	if (!s->all) {
		free(s);
		return NULL;
	}
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct slot *sl = &s->all[i];

		sl->dev = gpu_dev_alloc(a->gpu, s->slot_bytes);
		sl->host = gpu_host_alloc(a->gpu, s->slot_bytes);
		if (!sl->dev || !sl->host ||
		    pdx_ucx_mem_register(a->ucx, sl->host, s->slot_bytes,
					 &sl->mem)) {
			log_error("cannot allocate staging slot %u of %zu bytes",
				  i, s->slot_bytes);
			slots_free(a, s);
			free(s);
			return NULL;
		}
		sl->next = s->side[i % 2].free;
		s->side[i % 2].free = sl;
	}
	log_info("staging: %u slots of %zu bytes (pinned host + device)",
		 s->n_slots, s->slot_bytes);
	a->staging = s;
	return s;
}

static void pump(struct agent *a, struct side *sd);

static void slot_put(struct agent *a, bool send, struct slot *sl)
{
	struct side *sd = &a->staging->side[send];

	sl->next = sd->free;
	sd->free = sl;
	pump(a, sd);
}

/* The chunk's end: its slot back, its transfer told. */
static void chunk_end(struct chunk *c, pdx_status_t st)
{
	struct agent *a = c->agent;
	struct xfer *x = c->x;
	bool send = c->send;
	struct slot *sl = c->slot;

	if (c->desc)
		pdx_ucx_am_drop(a->ucx, c->desc);
	free(c);
	if (send) {
		push_op_done(x, st);
	} else {
		xfer_unhold(x);
		if (st && !x->finished)
			xfer_fail(x, st, true, "staged data from %s: %s",
				  x->peer_addr, pdx_status_str(st));
		recv_try_complete(x);
		xfer_maybe_release(x);
	}
	if (sl)
		slot_put(a, send, sl);
}

static void chunk_done(void *arg, pdx_status_t st)
{
	chunk_end(arg, st);
}

/* Sender: the chunk is in pinned host memory. */
static void staged(void *arg, pdx_status_t st)
{
	struct chunk *c = arg;
	struct xfer *x = c->x;
	uint8_t hdr[STAGED_HDR_BYTES];
	uint32_t count = (uint32_t)c->count, magic = MAGIC;

	if (st || x->finished) {
		chunk_end(c, st);
		return;
	}
	memcpy(hdr, x->id.b, 16);
	memcpy(hdr + 16, &c->first, 8);
	memcpy(hdr + 24, &count, 4);
	memcpy(hdr + 28, &magic, 4);
	st = pdx_ucx_am_send_rndv(x->peer->ep, AM_ID, hdr, sizeof(hdr),
				  c->slot->host, c->len, c->slot->mem, chunk_done,
				  c);
	if (st)
		chunk_end(c, st);
}

/* Receiver: the chunk is in our pinned host buffer. */
static void arrived(void *arg, pdx_status_t st)
{
	struct chunk *c = arg;
	struct gpu *g = c->agent->gpu;

	if (st || c->x->finished) {
		chunk_end(c, st);
		return;
	}
	st = gpu_copy(g, c->slot->dev, c->slot->host, c->len);
	if (!st)
		st = gpu_scatter(g, c->x->plan, c->first, c->count,
				 c->slot->dev);
	if (!st)
		st = gpu_then(g, chunk_done, c); /* placed */
	if (st)
		chunk_end(c, st);
}

/* The chunk has a slot: start its first step. */
static void start(struct chunk *c)
{
	struct agent *a = c->agent;
	pdx_status_t st;

	if (c->x->finished) {
		chunk_end(c, PDX_OK);
		return;
	}
	if (c->send) {
		st = gpu_gather(a->gpu, c->x->plan, c->first, c->count,
				c->slot->dev);
		if (!st)
			st = gpu_copy(a->gpu, c->slot->host, c->slot->dev,
				      c->len);
		if (!st)
			st = gpu_then(a->gpu, staged, c);
	} else {
		void *desc = c->desc;

		c->desc = NULL;
		st = pdx_ucx_am_recv(a->ucx, desc, c->slot->host, c->len,
				     arrived, c);
	}
	if (st)
		chunk_end(c, st);
}

static void pump(struct agent *a, struct side *sd)
{
	while (sd->free && sd->head) {
		struct chunk *c = sd->head;

		sd->head = c->next;
		if (!sd->head)
			sd->tail = NULL;
		c->slot = sd->free;
		sd->free = c->slot->next;
		start(c);
	}
}

static void enqueue(struct agent *a, struct chunk *c)
{
	struct side *sd = &a->staging->side[c->send];

	c->next = NULL;
	if (sd->tail)
		sd->tail->next = c;
	else
		sd->head = c;
	sd->tail = c;
	pump(a, sd);
}

pdx_status_t staged_send(struct xfer *x, uint64_t first, uint64_t count)
{
	struct agent *a = x->agent;
	struct staging *s = staging_get(a);
	uint64_t bb = pdx_kv_layout_block_bytes(&a->reg.layout), per;

	if (!s)
		return PDX_ENOMEM;
	per = s->slot_bytes / bb;
	while (count) {
		struct chunk *c = calloc(1, sizeof(*c));
		uint64_t n = count < per ? count : per;

		if (!c)
			return PDX_ENOMEM;
		*c = (struct chunk){ .agent = a, .x = x, .first = first,
				     .count = n, .len = n * bb, .send = true };
		xfer_hold(x);
		pdx_xfer_sm_op_started(&x->sm);
		x->bytes += c->len;
		x->am_bytes += c->len;
		enqueue(a, c);
		first += n;
		count -= n;
	}
	return PDX_OK;
}

/* Receiver: a chunk for x, checked against what x awaits. */
static struct xfer *chunk_target(struct agent *a, const uint8_t *hdr,
				 size_t len, uint64_t *first,
				 uint64_t *count)
{
	struct pdx_xfer_id id;
	uint32_t n, magic;
	struct xfer *x;

	memcpy(id.b, hdr, 16);
	memcpy(first, hdr + 16, 8);
	memcpy(&n, hdr + 24, 4);
	memcpy(&magic, hdr + 28, 4);
	*count = n;
	x = xfer_find(a, &id);
	if (magic != MAGIC || !x || x->role != XFER_RECV || !x->announced ||
	    x->finished || !a->reg.ok || !a->reg.cuda || n == 0 ||
	    *first > gpu_layer_segments(x) * a->reg.layout.layers ||
	    n > gpu_layer_segments(x) * a->reg.layout.layers - *first ||
	    len != n * pdx_kv_layout_block_bytes(&a->reg.layout))
		return NULL;
	if (!a->staging || len > a->staging->slot_bytes) {
		xfer_fail(x, PDX_ENOMEM, true,
			  "a staged chunk of %zu bytes does not fit our staging slots "
			  "(--staging-chunk-mb; both sides should agree)", len);
		return NULL;
	}
	if (!x->plan && gpu_plan_xfer(x)) {
		xfer_fail(x, PDX_EIO, true, "cannot plan the staged receive");
		return NULL;
	}
	return x;
}

void staged_on_message(struct agent *a, const uint8_t *hdr, void *data,
		       size_t len, bool rndv)
{
	struct chunk *c;
	uint64_t first, count;
	struct xfer *x;

	if (a->reg.ok && a->reg.cuda)
		staging_get(a);
	x = chunk_target(a, hdr, len, &first, &count);
	c = x && rndv ? calloc(1, sizeof(*c)) : NULL;
	if (!c) {
		/* the sender always sends by rendezvous */
		log_warn("staged chunk (%zu bytes%s) for no awaited blocks: dropped",
			 len, rndv ? "" : ", not rendezvous");
		if (x && !rndv)
			xfer_fail(x, PDX_EINVAL, true,
				  "staged chunk not sent by rendezvous");
		if (rndv)
			pdx_ucx_am_drop(a->ucx, data);
		return;
	}
	*c = (struct chunk){ .agent = a, .x = x, .first = first,
			     .count = count, .len = len, .desc = data };
	x->am_bytes += len;
	xfer_hold(x);
	enqueue(a, c);
}
