/* The agent harness of the fuzz targets (agent_harness.h): stubs for what
 * agent/main.c, ZeroMQ and transport/ucx.c provide, and the record loop. */
#define _GNU_SOURCE
#include "tests/fuzz/agent_harness.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <utlist.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/layout_mp.h"
#include "common/log.h"
#include "common/mp.h"

#define MAX_OPS 4096
#define ENGINE_ID "engine-1"

static struct agent *cur; /* the agent being fuzzed */

static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "agent harness: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	abort();
}

/* ---- ZeroMQ: sockets that go nowhere ---- */

static int live_sockets;

void *zmq_socket(void *ctx, int type)
{
	live_sockets++;
	return malloc(1);
}

int zmq_close(void *s)
{
	if (s) {
		live_sockets--;
		free(s);
	}
	return 0;
}

int zmq_setsockopt(void *s, int opt, const void *v, size_t len)
{
	return 0;
}

int zmq_connect(void *s, const char *addr)
{
	/* as libzmq: tcp://HOST:PORT, else EINVAL */
	const char *colon = strrchr(addr, ':');

	if (strncmp(addr, "tcp://", 6) != 0 || !colon || colon < addr + 7 ||
	    !colon[1]) {
		errno = EINVAL;
		return -1;
	}
	return 0;
}

/* What the agent sends must be one msgpack map with an op. */
static void check_frame(const void *buf, size_t len)
{
	msgpack_unpacked msg;
	char op[32];

	if (pdx_mp_parse(buf, len, &msg, op, sizeof(op)))
		die("the agent sent a malformed frame (%zu bytes)", len);
	msgpack_unpacked_destroy(&msg);
}

int zmq_send(void *s, const void *buf, size_t len, int flags)
{
	if (!(flags & ZMQ_SNDMORE))
		check_frame(buf, len);
	return (int)len;
}

int zmq_errno(void)
{
	return errno;
}

const char *zmq_strerror(int e)
{
	return strerror(e);
}

/* ---- agent/curve.c: the harness's agents run without CURVE ---- */

int pdx_curve_client(struct pdx_curve *c, void *sock, const char *addr)
{
	(void)c;
	(void)sock;
	(void)addr;
	die("pdx_curve_client without CURVE");
	return -1;
}

/* ---- agent/main.c ---- */

int agent_zsend(void *sock, const void *id, size_t id_len, const void *buf,
		size_t len)
{
	if (!sock)
		die("agent_zsend on no socket");
	check_frame(buf, len);
	return 0;
}

static void progress(void);

void agent_settle(struct agent *a)
{
	a->turn_ns = pdx_now_ns(); /* as main.c's */
	progress();
	xfers_reap(a);
}

/* main.c's outcome interface, with the harness's settle. */
static const struct xfer_ops xfer_ops = {
	.engine_event = engine_send_event,
	.notify = notify_xfer,
	.tell_peer = peer_send_to_addr,
	.legs_decided = tp_legs_decided,
};

/* ---- shared memory: /fuzz... names are private memfds ---- */

int shm_open(const char *name, int oflag, mode_t mode)
{
	int fd;

	if (strncmp(name, "/fuzz", 5) != 0) {
		errno = ENOENT;
		return -1;
	}
	fd = memfd_create("pdx-fuzz", MFD_CLOEXEC);
	if (fd < 0)
		die("memfd_create: %s", strerror(errno));
	if (ftruncate(fd, FA_SHM_BYTES))
		die("ftruncate: %s", strerror(errno));
	return fd;
}

/* ---- UCX ---- */

struct pdx_ucx_mem {
	void *addr;
	size_t len;
};

struct pdx_ucx_ep {
	pdx_ucx_ep_error_cb err_cb;
	void *arg;
	bool failed;
	struct pdx_ucx_ep *next;
};

struct pdx_ucx_rkey {
	char tag;
};

struct op {
	pdx_ucx_done_cb cb;
	void *arg;
	struct pdx_ucx_ep *ep; /* NULL once closed: completes canceled */
	pdx_status_t status;
};

static struct op ops[MAX_OPS];
static size_t n_ops;
static struct pdx_ucx_ep *eps;
static int live_mem, live_rkey_bufs, live_rkeys;
static const uint8_t ucx_addr[] = "fuzz-worker-address";

static pdx_status_t op_add(struct pdx_ucx_ep *ep, pdx_ucx_done_cb cb, void *arg)
{
	if (ep && ep->failed)
		return PDX_EPEER;
	if (n_ops == MAX_OPS)
		die("more than %d transport operations pending", MAX_OPS);
	ops[n_ops++] = (struct op){cb, arg, ep, PDX_OK};
	return PDX_OK;
}

/* Completes pending operations in order, as pdx_ucx_progress() does;
 * completions may start more. */
static void progress(void)
{
	size_t done = 0;

	while (n_ops) {
		struct op o = ops[0];

		memmove(ops, ops + 1, --n_ops * sizeof(ops[0]));
		if (++done > 100000)
			die("transport operations never settle");
		if (o.ep && o.ep->failed)
			o.status = PDX_EPEER;
		o.cb(o.arg, o.status);
	}
}

/* [p, p + len) must lie inside one region of the registration. */
static void check_local(const void *p, size_t len, const char *what)
{
	const struct registration *g = &cur->reg;
	const uint8_t *b = p;

	if (!g->ok)
		die("%s with no engine registered", what);
	for (uint32_t i = 0; i < g->n_regions; i++) {
		const uint8_t *r = g->regions[i].addr;

		if (b >= r && len <= g->regions[i].size &&
		    (size_t)(b - r) <= g->regions[i].size - len)
			return;
	}
	die("%s of %zu bytes outside the registered regions", what, len);
}

/* [addr, addr + len) must lie inside the peer region rkey came with. */
static void check_remote(const struct pdx_ucx_rkey *rkey, uint64_t addr,
			 size_t len)
{
	struct peer *p, *tmp;

	HASH_ITER(hh, cur->peers, p, tmp)
	{
		for (uint32_t i = 0; i < p->n_regions; i++) {
			const struct remote_region *r = &p->regions[i];

			if (r->rkey != rkey)
				continue;
			if (addr < r->addr || len > r->size ||
			    addr - r->addr > r->size - len)
				die("put of %zu bytes outside the peer's "
				    "region",
				    len);
			return;
		}
	}
	die("put with an rkey no peer gave");
}

void pdx_ucx_address(const struct pdx_ucx *u, const void **addr, size_t *len)
{
	*addr = ucx_addr;
	*len = sizeof(ucx_addr);
}

pdx_status_t pdx_ucx_mem_register(struct pdx_ucx *u, void *addr, size_t len,
				  struct pdx_ucx_mem **out)
{
	struct pdx_ucx_mem *m = malloc(sizeof(*m));

	if (!m)
		return PDX_ENOMEM;
	m->addr = addr;
	m->len = len;
	live_mem++;
	*out = m;
	return PDX_OK;
}

/* UCX_TLS unset here: every transport, shared memory too */
bool pdx_ucx_tls_lets_in(const char *const *names)
{
	(void)names;
	return true;
}

/* No UCX with CUDA here: GPU memory is never registered. */
bool pdx_ucx_has_cuda(struct pdx_ucx *u)
{
	return false;
}

pdx_status_t pdx_ucx_mem_register_type(struct pdx_ucx *u, void *addr,
				       size_t len, bool cuda,
				       struct pdx_ucx_mem **out)
{
	if (cuda)
		die("GPU memory registered with a UCX without CUDA");
	return pdx_ucx_mem_register(u, addr, len, out);
}

void pdx_ucx_mem_free(struct pdx_ucx *u, struct pdx_ucx_mem *m)
{
	if (m) {
		live_mem--;
		free(m);
	}
}

pdx_status_t pdx_ucx_mem_rkey(struct pdx_ucx *u, struct pdx_ucx_mem *m,
			      void **buf, size_t *len)
{
	*buf = strdup("rkey");
	if (!*buf)
		return PDX_ENOMEM;
	*len = 5;
	live_rkey_bufs++;
	return PDX_OK;
}

void pdx_ucx_rkey_buf_free(void *buf)
{
	if (buf) {
		live_rkey_bufs--;
		free(buf);
	}
}

pdx_status_t pdx_ucx_ep_new(struct pdx_ucx *u, const void *addr, size_t len,
			    bool peer_errors, pdx_ucx_ep_error_cb err_cb,
			    void *arg, struct pdx_ucx_ep **out)
{
	struct pdx_ucx_ep *ep;

	if (len == 0)
		return PDX_EINVAL;
	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return PDX_ENOMEM;
	ep->err_cb = err_cb;
	ep->arg = arg;
	ep->next = eps;
	eps = ep;
	*out = ep;
	return PDX_OK;
}

/* Every endpoint here is the first to its worker: a hello's number
 * above it is followed (within PDX_UCX_SKIP_MAX), as the real one does. */
uint32_t pdx_ucx_ep_sn(struct pdx_ucx *u, const void *addr, size_t len)
{
	(void)u, (void)addr, (void)len;
	return 0;
}

pdx_status_t pdx_ucx_ep_skip_to(struct pdx_ucx *u, const void *addr,
				size_t len, uint32_t sn)
{
	(void)u, (void)addr;
	return len == 0 || sn > PDX_UCX_SKIP_MAX ? PDX_EINVAL : PDX_OK;
}

bool pdx_ucx_ep_reports_errors(const struct pdx_ucx_ep *ep)
{
	(void)ep;
	return true;
}

bool pdx_ucx_ep_same(const struct pdx_ucx_ep *a, const struct pdx_ucx_ep *b)
{
	return a == b;
}

void pdx_ucx_ep_mute(struct pdx_ucx_ep *ep)
{
	if (ep)
		ep->err_cb = NULL;
}

void pdx_ucx_ep_close(struct pdx_ucx_ep *ep)
{
	struct pdx_ucx_ep **pp;

	if (!ep)
		return;
	for (size_t i = 0; i < n_ops; i++) {
		if (ops[i].ep == ep) {
			ops[i].ep = NULL;
			ops[i].status = PDX_ECANCELED;
		}
	}
	for (pp = &eps; *pp != ep; pp = &(*pp)->next)
		;
	*pp = ep->next;
	free(ep);
}

void pdx_ucx_ep_cut(struct pdx_ucx_ep *ep)
{
	pdx_ucx_ep_close(ep);
}

pdx_status_t pdx_ucx_rkey_unpack(struct pdx_ucx_ep *ep, const void *buf,
				 size_t len, struct pdx_ucx_rkey **out)
{
	if (len == 0)
		return PDX_EINVAL;
	*out = malloc(sizeof(**out));
	if (!*out)
		return PDX_ENOMEM;
	live_rkeys++;
	return PDX_OK;
}

void pdx_ucx_rkey_free(struct pdx_ucx_rkey *rk)
{
	if (rk) {
		live_rkeys--;
		free(rk);
	}
}

pdx_status_t pdx_ucx_put(struct pdx_ucx_ep *ep, const void *src, size_t len,
			 struct pdx_ucx_mem *src_mem, uint64_t remote_addr,
			 struct pdx_ucx_rkey *rkey, pdx_ucx_done_cb cb,
			 void *arg)
{
	check_local(src, len, "put source");
	if (!src_mem || (const uint8_t *)src < (uint8_t *)src_mem->addr ||
	    (size_t)((const uint8_t *)src - (uint8_t *)src_mem->addr) + len >
		src_mem->len)
		die("put source outside its memory handle");
	check_remote(rkey, remote_addr, len);
	return op_add(ep, cb, arg);
}

pdx_status_t pdx_ucx_get(struct pdx_ucx_ep *ep, void *dst, size_t len,
			 struct pdx_ucx_mem *dst_mem, uint64_t remote_addr,
			 struct pdx_ucx_rkey *rkey, pdx_ucx_done_cb cb,
			 void *arg)
{
	struct slice_buf *b;

	if (!dst_mem) { /* a pull's buffer of whole blocks (pull.c) */
		DL_FOREACH(cur->slices.live, b)
			if ((uint8_t *)dst >= b->bytes &&
			    (size_t)((uint8_t *)dst - b->bytes) + len <= b->cap)
				break;
		if (!b)
			die("get of %zu bytes into no registered memory nor "
			    "slice buffer", len);
		check_remote(rkey, remote_addr, len);
		return op_add(ep, cb, arg);
	}
	check_local(dst, len, "get destination");
	if ((uint8_t *)dst < (uint8_t *)dst_mem->addr ||
	    (size_t)((uint8_t *)dst - (uint8_t *)dst_mem->addr) + len >
		dst_mem->len)
		die("get destination outside its memory handle");
	check_remote(rkey, remote_addr, len);
	return op_add(ep, cb, arg);
}

/* Where an unregistered source is read to (grown as needed). */
static void *am_scratch(size_t len)
{
	static uint8_t *buf;
	static size_t cap;

	if (len > cap) {
		free(buf);
		buf = malloc(len);
		if (!buf)
			die("out of memory");
		cap = len;
	}
	return buf;
}

pdx_status_t pdx_ucx_am_send(struct pdx_ucx_ep *ep, unsigned id,
			     const void *hdr, size_t hdr_len, const void *src,
			     size_t len, struct pdx_ucx_mem *src_mem,
			     pdx_ucx_done_cb cb, void *arg)
{
	if (hdr_len > PDX_UCX_AM_HDR_MAX)
		die("active-message header of %zu bytes", hdr_len);
	if (src_mem) /* a registered source lies in its region */
		check_local(src, len, "active-message source");
	else if (len) /* any other is read whole (ASan: inside its buffer) */
		memcpy(am_scratch(len), src, len);
	return op_add(ep, cb, arg);
}

pdx_status_t pdx_ucx_am_send_eager(struct pdx_ucx_ep *ep, unsigned id,
				   const void *hdr, size_t hdr_len,
				   const void *src, size_t len,
				   pdx_ucx_done_cb cb, void *arg)
{
	if (hdr_len > PDX_UCX_AM_HDR_MAX)
		die("active-message header of %zu bytes", hdr_len);
	if (len && !src)
		die("active-message payload of %zu bytes at NULL", len);
	if (len) /* copied by the call (ASan: inside its buffer) */
		memcpy(am_scratch(len), src, len);
	return op_add(ep, cb, arg);
}

pdx_status_t pdx_ucx_am_send_rndv(struct pdx_ucx_ep *ep, unsigned id,
				  const void *hdr, size_t hdr_len,
				  const void *src, size_t len,
				  struct pdx_ucx_mem *src_mem,
				  pdx_ucx_done_cb cb, void *arg)
{
	return pdx_ucx_am_send(ep, id, hdr, hdr_len, src, len, src_mem, cb,
			       arg);
}

pdx_status_t pdx_ucx_flush(struct pdx_ucx_ep *ep, pdx_ucx_done_cb cb, void *arg)
{
	return op_add(ep, cb, arg);
}

/* The handlers push_am_register() sets, by active-message id. */
static pdx_ucx_am_cb am_handlers[8];

pdx_status_t pdx_ucx_am_handler(struct pdx_ucx *u, unsigned id,
				pdx_ucx_am_cb cb, void *arg)
{
	if (id >= 8)
		return PDX_EINVAL;
	if (am_handlers[id] && am_handlers[id] != cb)
		die("two handlers for active-message id %u", id);
	am_handlers[id] = cb;
	return PDX_OK;
}

/* A rendezvous descriptor: the payload of the record that delivered it. */
struct rndv {
	const uint8_t *data;
	size_t len;
	bool taken;
};

pdx_status_t pdx_ucx_am_recv(struct pdx_ucx *u, void *desc, void *dst,
			     size_t len, pdx_ucx_done_cb cb, void *arg)
{
	struct rndv *r = desc;

	if (r->taken || len != r->len)
		die("rendezvous descriptor used twice or with another length");
	r->taken = true;
	/* into the blocks, or a buffer of the receiver's (ASan checks it) */
	memcpy(dst, r->data, len);
	return op_add(NULL, cb, arg);
}

void pdx_ucx_am_drop(struct pdx_ucx *u, void *desc)
{
	struct rndv *r = desc;

	if (r->taken)
		die("rendezvous descriptor dropped after use");
	r->taken = true;
}

/* ---- the agent ---- */

void fa_layout(struct pdx_kv_layout *l)
{
	static struct pdx_kv_layer layer[4];

	*l = (struct pdx_kv_layout){.layers = 4,
				    .tensors = 2,
				    .blocks = 64,
				    .block_tokens = 4,
				    .kv_heads = 2,
				    .head_dim = 4,
				    .dtype_bytes = 2,
				    .order = PDX_KV_NHD,
				    .layer = layer};
	for (uint32_t i = 0; i < 4; i++) {
		layer[i].block_stride = 64;
		for (uint32_t t = 0; t < 2; t++)
			layer[i].base[t] =
			    (struct pdx_kv_ref){0, (i * 2 + t) * 64 * 64};
	}
}

void fa_init(struct agent *a, uint8_t cfg)
{
	static struct event_base *base;
	static const enum data_path path[4] = {DATA_AUTO, DATA_IPC, DATA_PUT,
					       DATA_AM};

	if (!base) {
		/* PDX_FUZZ_LOG=debug shows what an input does */
		pdx_log_level = PDX_LOG_ERROR;
		if (getenv("PDX_FUZZ_LOG"))
			pdx_log_set_level(getenv("PDX_FUZZ_LOG"));
		base = event_base_new();
		if (!base)
			die("event_base_new");
	}
	memset(a, 0, sizeof(*a));
	a->cfg = agent_config_defaults();
	a->xfer_ops = &xfer_ops;
	a->settle = agent_settle;
	a->cfg.max_xfers = 64;
	a->cfg.data_path = path[cfg & 3];
	a->base = base;
	a->ended = pdx_ended_new(a->cfg.max_xfers);
	if (!a->ended)
		die("out of memory");
	a->engine_sock = &a->engine_sock; /* never read: agent_zsend is ours */
	a->instance = 1;
	snprintf(a->peer_addr, sizeof(a->peer_addr), "%s", FA_SELF);
	snprintf(a->host_id, sizeof(a->host_id), "%s", FA_HOST);
	if (push_am_register(a) || !am_handlers[AM_RUN] ||
	    !am_handlers[AM_SLICE])
		die("no handler for the am path's messages");
	cur = a;
}

void fa_free(struct agent *a)
{
	progress();
	slice_bufs_stop(a);
	xfers_free(a);
	pdx_ended_free(a->ended);
	peers_free(a);
	registration_clear(a);
	progress();
	xfers_reap(a);
	slice_bufs_free(a);
	if (n_ops || eps || live_sockets || live_mem || live_rkey_bufs ||
	    live_rkeys)
		die("left over: %zu operations, %s endpoint, %d sockets, %d "
		    "memory handles, %d rkey buffers, %d rkeys",
		    n_ops, eps ? "an" : "no", live_sockets, live_mem,
		    live_rkey_bufs, live_rkeys);
	cur = NULL;
}

static void engine_frame(struct agent *a, struct pdx_mp_out *o)
{
	engine_on_msg(a, ENGINE_ID, strlen(ENGINE_ID), o->buf.data,
		      o->buf.size);
	pdx_mp_out_free(o);
	agent_settle(a);
}

void fa_register(struct agent *a)
{
	struct pdx_kv_layout l;
	struct pdx_mp_out o;

	fa_layout(&l);
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, 4);
	pdx_mp_kv_str(&o.pk, "op", "register");
	pdx_mp_kv_u64(&o.pk, "v", 1);
	pdx_mp_str(&o.pk, "layout");
	pdx_layout_pack(&o.pk, &l);
	pdx_mp_str(&o.pk, "regions");
	msgpack_pack_array(&o.pk, 1);
	msgpack_pack_map(&o.pk, 3);
	pdx_mp_kv_str(&o.pk, "type", "shm");
	pdx_mp_kv_str(&o.pk, "name", "/fuzz-kv");
	pdx_mp_kv_u64(&o.pk, "size", 4 * 2 * 64 * 64);
	engine_frame(a, &o);
	if (!a->reg.ok)
		die("the harness's register was refused");
}

void fa_hello(struct agent *a)
{
	struct pdx_kv_layout l;
	struct pdx_mp_out o;
	struct peer *p;

	fa_layout(&l);
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, 11);
	pdx_mp_kv_str(&o.pk, "op", "hello");
	pdx_mp_kv_str(&o.pk, "from", FA_PEER);
	pdx_mp_str(&o.pk, "stops"); /* it is answered "stopped" */
	msgpack_pack_true(&o.pk);
	pdx_mp_kv_u64(&o.pk, "v", PEER_PROTOCOL_VERSION);
	pdx_mp_kv_u64(&o.pk, "instance", 7);
	pdx_mp_kv_str(&o.pk, "host", FA_HOST);
	pdx_mp_str(&o.pk, "shm");
	msgpack_pack_true(&o.pk);
	pdx_mp_kv_u64(&o.pk, "compat", pdx_kv_layout_compat_hash(&l));
	pdx_mp_str(&o.pk, "layout");
	pdx_layout_pack(&o.pk, &l);
	pdx_mp_kv_bin(&o.pk, "ucx", "addr", 4);
	pdx_mp_str(&o.pk, "regions");
	msgpack_pack_array(&o.pk, 1);
	msgpack_pack_map(&o.pk, 4);
	pdx_mp_kv_str(&o.pk, "name", "/fuzz-peer");
	pdx_mp_kv_u64(&o.pk, "addr", 0x100000);
	pdx_mp_kv_u64(&o.pk, "size", 4 * 2 * 64 * 64);
	pdx_mp_kv_bin(&o.pk, "rkey", "rk", 2);
	peer_on_msg(a, o.buf.data, o.buf.size, NULL);
	pdx_mp_out_free(&o);
	agent_settle(a);
	HASH_FIND_STR(a->peers, FA_PEER, p);
	if (!p || p->state != PEER_READY)
		die("the harness's hello was refused");
}

/* A data message of kind id (AM_RUN or AM_SLICE), its first 24 bytes the
 * header. */
static void am_deliver(struct agent *a, unsigned id, const uint8_t *p,
		       size_t n, bool rndv)
{
	size_t hdr_len = n < 24 ? n : 24;
	struct rndv r = {p + hdr_len, n - hdr_len, false};

	/* the handler may write into the payload when eager; give it a copy */
	if (rndv) {
		am_handlers[id](a, p, hdr_len, &r, r.len, true);
		return;
	}
	{
		uint8_t *copy = malloc(r.len ? r.len : 1);

		if (!copy)
			die("out of memory");
		memcpy(copy, r.data, r.len);
		am_handlers[id](a, p, hdr_len, copy, r.len, false);
		free(copy);
	}
}

static void fire_timers(struct agent *a)
{
	struct xfer *x, *tmp;

	HASH_ITER(hh, a->xfers, x, tmp)
	{
		if (!x->finished)
			event_active(x->timer, EV_TIMEOUT, 1);
	}
	event_base_loop(a->base, EVLOOP_NONBLOCK);
}

static void fail_endpoints(void)
{
	for (struct pdx_ucx_ep *ep = eps; ep; ep = ep->next) {
		if (!ep->failed) {
			ep->failed = true;
			ep->err_cb(ep->arg, PDX_EPEER);
		}
	}
}

void fa_feed(struct agent *a, const uint8_t *data, size_t size)
{
	while (size >= 3) {
		uint8_t ch = data[0] % 6;
		size_t n = (size_t)data[1] | (size_t)data[2] << 8;
		uint8_t *frame;

		data += 3;
		size -= 3;
		n = n < size ? n : size;
		/* an exact copy, so an over-read of the frame is caught */
		frame = malloc(n ? n : 1);
		if (!frame)
			die("out of memory");
		memcpy(frame, data, n);
		/* a turn of main.c's loop begins (xfer_yield's budget) */
		a->turn_ns = pdx_now_ns();
		switch (ch) {
		case 0:
			engine_on_msg(a, ENGINE_ID, strlen(ENGINE_ID), frame,
				      n);
			break;
		case 1:
			peer_on_msg(a, frame, n, NULL);
			break;
		case 2:
		case 3:
			/* the channel byte's top bit: a TP leg's slice */
			am_deliver(a, data[-3] & 0x80 ? AM_SLICE : AM_RUN,
				   frame, n, ch == 3);
			break;
		case 4:
			fire_timers(a);
			break;
		default:
			fail_endpoints();
		}
		free(frame);
		agent_settle(a);
		data += n;
		size -= n;
	}
}
