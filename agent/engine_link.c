/* The engine link: register, send, layer_done, recv, abort; events back.
 * See docs/protocol.md section 1. */
#define PDX_LOG_TOPIC "engine"
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/kv_dtype.h"
#include "common/layout_mp.h"
#include "common/log.h"
#include "common/prefault.h"
#include "common/mp.h"
#include "common/tcp_addr.h"

#define MAX_BLOCKS (1u << 20)

/* An op refused: {"op": "error", "status", "reason", "refused": the op it
 * answers, "xfer" when the refused message named one}. */
/* Sends a message built for the engine eid and frees it; one that ran out
 * of memory or found the link full is dropped, and logged. */
static void engine_reply(struct agent *a, const void *eid, size_t eid_len,
			 struct pdx_mp_msg *m, const char *what)
{
	if (pdx_mp_msg_end(m))
		log_warn("%s for the engine dropped: out of memory", what);
	else if (engine_send_frame(a, eid, eid_len, m->buf.data, m->buf.size))
		log_warn("%s for the engine dropped: engine link busy or gone",
			 what);
	pdx_mp_msg_free(m);
}

static void reply_error(struct agent *a, const void *eid, size_t eid_len,
			const char *refused, const struct pdx_xfer_id *xfer,
			pdx_status_t st, const char *fmt, ...)
	__attribute__((format(printf, 7, 8)));

static void reply_error(struct agent *a, const void *eid, size_t eid_len,
			const char *refused, const struct pdx_xfer_id *xfer,
			pdx_status_t st, const char *fmt, ...)
{
	char reason[PDX_REASON_MAX];
	struct pdx_mp_msg m;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	log_warn("%s refused: %s", refused[0] ? refused : "a message", reason);
	pdx_mp_msg_init(&m);
	pdx_mp_msg_str(&m, "op", "error");
	pdx_mp_msg_i64(&m, "status", st);
	pdx_mp_msg_str(&m, "reason", reason);
	pdx_mp_msg_str(&m, "refused", refused);
	if (xfer)
		pdx_mp_msg_xfer(&m, "xfer", xfer);
	engine_reply(a, eid, eid_len, &m, "error");
}

static void send_event(struct agent *a, const void *eid, size_t eid_len,
		       const struct xfer *x, const char *kind)
{
	struct pdx_mp_msg m;

	pdx_mp_msg_init(&m);
	pdx_mp_msg_str(&m, "op", "event");
	xfer_pack_outcome(&m, x, kind);
	if (x->meta_len && strcmp(kind, "received") == 0)
		pdx_mp_msg_bin(&m, "meta", x->meta, x->meta_len);
	engine_reply(a, eid, eid_len, &m, "event");
}

/* To the connection registered now: a transfer of an earlier registration
 * (it failed when the engine registered again) is reported there too, to
 * the same engine reconnected, or to its successor, which ignores ids it
 * does not know. */
void engine_send_event(struct agent *a, struct xfer *x, const char *kind)
{
	if (a->reg.ok)
		send_event(a, a->reg.engine_id, a->reg.engine_id_len, x, kind);
}

/* The agent serves the connection (ZeroMQ identity) that registered last:
 * what another one says is refused, so an engine that reconnected learns
 * at once that it must register again instead of losing its events to
 * the old connection. */
static bool from_engine(const struct agent *a, const void *eid, size_t eid_len)
{
	return a->reg.ok && eid_len == a->reg.engine_id_len &&
	       memcmp(eid, a->reg.engine_id, eid_len) == 0;
}

static const char *not_registered(const struct agent *a)
{
	return a->reg.ok ? "not registered on this connection: register "
			   "again (the agent serves the connection that "
			   "registered last)"
			 : "not registered: register first";
}

/* A send or recv refused before it became a transfer here still ends in
 * its one event, to the connection that announced it. */
static void refuse_announce(struct agent *a, const void *eid, size_t eid_len,
			    const char *op, const struct pdx_xfer_id *id,
			    pdx_status_t st, const char *reason)
{
	struct xfer tmp = { .id = *id, .agent = a, .status = st,
			    .first_token = -1, .t_first_ns = pdx_now_ns() };
	char hex[33];

	pdx_xfer_id_hex(id, hex);
	log_warn("%s %s refused: %s", op, hex, reason);
	snprintf(tmp.reason, sizeof(tmp.reason), "%s", reason);
	send_event(a, eid, eid_len, &tmp, "failed");
}

static void region_unmap(struct agent *a, struct region *r)
{
	pdx_ucx_rkey_buf_free(r->rkey);
	pdx_ucx_mem_free(a->ucx, r->mem);
	if (r->cuda)
		gpu_mem_close(a->gpu, r->addr);
	else if (r->addr)
		munmap(r->addr, r->size);
}

static void registration_release(struct agent *a, struct registration *g)
{
	for (uint32_t i = 0; i < g->n_regions; i++)
		region_unmap(a, &g->regions[i]);
	for (uint32_t i = 0; g->events && i < g->event_slots * g->layout.layers;
	     i++)
		gpu_event_close(a->gpu, g->events[i]);
	free(g->events);
	g->events = NULL;
	g->event_slots = 0;
	free(g->regions);
	free(g->layout.layer);
	g->regions = NULL;
	g->n_regions = 0;
	g->layout.layer = NULL;
	g->ok = false;
}

/* A registration ended while its memory may still be in use
 * (left_in_use): released once it is not (registrations_left_release),
 * an engine having ended one and registered again meanwhile, say. */
struct registration_left {
	struct registration g;
	struct registration_left *next;
};

/* Whether an ended registration's memory may still be in use: a UCX
 * operation or GPU copy on it, or a receive waiting for its sender's
 * "stopped" (the sender may still write into it: a put lane's writes are
 * the peer's operations, not ours), of a transfer begun before the last
 * registration was retired. A later transfer's are on later memory: an
 * engine registered again under steady load does not keep the old
 * memory held. */
static bool left_in_use(struct agent *a)
{
	struct xfer *x, *tmp;

	HASH_ITER(hh, a->xfers, x, tmp) {
		if (x->era < a->retired && (x->inflight || x->await_stopped))
			return true;
	}
	return false;
}

static void registration_retire(struct agent *a)
{
	struct registration_left *l;

	if (!a->reg.ok)
		return;
	a->retired++; /* every transfer so far is of the old memory */
	if (!left_in_use(a) || !(l = calloc(1, sizeof(*l)))) {
		registration_release(a, &a->reg);
		return;
	}
	l->g = a->reg;
	l->next = a->left;
	a->left = l;
	memset(&a->reg, 0, sizeof(a->reg));
	a->reg.engine_fd = -1;
}

/* The memory of ended registrations: once none is in use, or all of it
 * (at stop, the UCX worker gone). */
static void left_release(struct agent *a, bool all)
{
	if (a->left && !all && left_in_use(a))
		return;
	while (a->left) {
		struct registration_left *l = a->left;

		a->left = l->next;
		registration_release(a, &l->g);
		free(l);
	}
}

void registrations_left_release(struct agent *a)
{
	left_release(a, false);
}

void registration_clear(struct agent *a)
{
	registration_release(a, &a->reg);
	left_release(a, true);
}

/* GPU completions are an event callback like any other: they end with
 * agent_settle(). */
static void settle(void *arg)
{
	struct agent *a = arg;

	a->settle(a);
}

/* The agent's stream lives on the engine's device, made at its first
 * GPU registration. */
static pdx_status_t gpu_use(struct agent *a, int device, char *err,
			    size_t errlen)
{
	if (a->gpu && gpu_device(a->gpu) == device)
		return PDX_OK;
	if (a->gpu) {
		snprintf(err, errlen, "GPU memory on device %d, but this agent "
			 "serves device %d (restart it to change)", device,
			 gpu_device(a->gpu));
		return PDX_EINVAL;
	}
	a->gpu = gpu_new(a->base, device, settle, a, err, errlen);
	return a->gpu ? PDX_OK : PDX_EINVAL;
}

static pdx_status_t region_open_cuda(struct agent *a, const msgpack_object *o,
				     uint32_t i, struct region *r, char *err,
				     size_t errlen)
{
	const void *h;
	size_t hlen;
	uint64_t device;
	pdx_status_t st;

	if (pdx_mp_get_bin(o, "ipc", &h, &hlen) || hlen != PDX_CUDA_IPC_BYTES) {
		snprintf(err, errlen, "regions[%u].ipc: want a bin of %d bytes "
			 "(a cudaIpcMemHandle_t)", i, PDX_CUDA_IPC_BYTES);
		return PDX_EINVAL;
	}
	if (pdx_mp_get_u64(o, "device", &device) || device > INT32_MAX) {
		snprintf(err, errlen, "regions[%u].device: want a CUDA device "
			 "ordinal (an int)", i);
		return PDX_EINVAL;
	}
	st = gpu_use(a, (int)device, err, errlen);
	if (st)
		return st;
	memcpy(r->ipc, h, PDX_CUDA_IPC_BYTES);
	st = gpu_mem_open(a->gpu, r->ipc, &r->addr, err, errlen);
	if (st)
		return st;
	r->cuda = true;
	/* Only a UCX with CUDA support can register (and put) GPU memory;
	 * the other paths need no registration of it. */
	if (!pdx_ucx_has_cuda(a->ucx))
		return PDX_OK;
	st = pdx_ucx_mem_register_type(a->ucx, r->addr, r->size, true, &r->mem);
	if (!st)
		st = pdx_ucx_mem_rkey(a->ucx, r->mem, &r->rkey, &r->rkey_len);
	if (st)
		snprintf(err, errlen, "ucx registration of GPU memory: %s",
			 pdx_status_str(st));
	return st;
}

/* "cuda_events": slots x layers interprocess event handles. */
static pdx_status_t events_open(struct agent *a, const msgpack_object *m,
				struct registration *g, char *err,
				size_t errlen)
{
	const msgpack_object *evs = pdx_mp_get(m, "cuda_events");
	uint64_t slots, n;

	if (!evs)
		return PDX_OK;
	if (!g->cuda) {
		snprintf(err, errlen, "cuda_events: only with GPU regions");
		return PDX_EINVAL;
	}
	if (pdx_mp_get_u64(m, "cuda_event_slots", &slots) || slots == 0 ||
	    slots > 64) {
		snprintf(err, errlen, "cuda_event_slots: want an int 1..64 "
			 "with cuda_events");
		return PDX_EINVAL;
	}
	if (evs->type != MSGPACK_OBJECT_ARRAY ||
	    evs->via.array.size != slots * g->layout.layers) {
		snprintf(err, errlen, "cuda_events: want an array of "
			 "cuda_event_slots x layers = %llu handles",
			 (unsigned long long)(slots * g->layout.layers));
		return PDX_EINVAL;
	}
	n = evs->via.array.size;
	g->events = calloc(n, sizeof(*g->events));
	if (!g->events)
		return PDX_ENOMEM;
	g->event_slots = (uint32_t)slots;
	for (uint64_t i = 0; i < n; i++) {
		const msgpack_object *e = &evs->via.array.ptr[i];

		if (e->type != MSGPACK_OBJECT_BIN ||
		    e->via.bin.size != PDX_CUDA_IPC_BYTES ||
		    gpu_event_open(a->gpu, (const uint8_t *)e->via.bin.ptr,
				   &g->events[i])) {
			snprintf(err, errlen, "cuda_events[%llu]: not a "
				 "%d-byte handle that opens here",
				 (unsigned long long)i, PDX_CUDA_IPC_BYTES);
			return PDX_EINVAL;
		}
	}
	return PDX_OK;
}

static pdx_status_t region_map(struct agent *a, const msgpack_object *o,
			       uint32_t i, struct region *r, char *err,
			       size_t errlen)
{
	char type[16];
	struct stat sb = { 0 };
	pdx_status_t st;
	int fd;

	if (o->type != MSGPACK_OBJECT_MAP) {
		snprintf(err, errlen, "regions[%u]: want a map", i);
		return PDX_EINVAL;
	}
	if (pdx_mp_get_str(o, "type", type, sizeof(type))) {
		snprintf(err, errlen, "regions[%u].type: want \"shm\" or \"cuda\"",
			 i);
		return PDX_EINVAL;
	}
	if (pdx_mp_get_u64(o, "size", &r->size) || r->size == 0) {
		snprintf(err, errlen, "regions[%u].size: want a positive int", i);
		return PDX_EINVAL;
	}
	if (strcmp(type, "cuda") == 0)
		return region_open_cuda(a, o, i, r, err, errlen);
	if (strcmp(type, "shm") != 0) {
		snprintf(err, errlen, "regions[%u].type: \"%s\" is not supported "
			 "(shm, cuda)", i, type);
		return PDX_EINVAL;
	}
	if (pdx_mp_get_str(o, "name", r->shm_name, sizeof(r->shm_name))) {
		snprintf(err, errlen, "regions[%u].name: want the shm_open() "
			 "name (a str)", i);
		return PDX_EINVAL;
	}
	fd = shm_open(r->shm_name, O_RDWR, 0);
	if (fd < 0) {
		snprintf(err, errlen, "shm_open %s: %m", r->shm_name);
		return PDX_EIO;
	}
	/* past the object's end a page faults with SIGBUS */
	if (fstat(fd, &sb) || (uint64_t)sb.st_size < r->size) {
		snprintf(
		    err, errlen,
		    "shm %s holds %lld bytes, fewer than the region's %llu",
		    r->shm_name, (long long)sb.st_size,
		    (unsigned long long)r->size);
		close(fd);
		return PDX_ERANGE;
	}
	/* Populated now, once, so the first transfer does not fault in every
	 * page of the pool on its way. */
	r->addr = mmap(NULL, r->size, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_POPULATE, fd, 0);
	close(fd);
	if (r->addr == MAP_FAILED) {
		r->addr = NULL;
		snprintf(err, errlen, "mmap %s (%llu bytes): %m", r->shm_name,
			 (unsigned long long)r->size);
		return PDX_EIO;
	}
	pdx_prefault(r->addr, r->size);
	a->held_by = "mapping the engine's memory, page by page";
	st = pdx_ucx_mem_register(a->ucx, r->addr, r->size, &r->mem);
	if (!st)
		st = pdx_ucx_mem_rkey(a->ucx, r->mem, &r->rkey, &r->rkey_len);
	if (st)
		snprintf(err, errlen, "ucx registration of %s: %s", r->shm_name,
			 pdx_status_str(st));
	return st;
}

static void fail_registration_xfers(struct agent *a, const char *why)
{
	struct xfer *x, *tmp;

	/* the wants that came before our engine announced them too: the
	 * peer sent them to the instance that ends now, and fails them
	 * when our new hello comes */
	HASH_ITER(hh, a->xfers, x, tmp) {
		if (!x->finished)
			xfer_fail(x, PDX_ECANCELED, true, "%s", why);
	}
}

/* The engine registered again (it restarted, say): its memory, so the
 * regions, addresses and rkeys our peers cached from our hello, changed.
 * To them we are a new agent: a new instance, in a hello sent to every
 * known peer now, so that a sender never writes into the old engine's
 * memory by its cached handshake, and a peer's next transfer with us
 * begins with the new instance (the old one's transfers failed here
 * already, and the peer fails them too on that hello). */
static void renew_instance(struct agent *a)
{
	struct peer *p, *tmp;
	uint64_t was = a->instance;

	if (getrandom(&a->instance, sizeof(a->instance), 0) !=
		    sizeof(a->instance) ||
	    a->instance == was)
		a->instance = was + 1;
	HASH_ITER(hh, a->peers, p, tmp) {
		p->stale = true;
		p->ep_renew = p->ep != NULL;
		peer_get(a, p->addr); /* sends the hello */
	}
}

void engine_gone(struct agent *a)
{
	struct peer *p, *tmp;
	unsigned told = 0;

	engine_direct_drop(a, a->reg.engine_id, a->reg.engine_id_len);
	fail_registration_xfers(a, "engine gone (its connection to this "
				   "agent closed)");
	HASH_ITER(hh, a->peers, p, tmp) {
		if (peer_known(p)) {
			tell_gone(a, p);
			told++;
		}
	}
	registration_retire(a);
	log_warn("the engine's connection closed (it exited, or freed its "
		 "link): its transfers failed, its KV memory is released%s, "
		 "and %u peer(s) told", a->left ?
		 " once no peer writes or reads it" : "", told);
	a->engine_left = true;
}

/* "tp": {rank, size}, optional: this engine's rank of its TP size. */
static pdx_status_t register_tp(const msgpack_object *m, struct registration *g,
				char *err, size_t errlen)
{
	const msgpack_object *tp = pdx_mp_get(m, "tp");
	uint64_t rank, size;

	g->tp = (struct tp_rank){ 0, 1 };
	if (!tp)
		return PDX_OK;
	if (tp->type != MSGPACK_OBJECT_MAP || pdx_mp_get_u64(tp, "rank", &rank) ||
	    pdx_mp_get_u64(tp, "size", &size) || size > UINT32_MAX) {
		snprintf(err, errlen, "tp: want a map {rank, size} (ints)");
		return PDX_EINVAL;
	}
	if (tp_size_refusal((uint32_t)size, err, errlen))
		return PDX_EINVAL;
	if (rank >= size) {
		snprintf(err, errlen, "tp: rank %llu of size %llu",
			 (unsigned long long)rank, (unsigned long long)size);
		return PDX_EINVAL;
	}
	g->tp = (struct tp_rank){ (uint32_t)rank, (uint32_t)size };
	return PDX_OK;
}

/* "kv_dtype", optional: the KV's element type by name (what libpdx's
 * pdx_engine_set_kv_dtype() takes); compared in the handshake. */
static pdx_status_t register_kv_dtype(const msgpack_object *m,
				      struct registration *g, char *err,
				      size_t errlen)
{
	const msgpack_object *o = pdx_mp_get(m, "kv_dtype");

	if (!o)
		return PDX_OK;
	if (pdx_mp_get_str(m, "kv_dtype", g->kv_dtype, sizeof(g->kv_dtype)) ||
	    (g->kv_dtype[0] && !pdx_kv_dtype_name_ok(g->kv_dtype))) {
		snprintf(err, errlen, "kv_dtype: want a name of at most %d "
			 "letters, digits, '_', '.' or '-'",
			 PDX_KV_DTYPE_MAX - 1);
		return PDX_EINVAL;
	}
	return PDX_OK;
}

/* Another connection registered: the one before is told, so an engine
 * still there (two engines given one agent, e.g. TP ranks sharing an
 * address) learns it is not served any more instead of waiting on events
 * that go to the other. A restarted engine's old connection is gone:
 * nothing to tell, nothing logged. */
static void tell_displaced(struct agent *a, const void *old, size_t old_len)
{
	struct pdx_mp_msg m;

	pdx_mp_msg_init(&m);
	pdx_mp_msg_str(&m, "op", "displaced");
	pdx_mp_msg_str(&m, "reason",
		       "another engine registered with this agent, which "
		       "serves the connection that registered last (one "
		       "agent per engine; with tensor parallelism, one per "
		       "rank): this engine stays unregistered until it is "
		       "started again");
	if (!pdx_mp_msg_end(&m))
		engine_send_frame(a, old, old_len, m.buf.data, m.buf.size);
	pdx_mp_msg_free(&m);
}

static void on_register(struct agent *a, const void *id, size_t id_len,
			const msgpack_object *m)
{
	struct registration g = { 0 };
	const msgpack_object *regions, *layout;
	uint64_t *sizes = NULL;
	char err[PDX_REASON_MAX] = "";
	pdx_status_t st = PDX_EINVAL;
	bool again;
	uint64_t v;

	layout = pdx_mp_get(m, "layout");
	regions = pdx_mp_get(m, "regions");
	if (pdx_mp_get_u64(m, "v", &v) || v != 1) {
		snprintf(err, sizeof(err), "v: protocol version must be 1");
		goto refuse;
	}
	if (!layout || layout->type != MSGPACK_OBJECT_MAP) {
		snprintf(err, sizeof(err), "layout: want a map");
		goto refuse;
	}
	if (!regions || regions->type != MSGPACK_OBJECT_ARRAY ||
	    regions->via.array.size == 0 ||
	    regions->via.array.size > PDX_MAX_REGIONS) {
		snprintf(err, sizeof(err), "regions: want an array of 1..%d maps",
			 PDX_MAX_REGIONS);
		goto refuse;
	}
	st = pdx_layout_unpack(layout, &g.layout, err, sizeof(err));
	if (!st)
		st = register_tp(m, &g, err, sizeof(err));
	if (!st)
		st = register_kv_dtype(m, &g, err, sizeof(err));
	if (st)
		goto refuse;
	g.n_regions = regions->via.array.size;
	g.regions = calloc(g.n_regions, sizeof(*g.regions));
	sizes = calloc(g.n_regions, sizeof(*sizes));
	if (!g.regions || !sizes) {
		st = PDX_ENOMEM;
		snprintf(err, sizeof(err), "out of memory");
		goto refuse;
	}
	for (uint32_t i = 0; i < g.n_regions; i++) {
		st = region_map(a, &regions->via.array.ptr[i], i, &g.regions[i],
				err, sizeof(err));
		if (st)
			goto refuse;
		sizes[i] = g.regions[i].size;
		if (i > 0 && g.regions[i].cuda != g.regions[0].cuda) {
			st = PDX_EINVAL;
			snprintf(err, sizeof(err), "regions[%u].type: the regions "
				 "mix host and GPU memory", i);
			goto refuse;
		}
	}
	g.cuda = g.regions[0].cuda;
	g.device = g.cuda ? gpu_device(a->gpu) : -1;
	st = pdx_kv_layout_check(&g.layout, sizes, g.n_regions, err, sizeof(err));
	if (!st)
		st = events_open(a, m, &g, err, sizeof(err));
	if (st)
		goto refuse;

	memcpy(g.engine_id, id, id_len < sizeof(g.engine_id) ? id_len : sizeof(g.engine_id));
	g.engine_id_len = id_len;
	again = a->reg.ok || a->engine_left;
	if (a->reg.ok && !from_engine(a, id, id_len)) {
		/* its lane first: displaced goes on ZeroMQ, after the lane's
		 * end, which the engine reads first */
		engine_direct_drop(a, a->reg.engine_id, a->reg.engine_id_len);
		tell_displaced(a, a->reg.engine_id, a->reg.engine_id_len);
		/* its engine says so only in its own /health: an engine
		 * started by mistake with this one's --agent took it */
		log_warn("an engine registered while the one before was still "
			 "connected: that one is displaced, and stays "
			 "unregistered until it is started again (two engines "
			 "given this agent's --engine path?)");
	}
	if (a->reg.ok) {
		/* their events go to the connection registering now */
		memcpy(a->reg.engine_id, g.engine_id, sizeof(g.engine_id));
		a->reg.engine_id_len = g.engine_id_len;
		fail_registration_xfers(a, "engine registered again");
	}
	/* off the lane: the registered engine's own connection */
	g.engine_fd = a->engine_msg_fd >= 0 ? a->engine_msg_fd
					    : a->reg.engine_fd;
	registration_retire(a);
	g.ok = true;
	a->reg = g;
	free(sizes);
	log_info("engine registered: %u layers x %u tensors, %u blocks of %llu bytes, %u region(s) of %s",
		 g.layout.layers, g.layout.tensors, g.layout.blocks,
		 (unsigned long long)pdx_kv_layout_block_bytes(&g.layout),
		 g.n_regions, g.cuda ? "GPU memory" : "shared memory");
	/* before any hello: hellos name the staging buffers */
	if (g.cuda && staged_init(a))
		log_warn("no staging buffers: the staged path is unavailable");
	a->engine_left = false;
	if (again)
		renew_instance(a);
	{
		struct pdx_mp_msg ans;

		pdx_mp_msg_init(&ans);
		pdx_mp_msg_str(&ans, "op", "registered");
		pdx_mp_msg_str(&ans, "peer", a->peer_addr);
		/* what it will compare at handshakes: an engine that named a
		 * type and hears none back has an agent before it */
		if (g.kv_dtype[0])
			pdx_mp_msg_str(&ans, "kv_dtype", g.kv_dtype);
		engine_direct_offer(a, id, id_len, &ans);
		engine_reply(a, id, id_len, &ans, "registered");
	}
	return;

refuse:
	registration_release(a, &g);
	free(sizes);
	reply_error(a, id, id_len, "register", NULL, st, "%s", err);
}

static int cmp_u32(const void *x, const void *y)
{
	uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;

	return (a > b) - (a < b);
}

/* Why blocks cannot be this transfer's (a block outside the pool, or one
 * named twice, which would be written twice), in why; 0 when they can. */
static pdx_status_t check_blocks(const struct agent *a, const uint32_t *blocks,
				 size_t n, char *why, size_t whylen)
{
	uint32_t *sorted;

	for (size_t i = 0; i < n; i++) {
		if (blocks[i] >= a->reg.layout.blocks) {
			snprintf(why, whylen, "blocks[%zu]: block %u outside the "
				 "pool (%u blocks)", i, blocks[i],
				 a->reg.layout.blocks);
			return PDX_ERANGE;
		}
	}
	sorted = malloc(n * sizeof(*sorted));
	if (!sorted) {
		snprintf(why, whylen, "out of memory");
		return PDX_ENOMEM;
	}
	memcpy(sorted, blocks, n * sizeof(*sorted));
	qsort(sorted, n, sizeof(*sorted), cmp_u32);
	for (size_t i = 1; i < n; i++) {
		uint32_t twice = sorted[i];
		size_t first = 0, second;

		if (twice != sorted[i - 1])
			continue;
		while (blocks[first] != twice)
			first++;
		second = first + 1;
		while (blocks[second] != twice)
			second++;
		snprintf(why, whylen, "blocks[%zu]: block %u is blocks[%zu] "
			 "again", second, twice, first);
		free(sorted);
		return PDX_EINVAL;
	}
	free(sorted);
	return PDX_OK;
}

/* m's "peer" into peer: a tcp://HOST:PORT an agent may listen at; else
 * false, and why. A wildcard host, or a port of 0 or past 65535, waited
 * out the hello's bound before it failed "no answer to our hello". */
static bool named_peer(const msgpack_object *m, char *peer, size_t len,
		       char *why, size_t whylen)
{
	char detail[PDX_ADDR_MAX + 96] = "no str that fits";

	if (pdx_mp_get_str(m, "peer", peer, len) == 0 &&
	    pdx_tcp_addr_ok(peer, false, detail, sizeof(detail)))
		return true;
	snprintf(why, whylen, "peer: want the peer agent's tcp:// address "
		 "(%s)", detail);
	return false;
}

/* The peer a send or recv names, in peer: "" for an open send, or the
 * agent whose want claimed it already (x). False when it names none,
 * and why. */
static bool announced_peer(const msgpack_object *m, enum xfer_role role,
			   const struct xfer *x, char *peer, size_t len,
			   char *why, size_t whylen)
{
	const msgpack_object *named = pdx_mp_get(m, "peer");

	if (role == XFER_SEND && (!named || named->type == MSGPACK_OBJECT_NIL)) {
		snprintf(peer, len, "%s", x ? x->peer_addr : "");
		return true;
	}
	if (named_peer(m, peer, len, why, whylen))
		return true;
	if (role == XFER_SEND)
		snprintf(why + strlen(why), whylen - strlen(why),
			 " or none: the first to claim it");
	return false;
}

/* An announcement of an id that ended: it fails saying how the id ended.
 * That failure ends the id again, with this reason: said once, not once
 * more for each announcement after. */
static void ended_before(struct xfer *x, const char *ended)
{
	static const char before[] = "ended before this announcement of it: ";

	snprintf(x->peer_abort, sizeof(x->peer_abort), "%s%s",
		 strncmp(ended, before, sizeof(before) - 1) ? before : "",
		 ended);
}

/* The parts send and recv share: id, peer, blocks checked against the
 * registered layout. A send may name no peer (absent or nil): it is open,
 * and the first agent to present its id (want, or a hold in its ping)
 * claims it (docs/security.md); a want that came first is that claim.
 * Every announcement with an id ends in one event:
 * refused before it is a transfer here (not registered on this
 * connection, --max-xfers), it goes to the connection that sent it; a bad
 * field fails the transfer, and its peer is told. A repeated id of a
 * transfer in flight is no announcement: it is answered "error". */
static struct xfer *announce(struct agent *a, const void *eid, size_t eid_len,
			     const msgpack_object *m, enum xfer_role role)
{
	const char *op = role == XFER_SEND ? "send" : "recv";
	const msgpack_object *peers = role == XFER_RECV ? pdx_mp_get(m, "peers")
						       : NULL;
	struct pdx_xfer_id id;
	char peer[PDX_ADDR_MAX] = "", why[PDX_REASON_MAX] = "";
	uint32_t *blocks = NULL;
	size_t n = 0;
	uint64_t timeout = a->cfg.xfer_timeout_ms;
	pdx_status_t st = PDX_EINVAL;
	const char *ended;
	struct xfer *x;

	if (pdx_mp_get_xfer(m, "xfer", &id)) {
		reply_error(a, eid, eid_len, op, NULL, PDX_EINVAL,
			    "xfer: want a bin of 16 bytes");
		return NULL;
	}
	if (!from_engine(a, eid, eid_len)) {
		refuse_announce(a, eid, eid_len, op, &id, PDX_ENOTREG,
				not_registered(a));
		return NULL;
	}
	x = xfer_find(a, &id);
	if (x && (x->announced || x->role != role)) {
		reply_error(a, eid, eid_len, op, &id, PDX_EEXIST,
			    "xfer: this transfer id is in use here (a %s %s)",
			    x->role == XFER_SEND ? "send" : "recv",
			    x->announced ? "in flight"
			    : x->held	 ? "held"
					 : "its peer asked for");
		return NULL;
	}
	if (peers && tp_legs_pick(a, peers, peer, sizeof(peer), why,
				  sizeof(why)) < 0) {
		peer[0] = '\0';
	} else if (!peers && !announced_peer(m, role, x, peer, sizeof(peer),
					     why, sizeof(why))) {
		peer[0] = '\0';
	} else if (pdx_mp_get_u32s(m, "blocks", MAX_BLOCKS, &blocks, &n) ||
		   n == 0) {
		snprintf(why, sizeof(why), "blocks: want an array of 1..%u "
			 "block ids", MAX_BLOCKS);
		free(blocks);
		blocks = NULL;
	} else if (!strcmp(peer, a->peer_addr)) {
		snprintf(why, sizeof(why), "peer: %s is this agent", peer);
		peer[0] = '\0'; /* nobody to tell: not ourselves */
	} else {
		st = check_blocks(a, blocks, n, why, sizeof(why));
	}
	/* 0: --xfer-timeout-ms, as when absent */
	if (!why[0] && pdx_mp_get(m, "timeout_ms") &&
	    (pdx_mp_get_u64(m, "timeout_ms", &timeout) ||
	     timeout > PDX_XFER_TIMEOUT_MAX_MS)) {
		snprintf(why, sizeof(why), "timeout_ms: want 0 to %u ms",
			 PDX_XFER_TIMEOUT_MAX_MS);
		st = PDX_EINVAL;
	}
	if (why[0] || timeout == 0)
		timeout = a->cfg.xfer_timeout_ms;
	if (!x) {
		x = xfer_new(a, &id, role, peer, (uint32_t)timeout);
		if (!x) {
			refuse_announce(a, eid, eid_len, op, &id, PDX_ETOOBIG,
					"this agent holds --max-xfers "
					"transfers already");
			free(blocks);
			return NULL;
		}
	}
	x->announced = true;
	x->timeout_ms = (uint32_t)timeout;
	xfer_begin_phase(x);
	x->t_first_ns = x->t_first_ns ? x->t_first_ns : pdx_now_ns();
	if (why[0]) {
		free(blocks);
		xfer_fail(x, st, true, "%s", why);
		return NULL;
	}
	if (x->peer_addr[0] && peer[0] && strcmp(x->peer_addr, peer) != 0) {
		/* A want arrived first from another agent than the one named
		 * (or our engine held a recv at another; with TP legs, "",
		 * the held one is one of them). */
		peer_send_to_addr(a, x->peer_addr, "error", &id,
				  "transfer is not for this agent");
		snprintf(x->peer_addr, sizeof(x->peer_addr), "%s", peer);
		x->peer = NULL;
		free(x->remote_blocks);
		x->remote_blocks = NULL;
		x->n_remote = 0;
		pdx_xfer_sm_init(&x->sm, a->reg.layout.layers);
	}
	if (role == XFER_SEND && x->sm.layers != a->reg.layout.layers) {
		bool known = x->sm.blocks_known;

		pdx_xfer_sm_init(&x->sm, a->reg.layout.layers);
		if (known)
			pdx_xfer_sm_blocks_known(&x->sm);
	}
	snprintf(x->peer_addr, sizeof(x->peer_addr), "%s", peer);
	x->peer = peer[0] ? peer_get(a, peer) : NULL;
	xfer_arm(x); /* a hello just sent bounds it too */
	/* an open send names no peer: an abort from any agent that knew its
	 * id (the credential) ends it, as one after its announce would */
	if (!x->peer_abort[0] &&
	    (ended = pdx_ended_find(a->ended, &id, peer[0] ? peer : NULL)))
		ended_before(x, ended);
	if (x->peer_abort[0]) {
		free(blocks);
		xfer_fail(x, PDX_ECANCELED, false, "%s", x->peer_abort);
		return NULL;
	}
	if (peer[0] && !x->peer) {
		free(blocks);
		xfer_fail(x, PDX_EPEER, false, "cannot reach %s", peer);
		return NULL;
	}
	x->blocks = blocks;
	x->n_blocks = (uint32_t)n;
	return x;
}

static void on_send(struct agent *a, const void *eid, size_t eid_len,
		    const msgpack_object *m)
{
	struct xfer *x = announce(a, eid, eid_len, m, XFER_SEND);

	if (x && x->tp) /* legs asked for it already */
		tp_legs_announced(x);
	else if (x)
		push_try(x);
}

/* Even with every block held already (skip_tokens), the want goes out:
 * the sender's "done" brings its first token. */
static void on_recv(struct agent *a, const void *eid, size_t eid_len,
		    const msgpack_object *m)
{
	struct xfer *x = announce(a, eid, eid_len, m, XFER_RECV);
	const msgpack_object *peers = pdx_mp_get(m, "peers");
	uint64_t skip_tokens = 0;

	if (!x)
		return;
	if (pdx_mp_get(m, "skip_tokens") &&
	    pdx_mp_get_u64(m, "skip_tokens", &skip_tokens)) {
		xfer_fail(x, PDX_EINVAL, true,
			  "skip_tokens: want an int, 0 or more");
		return;
	}
	/* past its blocks' tokens: the engine lost count (it was taken as
	 * "all held", and the transfer moved nothing) */
	if (skip_tokens > (uint64_t)x->n_blocks * a->reg.layout.block_tokens) {
		xfer_fail(x, PDX_EINVAL, true,
			  "skip_tokens %llu: past its %u blocks' %llu tokens",
			  (unsigned long long)skip_tokens, x->n_blocks,
			  (unsigned long long)x->n_blocks *
			      a->reg.layout.block_tokens);
		return;
	}
	x->skip = (uint32_t)(skip_tokens / a->reg.layout.block_tokens);
	x->pull = a->cfg.pull; /* the engine's "pull", when it says */
	if (pdx_mp_get(m, "pull") && pdx_mp_get_bool(m, "pull", &x->pull)) {
		xfer_fail(x, PDX_EINVAL, true, "pull: want true or false");
		return;
	}
	if (peers && !x->peer_addr[0]) /* TP p != d */
		tp_legs_recv(x, peers);
	else
		xfers_peer_ready(a, x->peer); /* want, if the peer is ready */
}

/* A layer_done naming a transfer not in flight is ignored: one that
 * ended (a batch's late layers) quietly; one its engine has not
 * announced yet is a mistake of order that would end in the layer
 * timeout, so it is said, at most once a second. */
static void early_layer_done(struct agent *a, const struct xfer *x,
			     const struct pdx_xfer_id *id)
{
	char hex[33];

	if ((x && x->finished) || pdx_ended_find(a->ended, id, NULL) ||
	    (x && x->role != XFER_SEND)) {
		log_debug("layer_done for a transfer not in flight: ignored");
		return;
	}
	if (!pdx_once_a_second(&a->early_layer_done_ns))
		return;
	pdx_xfer_id_hex(id, hex);
	log_warn("layer_done for transfer %s, which its engine has not "
		 "announced (no send yet, or its send was refused): not "
		 "counted; send before layer_done",
		 hex);
}

static void on_layer_done(struct agent *a, const void *eid, size_t eid_len,
			  const msgpack_object *m)
{
	const msgpack_object *xs = pdx_mp_get(m, "xfers");
	uint64_t layer, slot;
	bool bad_slot = false, no_wait = false;

	if (pdx_mp_get_u64(m, "layer", &layer)) {
		reply_error(a, eid, eid_len, "layer_done", NULL, PDX_EINVAL,
			    "layer: want the layer's number (an int)");
		return;
	}
	if (!xs || xs->type != MSGPACK_OBJECT_ARRAY) {
		reply_error(a, eid, eid_len, "layer_done", NULL, PDX_EINVAL,
			    "xfers: want an array of 16-byte transfer ids");
		return;
	}
	log_debug("layer %llu done", (unsigned long long)layer);
	/* before any copy of this layer is queued on our stream */
	if (pdx_mp_get_u64(m, "slot", &slot) == 0 &&
	    layer < a->reg.layout.layers) {
		if (slot >= a->reg.event_slots)
			bad_slot = true; /* its transfers fail below */
		else
			no_wait = gpu_layer_computed(a, (uint32_t)layer,
						     (uint32_t)slot) != PDX_OK;
	}
	for (uint32_t i = 0; i < xs->via.array.size; i++) {
		struct pdx_xfer_id id;
		struct xfer *x;

		if (pdx_mp_obj_xfer(&xs->via.array.ptr[i], &id)) {
			reply_error(a, eid, eid_len, "layer_done", NULL,
				    PDX_EINVAL, "xfers[%u]: want a bin of 16 "
				    "bytes", i);
			continue;
		}
		x = xfer_find(a, &id);
		if (!x || x->role != XFER_SEND || !x->announced || x->finished) {
			early_layer_done(a, x, &id);
			continue;
		}
		if (bad_slot) {
			xfer_fail(x, PDX_EINVAL, true,
				  "layer_done slot %llu: the engine registered %u event slots",
				  (unsigned long long)slot, a->reg.event_slots);
			continue;
		}
		if (no_wait) {
			xfer_fail(x, PDX_EIO, true,
				  "layer %llu: cannot wait for its CUDA event "
				  "(slot %llu)", (unsigned long long)layer,
				  (unsigned long long)slot);
			continue;
		}
		if (pdx_xfer_sm_computed(&x->sm, (uint32_t)(layer > UINT32_MAX ? UINT32_MAX : layer))) {
			xfer_fail(x, PDX_ERANGE, true, "layer %llu out of range (%u layers)",
				  (unsigned long long)layer, x->sm.layers);
			continue;
		}
		x->progress_ns = pdx_now_ns();
		xfer_mark(x, MARK_LAYER_DONE);
		if (x->tp)
			tp_legs_layer_done(x, (uint32_t)layer);
		else
			push_try(x);
	}
}

/* The prefill's first token for a transfer: carried in "done", so the
 * decode side starts from it without reading the KV first. */
static void on_token(struct agent *a, const void *eid, size_t eid_len,
		     const msgpack_object *m)
{
	struct pdx_xfer_id id;
	uint64_t token;
	struct xfer *x;

	if (pdx_mp_get_xfer(m, "xfer", &id)) {
		reply_error(a, eid, eid_len, "token", NULL, PDX_EINVAL,
			    "xfer: want a bin of 16 bytes");
		return;
	}
	if (pdx_mp_get_u64(m, "token", &token) || token > UINT32_MAX) {
		reply_error(a, eid, eid_len, "token", &id, PDX_EINVAL,
			    "token: want a token id, an int 0..2^32-1");
		return;
	}
	x = xfer_find(a, &id);
	if (x && x->role == XFER_SEND && x->announced && !x->finished) {
		x->first_token = (int64_t)token;
		if (x->tp)
			tp_legs_beside(x);
	}
}

/* The engine's bytes beside the KV for a transfer (SGLang's auxiliary
 * rows): carried in "done", handed to the decode engine with "received". */
static void on_meta(struct agent *a, const void *eid, size_t eid_len,
		    const msgpack_object *m)
{
	struct pdx_xfer_id id;
	const void *data;
	struct xfer *x;
	size_t len;

	if (pdx_mp_get_xfer(m, "xfer", &id)) {
		reply_error(a, eid, eid_len, "meta", NULL, PDX_EINVAL,
			    "xfer: want a bin of 16 bytes");
		return;
	}
	if (pdx_mp_get_bin(m, "data", &data, &len) || len > PDX_META_MAX) {
		reply_error(a, eid, eid_len, "meta", &id, PDX_EINVAL,
			    "data: want a bin of at most %d bytes",
			    PDX_META_MAX);
		return;
	}
	x = xfer_find(a, &id);
	if (!x || x->role != XFER_SEND || !x->announced || x->finished)
		return;
	if (xfer_set_meta(x, data, len))
		xfer_fail(x, PDX_ENOMEM, true, "out of memory for %zu bytes "
			  "of meta", len);
	else if (x->tp)
		tp_legs_beside(x);
}

/* Decode side: our engine queued a request whose KV the peer holds. Until
 * the engine announces it (recv) or aborts it, our heartbeats renew the
 * sender's lease, bounded by the transfer timeout; the handshake starts
 * now, while the request waits. */
/* A hold of x with another sender than x->peer: its lease is renewed by
 * our pings to that one too (liveness.c). Before, only the first
 * sender's was, and with prefill ranks of another TP size the others'
 * KV expired while the request queued. */
static void hold_also(struct agent *a, struct xfer *x, const char *addr)
{
	struct peer *p, **grown;

	if (x->role != XFER_RECV || !x->held || x->announced || x->finished ||
	    !strcmp(x->peer_addr, addr))
		return;
	p = peer_get(a, addr);
	for (uint32_t i = 0; p && i < x->n_held_also; i++)
		if (x->held_also[i] == p)
			return;
	grown = p ? realloc(x->held_also,
			    (x->n_held_also + 1) * sizeof(*grown))
		  : NULL;
	if (!grown)
		return; /* that sender's lease runs as it would unheld */
	grown[x->n_held_also++] = p;
	x->held_also = grown;
}

static void on_hold(struct agent *a, const void *eid, size_t eid_len,
		    const msgpack_object *m)
{
	char peer[PDX_ADDR_MAX], why[PDX_REASON_MAX];
	struct pdx_xfer_id id;
	struct xfer *x;

	if (pdx_mp_get_xfer(m, "xfer", &id)) {
		reply_error(a, eid, eid_len, "hold", NULL, PDX_EINVAL,
			    "xfer: want a bin of 16 bytes");
		return;
	}
	if (!named_peer(m, peer, sizeof(peer), why, sizeof(why))) {
		reply_error(a, eid, eid_len, "hold", &id, PDX_EINVAL, "%s",
			    why);
		/* libpdx makes the refusal of a hold of one held, not yet
		 * announced, its failed event: it ends here too, not left
		 * holding the other senders' KV until its bound */
		x = xfer_find(a, &id);
		if (x && x->held && !x->announced && !x->finished)
			xfer_fail(x, PDX_EINVAL, true, "%s", why);
		return;
	}
	x = xfer_find(a, &id);
	if (x) { /* known already: held with one more sender, maybe */
		hold_also(a, x, peer);
		return;
	}
	x = xfer_new(a, &id, XFER_RECV, peer, a->cfg.xfer_timeout_ms);
	if (!x)
		return;
	x->held = true;
	x->peer = peer_get(a, peer);
	if (!x->peer)
		xfer_fail(x, PDX_EPEER, false, "cannot reach %s", peer);
	else
		xfer_arm(x); /* the hello just sent bounds it too */
}

static void on_abort(struct agent *a, const void *eid, size_t eid_len,
		     const msgpack_object *m)
{
	char peer[PDX_ADDR_MAX], why[PDX_REASON_MAX];
	struct pdx_xfer_id id;
	struct xfer *x;

	if (pdx_mp_get_xfer(m, "xfer", &id)) {
		reply_error(a, eid, eid_len, "abort", NULL, PDX_EINVAL,
			    "xfer: want a bin of 16 bytes");
		return;
	}
	x = xfer_find(a, &id);
	if (x && (x->announced || x->held)) {
		if (!x->finished)
			xfer_fail(x, PDX_ECANCELED, true, "aborted by engine%s",
				  x->announced ? "" : " while it queued it");
		return;
	}
	if (x && !x->finished) {
		/* a peer's want for a send our engine never announced, and
		 * now never will: the receiver hears at once */
		xfer_fail(x, PDX_ECANCELED, true,
			  "aborted by its engine before it began");
		return;
	}
	/* a want that comes later is answered that it ended */
	pdx_ended_add(a->ended, &id, "", "aborted by its engine before it began");
	if (!pdx_mp_get(m, "peer"))
		return; /* nothing here to abort, and no peer named */
	/* never announced here: the peer that waits for it is told */
	if (!named_peer(m, peer, sizeof(peer), why, sizeof(why))) {
		reply_error(a, eid, eid_len, "abort", &id, PDX_EINVAL, "%s",
			    why);
		return;
	}
	peer_send_to_addr(a, peer, "abort", &id,
			  "aborted by its engine before it began");
}

/* A bare round trip through our loop, answered on any connection: the
 * yardstick of pdx-xferbench --one-block. "seq" comes back as sent. */
static void on_ping(struct agent *a, const void *eid, size_t eid_len,
		    const msgpack_object *m)
{
	struct pdx_mp_out o;
	int64_t seq = 0;

	pdx_mp_get_i64(m, "seq", &seq);
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, 2);
	pdx_mp_kv_str(&o.pk, "op", "pong");
	pdx_mp_kv_i64(&o.pk, "seq", seq);
	engine_send_frame(a, eid, eid_len, o.buf.data, o.buf.size);
	pdx_mp_out_free(&o);
}

void engine_on_msg(struct agent *a, const void *id, size_t id_len,
		   const void *buf, size_t len)
{
	msgpack_unpacked msg;
	const msgpack_object *m;
	char op[32];

	if (pdx_mp_parse(buf, len, &msg, op, sizeof(op))) {
		reply_error(a, id, id_len, "", NULL, PDX_EINVAL,
			    "malformed message (%zu bytes): want a msgpack "
			    "map with op (a str)", len);
		msgpack_unpacked_destroy(&msg);
		return;
	}
	m = &msg.data;
	if (strcmp(op, "ping") == 0) {
		on_ping(a, id, id_len, m);
	} else if (strcmp(op, "register") == 0) {
		on_register(a, id, id_len, m);
	} else if (strcmp(op, "send") == 0) {
		on_send(a, id, id_len, m);
	} else if (strcmp(op, "recv") == 0) {
		on_recv(a, id, id_len, m);
	} else if (strcmp(op, "hold") != 0 && strcmp(op, "layer_done") != 0 &&
		   strcmp(op, "token") != 0 && strcmp(op, "meta") != 0 &&
		   strcmp(op, "abort") != 0 && strcmp(op, "direct") != 0) {
		reply_error(a, id, id_len, op, NULL, PDX_EINVAL,
			    "op: \"%s\" is unknown", op);
	} else if (!from_engine(a, id, id_len)) {
		struct pdx_xfer_id x;
		bool named = pdx_mp_get_xfer(m, "xfer", &x) == 0;

		reply_error(a, id, id_len, op, named ? &x : NULL, PDX_ENOTREG,
			    "%s", not_registered(a));
	} else if (strcmp(op, "direct") == 0) {
		engine_direct_marker(a, id, id_len);
	} else if (strcmp(op, "hold") == 0) {
		on_hold(a, id, id_len, m);
	} else if (strcmp(op, "layer_done") == 0) {
		on_layer_done(a, id, id_len, m);
	} else if (strcmp(op, "token") == 0) {
		on_token(a, id, id_len, m);
	} else if (strcmp(op, "meta") == 0) {
		on_meta(a, id, id_len, m);
	} else {
		on_abort(a, id, id_len, m);
	}
	msgpack_unpacked_destroy(&msg);
}
