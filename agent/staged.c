/* The staged path for GPU memory (docs/gpu.md): the sender gathers a
 * chunk of computed layers' blocks into device staging and copies it to a
 * pinned host buffer; the receiver copies it to its device and scatters it
 * into its blocks. Each step is queued on the agent's stream (gpu.h) and
 * handed back to the loop when done. Between the two host buffers:
 *
 *   - another host: the chunk is one UCX active message sent by
 *     rendezvous, fetched by the receiver into a pinned buffer of its own;
 *   - the same host, where the receiver maps the sender's staging (POSIX
 *     shared memory, named in the hello): no copy at all. The sender says
 *     "ready" (which slot), the receiver copies from that slot to its GPU
 *     and answers "free", and the slot is the sender's again.
 *
 * Memory is bounded: --staging-mb of slots, each a pinned host buffer (one
 * shared memory object holds them all) and a device buffer of
 * --staging-chunk-mb, half of them for sending and half for receiving (an
 * agent both sending and receiving cannot starve one direction with the
 * other). A chunk waits for a free slot; a receiver with none leaves the
 * payload at the sender (rendezvous) or its "ready" queued, so the sender
 * is held back rather than copies piling up. With two or more slots a
 * side, one chunk's transport overlaps the next chunk's gather.
 *
 * Each message has its own active-message id (agent/am.h); a segment is
 * one block of one tensor of one layer, in the staging order of
 * kernels/kv_kernels.h over the transfer's blocks [skip, n), so sender and
 * receiver agree on it whatever their block ids:
 *   chunk (32 bytes): xfer id (16), first segment u64, count u32, "PDXS"
 *   ready (48 bytes): the same with "PDXR", then slot u32, lend u32 (a
 *                     number the sender gives each lending of a slot) and
 *                     the sender's instance u64 (whom to free it to, also
 *                     when the transfer is gone here)
 *   free  (20 bytes): slot u32, "PDXF", lend u32, the sender's instance
 *                     u64 (a late or stray free frees nothing) */
#define PDX_LOG_TOPIC "staged"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/shm_object.h"

#define MAGIC_CHUNK 0x53584450u /* "PDXS" */
#define MAGIC_READY 0x52584450u /* "PDXR" */
#define MAGIC_FREE 0x46584450u	/* "PDXF" */

static uint32_t read_u32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}

static uint64_t read_u64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return v;
}

struct slot {
	struct slot *next;
	uint32_t index;
	void *dev, *host;
	struct pdx_ucx_mem *mem; /* host, registered with UCX */
	struct chunk *lent;	 /* sender, shared: awaiting "free" */
	uint32_t lend;		 /* sender, shared: the lending's number */
};

/* A chunk on its way: queued, staged, then sent or placed. */
struct chunk {
	struct chunk *next;
	struct agent *agent;
	struct xfer *x;
	struct slot *slot;
	uint64_t first, count, len;
	bool send;	   /* sender; else receiver */
	void *desc;	   /* receiver, rendezvous: UCX's payload descriptor */
	const uint8_t *src; /* receiver, shared: the sender's slot, mapped */
	uint32_t peer_slot, peer_lend; /* receiver, shared: which, when */
	uint64_t peer_instance;	       /* receiver, shared: whose */
	bool ready_pending; /* sender, shared: "ready" not yet sent */
	bool peer_gone;	    /* sender, shared: ended once it is */
};

struct side {
	struct slot *free;
	struct chunk *head, *tail; /* waiting for a slot */
};

struct staging {
	bool stopping; /* the agent stops: chunks end without their xfers */
	size_t slot_bytes;
	struct side side[2]; /* [1] sending, [0] receiving */
	struct slot *all;
	uint32_t n_slots;
	char shm_name[64];
	uint8_t *shm; /* every slot's host buffer */
	size_t shm_len;
	int shm_lock; /* holds its lock while we live (shm_object.h): -1 none */
};

static void slots_free(struct agent *a, struct staging *s)
{
	for (uint32_t i = 0; s->all && i < s->n_slots; i++) {
		pdx_ucx_mem_free(a->ucx, s->all[i].mem);
		gpu_dev_free(a->gpu, s->all[i].dev);
	}
	free(s->all);
	if (s->shm) {
		gpu_host_unregister(a->gpu, s->shm);
		munmap(s->shm, s->shm_len);
		shm_unlink(s->shm_name);
	}
	if (s->shm_lock >= 0)
		close(s->shm_lock);
}

/* At stop, once UCX's worker is gone (no callback can come): the chunks
 * lent to a peer, and the slots. */
void staged_free(struct agent *a)
{
	if (!a->staging)
		return;
	for (uint32_t i = 0; i < a->staging->n_slots; i++)
		free(a->staging->all[i].lent);
	slots_free(a, a->staging);
	free(a->staging);
	a->staging = NULL;
}

/* The slots' host buffers, one shared-memory object locked from its
 * first moment while we live: one left by an agent that died (kill -9)
 * is what the next agent's start sweeps (agent_start), and a /dev/shm
 * too small for it is said now, not met as a SIGBUS later. */
static int shm_create(struct staging *s)
{
	char err[256];
	int fd;

	snprintf(s->shm_name, sizeof(s->shm_name), "/pdx-staging-%d-%llx",
		 (int)getpid(), (unsigned long long)pdx_now_ns());
	fd = pdx_shm_object_create(s->shm_name, err, sizeof(err));
	if (fd < 0) {
		log_error("%s", err);
		return -1;
	}
	if (ftruncate(fd, (off_t)s->shm_len))
		goto fail;
	if (pdx_shm_object_reserve(fd, s->shm_len, "the agent's staging",
				   "pdx-agent --staging-mb", err,
				   sizeof(err))) {
		log_error("%s", err);
		goto fail;
	}
	s->shm = mmap(NULL, s->shm_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		      0);
	if (s->shm == MAP_FAILED) {
		s->shm = NULL;
		goto fail;
	}
	s->shm_lock = fd;
	return 0;
fail:
	close(fd);
	shm_unlink(s->shm_name);
	return -1;
}

/* The slots: n_slots of slot_bytes (at least one block and two a side). */
pdx_status_t staged_init(struct agent *a)
{
	uint64_t bb = pdx_kv_layout_block_bytes(&a->reg.layout);
	uint64_t chunk = (uint64_t)a->cfg.staging_chunk_mb << 20;
	struct staging *s;

	if (a->staging)
		return a->staging->slot_bytes >= bb ? PDX_OK : PDX_EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return PDX_ENOMEM;
	s->shm_lock = -1;
	s->slot_bytes = chunk > bb ? chunk - chunk % bb : bb;
	s->n_slots = (uint32_t)(((uint64_t)a->cfg.staging_mb << 20) /
				s->slot_bytes);
	if (s->n_slots < 4)
		s->n_slots = 4;
	s->shm_len = (size_t)s->n_slots * s->slot_bytes;
	s->all = calloc(s->n_slots, sizeof(*s->all));
	if (!s->all || shm_create(s) ||
	    gpu_host_register(a->gpu, s->shm, s->shm_len))
		goto fail;
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct slot *sl = &s->all[i];

		sl->index = i;
		sl->host = s->shm + (size_t)i * s->slot_bytes;
		sl->dev = gpu_dev_alloc(a->gpu, s->slot_bytes);
		if (!sl->dev ||
		    pdx_ucx_mem_register(a->ucx, sl->host, s->slot_bytes,
					 &sl->mem))
			goto fail;
		sl->next = s->side[i % 2].free;
		s->side[i % 2].free = sl;
	}
	log_info("staging: %u slots of %zu bytes (pinned host %s + device)",
		 s->n_slots, s->slot_bytes, s->shm_name);
	a->staging = s;
	return PDX_OK;
fail:
	log_error("cannot allocate %u staging slots of %zu bytes", s->n_slots,
		  s->slot_bytes);
	slots_free(a, s); /* unregistering what was not registered is harmless */
	free(s);
	return PDX_ENOMEM;
}

void staged_pack_hello(struct agent *a, struct pdx_mp_msg *m)
{
	struct staging *s = a->staging;

	pdx_mp_msg_map_open(m, "staging");
	pdx_mp_msg_str(m, "name", s ? s->shm_name : "");
	pdx_mp_msg_u64(m, "slots", s ? s->n_slots : 0);
	pdx_mp_msg_u64(m, "slot_bytes", s ? s->slot_bytes : 0);
	pdx_mp_msg_map_close(m);
}

void staged_peer_unmap(struct agent *a, struct peer *p)
{
	if (!p->staging_map)
		return;
	gpu_host_unregister(a->gpu, p->staging_map);
	munmap(p->staging_map, p->staging_len);
	p->staging_map = NULL;
}

/* Same host: the peer's staging, mapped and pinned here, so its chunks
 * need no copy between the two agents. */
bool staged_peer_map(struct agent *a, struct peer *p, const msgpack_object *o)
{
	char name[64];
	uint64_t slots, slot_bytes;
	struct stat st;
	int fd;

	if (!o || pdx_mp_get_str(o, "name", name, sizeof(name)) || !name[0] ||
	    pdx_mp_get_u64(o, "slots", &slots) ||
	    pdx_mp_get_u64(o, "slot_bytes", &slot_bytes) || !slots ||
	    slot_bytes < pdx_kv_layout_block_bytes(&a->reg.layout) ||
	    slots > (1u << 20) || slot_bytes > (1ULL << 40))
		return false;
	fd = shm_open(name, O_RDWR, 0);
	if (fd < 0)
		return false;
	p->staging_len = (size_t)(slots * slot_bytes);
	if (fstat(fd, &st) || (uint64_t)st.st_size < p->staging_len) {
		close(fd);
		return false;
	}
	p->staging_map = mmap(NULL, p->staging_len, PROT_READ | PROT_WRITE,
			      MAP_SHARED, fd, 0);
	close(fd);
	if (p->staging_map == MAP_FAILED ||
	    gpu_host_register(a->gpu, p->staging_map, p->staging_len)) {
		if (p->staging_map != MAP_FAILED)
			munmap(p->staging_map, p->staging_len);
		p->staging_map = NULL;
		return false;
	}
	p->staging_slots = (uint32_t)slots;
	p->staging_slot_bytes = slot_bytes;
	return true;
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
	if (sl && sl->lent == c)
		sl->lent = NULL;
	free(c);
	if (a->staging->stopping) /* the transfers are gone: only memory */
		return;
	if (send) {
		complete_op_ended(x, st);
	} else {
		xfer_unhold(x);
		if (st && !x->finished)
			xfer_fail(x, st, true, "staged data from %s: %s",
				  x->peer_addr, pdx_status_str(st));
		complete_try_received(x);
		xfer_maybe_release(x);
	}
	if (sl)
		slot_put(a, send, sl);
}

static void chunk_done(void *arg, pdx_status_t st)
{
	chunk_end(arg, st);
}

/* Sender, shared: "ready" went out; the slot stays lent until "free"
 * (or until the peer is gone, which may have happened meanwhile). */
static void ready_sent(void *arg, pdx_status_t st)
{
	struct chunk *c = arg;

	c->ready_pending = false;
	if (st || c->peer_gone)
		chunk_end(c, st ? st : PDX_EPEER);
}

static void pack_chunk(uint8_t *hdr, const struct pdx_xfer_id *id,
		       uint64_t first, uint64_t count, uint32_t magic)
{
	uint32_t n = (uint32_t)count;

	memcpy(hdr, id->b, 16);
	memcpy(hdr + 16, &first, 8);
	memcpy(hdr + 24, &n, 4);
	memcpy(hdr + 28, &magic, 4);
}

/* Sender: the chunk is in pinned host memory. */
static void staged(void *arg, pdx_status_t st)
{
	struct chunk *c = arg;
	struct xfer *x = c->x;
	uint8_t hdr[AM_STAGED_READY_BYTES] = { 0 };

	if (st || x->finished || !x->peer->ep) {
		chunk_end(c, st ? st : x->finished ? PDX_OK : PDX_EPEER);
		return;
	}
	if (x->peer->staged_shared) {
		pack_chunk(hdr, &x->id, c->first, c->count, MAGIC_READY);
		c->slot->lend++;
		memcpy(hdr + 32, &c->slot->index, 4);
		memcpy(hdr + 36, &c->slot->lend, 4);
		memcpy(hdr + 40, &c->agent->instance, 8);
		c->slot->lent = c;
		c->ready_pending = true;
		st = pdx_ucx_am_send(x->peer->ep, AM_STAGED_READY, hdr,
				     AM_STAGED_READY_BYTES,
				     NULL, 0, NULL, ready_sent, c);
		if (st)
			c->ready_pending = false;
	} else {
		pack_chunk(hdr, &x->id, c->first, c->count, MAGIC_CHUNK);
		st = pdx_ucx_am_send_rndv(x->peer->ep, AM_STAGED_CHUNK, hdr,
					  AM_STAGED_CHUNK_BYTES, c->slot->host,
					  c->len, c->slot->mem, chunk_done, c);
	}
	if (st)
		chunk_end(c, st);
}

static void sent_nothing_to_do(void *arg, pdx_status_t st)
{
	(void)arg;
	(void)st;
}

/* Receiver, shared: tell the sender its slot is free again, if it is
 * still the incarnation that lent it. */
static void send_free(struct peer *p, uint32_t slot, uint32_t lend,
		      uint64_t instance)
{
	uint8_t hdr[AM_STAGED_FREE_BYTES];
	uint32_t magic = MAGIC_FREE;

	if (!p || p->instance != instance)
		return; /* it restarted: the slot is not lent any more */
	memcpy(hdr, &slot, 4);
	memcpy(hdr + 4, &magic, 4);
	memcpy(hdr + 8, &lend, 4);
	memcpy(hdr + 12, &instance, 8);
	if (!p->ep || pdx_ucx_am_send(p->ep, AM_STAGED_FREE, hdr, sizeof(hdr), NULL, 0,
				      NULL, sent_nothing_to_do, NULL))
		log_warn("cannot free staging slot %u of %s", slot, p->addr);
}

/* Receiver: placed in our blocks. */
static void placed(void *arg, pdx_status_t st)
{
	struct chunk *c = arg;

	if (c->src)
		send_free(c->x->peer, c->peer_slot, c->peer_lend,
			  c->peer_instance);
	chunk_end(c, st);
}

/* Receiver: the chunk is in pinned host memory (ours or, shared, the
 * sender's). */
static void arrived(void *arg, pdx_status_t st)
{
	struct chunk *c = arg;
	struct gpu *g = c->agent->gpu;

	if (st || c->x->finished) {
		placed(c, st);
		return;
	}
	st = gpu_copy(g, c->slot->dev, c->src ? c->src : c->slot->host,
		      c->len);
	if (!st)
		st = gpu_scatter(g, c->x->plan, c->first, c->count,
				 c->slot->dev);
	if (!st)
		st = gpu_then(g, placed, c);
	if (st)
		placed(c, st);
}

/* The chunk has a slot: start its first step. */
static void start(struct chunk *c)
{
	struct agent *a = c->agent;
	pdx_status_t st = PDX_OK;

	if (c->x->finished) {
		if (c->send)
			chunk_end(c, PDX_OK);
		else
			placed(c, PDX_OK); /* frees a shared slot too */
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
		if (st)
			chunk_end(c, st);
	} else if (c->src) {
		arrived(c, PDX_OK);
	} else {
		void *desc = c->desc;

		c->desc = NULL;
		st = pdx_ucx_am_recv(a->ucx, desc, c->slot->host, c->len,
				     arrived, c);
		if (st) {
			c->desc = desc; /* released by chunk_end */
			chunk_end(c, st);
		}
	}
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

/* Segments [first, first + count) of x, in chunks of at most a slot. */
static pdx_status_t staged_send(struct xfer *x, uint64_t first, uint64_t count)
{
	struct agent *a = x->agent;
	uint64_t bb = pdx_kv_layout_block_bytes(&a->reg.layout), per;
	pdx_status_t st = staged_init(a);

	if (st)
		return st;
	per = a->staging->slot_bytes / bb;
	if (x->peer->staged_shared && x->peer->staging_slot_bytes / bb < per)
		per = x->peer->staging_slot_bytes / bb; /* its device slots */
	if (per == 0)
		return PDX_EINVAL; /* blocks larger than a slot */
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
				 size_t len, uint32_t magic, uint64_t *first,
				 uint64_t *count)
{
	struct pdx_xfer_id id;
	uint32_t n, m;
	uint64_t total;
	struct xfer *x;

	memcpy(id.b, hdr, 16);
	memcpy(first, hdr + 16, 8);
	memcpy(&n, hdr + 24, 4);
	memcpy(&m, hdr + 28, 4);
	*count = n;
	x = xfer_find(a, &id);
	if (m != magic || !x || x->role != XFER_RECV || !x->announced ||
	    x->finished || !a->reg.ok || !a->reg.cuda || n == 0)
		return NULL;
	total = gpu_layer_segments(x) * a->reg.layout.layers;
	if (*first > total || n > total - *first ||
	    len != n * pdx_kv_layout_block_bytes(&a->reg.layout))
		return NULL;
	if (staged_init(a) || len > a->staging->slot_bytes) {
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

/* ready: the "ready" header (shared slot), whose slot goes back to its
 * sender whatever becomes of the chunk. */
static void chunk_received(struct agent *a, struct xfer *x, uint64_t first,
			   uint64_t count, size_t len, void *desc,
			   const uint8_t *src, const uint8_t *ready)
{
	struct chunk *c = calloc(1, sizeof(*c));

	if (!c) {
		xfer_fail(x, PDX_ENOMEM, true, "out of memory");
		if (desc)
			pdx_ucx_am_drop(a->ucx, desc);
		if (ready)
			send_free(x->peer, read_u32(ready + 32),
				  read_u32(ready + 36), read_u64(ready + 40));
		return;
	}
	*c = (struct chunk){ .agent = a, .x = x, .first = first,
			     .count = count, .len = len, .desc = desc,
			     .src = src };
	if (ready) {
		c->peer_slot = read_u32(ready + 32);
		c->peer_lend = read_u32(ready + 36);
		c->peer_instance = read_u64(ready + 40);
	}
	x->am_bytes += len;
	xfer_hold(x);
	enqueue(a, c);
}

static struct peer *peer_by_instance(struct agent *a, uint64_t instance)
{
	struct peer *p, *tmp;

	HASH_ITER(hh, a->peers, p, tmp)
		if (peer_known(p) && p->instance == instance)
			return p;
	return NULL;
}

/* "ready": the chunk is in the sender's slot, which we map. Whatever
 * becomes of it, the slot is freed to its sender. */
static void on_ready(struct agent *a, const uint8_t *hdr)
{
	uint64_t bb = a->reg.ok ? pdx_kv_layout_block_bytes(&a->reg.layout) : 0;
	uint64_t first, count, instance = read_u64(hdr + 40);
	uint32_t slot = read_u32(hdr + 32), n = read_u32(hdr + 24);
	struct peer *p;
	struct xfer *x;

	x = chunk_target(a, hdr, (size_t)(n * bb), MAGIC_READY, &first, &count);
	p = x ? x->peer : peer_by_instance(a, instance);
	if (!x || !p || p->instance != instance || !p->staging_map ||
	    slot >= p->staging_slots || n * bb > p->staging_slot_bytes) {
		log_warn("staged ready (slot %u) for no awaited blocks or no mapped "
			 "staging: dropped", slot);
		if (x)
			xfer_fail(x, PDX_EINVAL, true,
				  "staged chunk in a slot we cannot read");
		send_free(p, slot, read_u32(hdr + 36), instance);
		return;
	}
	chunk_received(a, x, first, count, (size_t)(n * bb), NULL,
		       p->staging_map + (uint64_t)slot * p->staging_slot_bytes,
		       hdr);
}

/* "free": the receiver is done with one of our slots. */
static void on_free(struct agent *a, const uint8_t *hdr)
{
	uint32_t slot = read_u32(hdr), lend = read_u32(hdr + 8);
	struct slot *sl;

	if (read_u32(hdr + 4) != MAGIC_FREE || read_u64(hdr + 12) != a->instance ||
	    !a->staging || slot >= a->staging->n_slots ||
	    !(sl = &a->staging->all[slot])->lent || sl->lend != lend ||
	    sl->lent->ready_pending) {
		log_warn("free for staging slot %u (lend %u), not lent so: ignored",
			 slot, lend);
		return;
	}
	chunk_end(sl->lent, PDX_OK);
}

void staged_peer_gone(struct agent *a, struct peer *p)
{
	for (uint32_t i = 0; a->staging && !a->staging->stopping &&
			     i < a->staging->n_slots; i++) {
		struct chunk *c = a->staging->all[i].lent;

		if (!c || c->x->peer != p)
			continue;
		if (c->ready_pending) /* its send ends it (cancelled) */
			c->peer_gone = true;
		else
			chunk_end(c, PDX_EPEER);
	}
}

/* At stop, before the transfers go: chunks still waiting for a slot only
 * hold memory (and, received, a UCX descriptor, released while the
 * worker is there); none is queued after this. */
void staged_stop(struct agent *a)
{
	if (!a->staging)
		return;
	a->staging->stopping = true;
	for (int i = 0; i < 2; i++) {
		while (a->staging->side[i].head) {
			struct chunk *c = a->staging->side[i].head;

			a->staging->side[i].head = c->next;
			if (c->desc)
				pdx_ucx_am_drop(a->ucx, c->desc);
			free(c);
		}
		a->staging->side[i].tail = NULL;
	}
}

/* A ready or free of the wrong size: nothing of it is read. */
static bool malformed(struct agent *a, const char *what, size_t hdr_len,
		      size_t want, void *data, size_t len, bool rndv)
{
	if (hdr_len == want && len == 0)
		return false;
	log_warn("staged %s (header %zu bytes, payload %zu): dropped", what,
		 hdr_len, len);
	if (rndv)
		pdx_ucx_am_drop(a->ucx, data);
	return true;
}

static void am_ready(void *agent, const void *hdr, size_t hdr_len, void *data,
		     size_t len, bool rndv)
{
	if (!malformed(agent, "ready", hdr_len, AM_STAGED_READY_BYTES, data,
		       len, rndv))
		on_ready(agent, hdr);
}

static void am_free(void *agent, const void *hdr, size_t hdr_len, void *data,
		    size_t len, bool rndv)
{
	if (!malformed(agent, "free", hdr_len, AM_STAGED_FREE_BYTES, data, len,
		       rndv))
		on_free(agent, hdr);
}

static void am_chunk(void *agent, const void *hdr, size_t hdr_len, void *data,
		     size_t len, bool rndv)
{
	struct agent *a = agent;
	uint64_t first, count;
	struct xfer *x;

	x = hdr_len == AM_STAGED_CHUNK_BYTES ?
		    chunk_target(a, hdr, len, MAGIC_CHUNK, &first, &count) :
		    NULL;
	if (!x || !rndv) {
		/* the sender always sends by rendezvous */
		log_warn("staged chunk (%zu bytes%s) for no awaited blocks: dropped",
			 len, rndv ? "" : ", not rendezvous");
		if (x)
			xfer_fail(x, PDX_EINVAL, true,
				  "staged chunk not sent by rendezvous");
		if (rndv)
			pdx_ucx_am_drop(a->ucx, data);
		return;
	}
	chunk_received(a, x, first, count, len, data, NULL, NULL);
}

/* Layers are consecutive segments in staging order, so n layers are one
 * range of chunks, which may span layers. */
static pdx_status_t staged_push(struct xfer *x, uint32_t layer, uint32_t n)
{
	uint64_t segs = gpu_layer_segments(x);
	pdx_status_t st;

	if (!x->plan && (st = gpu_plan_xfer(x)))
		return st;
	return staged_send(x, layer * segs, n * segs);
}

static const struct data_path_am staged_messages[] = {
	{ AM_STAGED_CHUNK, am_chunk },
	{ AM_STAGED_READY, am_ready },
	{ AM_STAGED_FREE, am_free },
};

const struct data_path_ops data_path_staged_ops = {
	.push = staged_push,
	.layer_runs = true,
	.flush = complete_flush_ucx,
	.am = staged_messages,
	.n_am = sizeof(staged_messages) / sizeof(staged_messages[0]),
};
