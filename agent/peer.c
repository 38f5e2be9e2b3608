/* The peer link: one DEALER per peer for what we send, our ROUTER for what
 * they send; the handshake and its cache; want, done, abort and error.
 * See docs/protocol.md section 2. */
#define PDX_LOG_TOPIC "peer"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/layout_mp.h"
#include "common/log.h"
#include "common/prefault.h"
#include "common/mp.h"

#define MAX_BLOCKS (1u << 20)

void peer_reset(struct agent *a, struct peer *p)
{
	for (uint32_t i = 0; i < p->n_regions; i++) {
		pdx_ucx_rkey_free(p->regions[i].rkey);
		if (p->regions[i].map)
			munmap(p->regions[i].map, p->regions[i].size);
		if (p->regions[i].dptr)
			gpu_mem_close(p->agent->gpu, p->regions[i].dptr);
	}
	free(p->regions);
	p->regions = NULL;
	p->n_regions = 0;
	staged_peer_gone(a, p);
	staged_peer_unmap(a, p);
	p->staged_shared = false;
	pdx_ucx_ep_close(p->ep);
	p->ep = NULL;
	p->ep_failed = false;
	free(p->layout.layer);
	p->layout.layer = NULL;
	p->state = PEER_NEW;
	p->instance = 0;
}

static struct peer *peer_lookup(struct agent *a, const char *addr, bool create)
{
	struct peer *p = NULL;
	int linger = 0, hwm = 10000;

	HASH_FIND_STR(a->peers, addr, p);
	if (p || !create)
		return p;
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	snprintf(p->addr, sizeof(p->addr), "%s", addr);
	p->agent = a;
	p->dealer = zmq_socket(a->zctx, ZMQ_DEALER);
	if (!p->dealer)
		goto free_p;
	zmq_setsockopt(p->dealer, ZMQ_LINGER, &linger, sizeof(linger));
	zmq_setsockopt(p->dealer, ZMQ_SNDHWM, &hwm, sizeof(hwm));
	if (a->curve && pdx_curve_client(a->curve, p->dealer, addr)) {
		zmq_close(p->dealer);
		goto free_p;
	}
	if (zmq_connect(p->dealer, addr) < 0) {
		log_warn("cannot connect to peer %s: %s", addr,
			 zmq_strerror(zmq_errno()));
		zmq_close(p->dealer);
		goto free_p;
	}
	HASH_ADD_STR(a->peers, addr, p);
	return p;

free_p:
	free(p);
	return NULL;
}

void peer_send_to_addr(struct agent *a, const char *addr, const char *op,
		       const struct pdx_xfer_id *xfer, const char *reason)
{
	struct peer *p = peer_lookup(a, addr, true);

	if (p)
		peer_send(a, p, op, xfer, reason);
}

/* UCX shared-memory transports are usable unless UCX_TLS leaves them out. */
static bool ucx_has_shm(void)
{
	static const char *const shm[] = { "sm", "shm", "posix", "sysv",
					   "cma", "knem", "xpmem", "all" };
	const char *tls = getenv("UCX_TLS");

	if (!tls || !*tls)
		return true;
	for (size_t i = 0; i < sizeof(shm) / sizeof(shm[0]); i++) {
		const char *s = strstr(tls, shm[i]);
		size_t n = strlen(shm[i]);

		while (s) {
			bool start = s == tls || s[-1] == ',' || s[-1] == '^';
			bool end = s[n] == '\0' || s[n] == ',';

			if (start && end)
				return tls[0] != '^';
			s = strstr(s + 1, shm[i]);
		}
	}
	return tls[0] == '^';
}

/* hello or hello_ack: what a peer needs of us to pick a data path. */
static void send_hello(struct agent *a, struct peer *p, const char *op)
{
	struct peer_msg pm;
	const void *ucx;
	size_t ucx_len;

	log_debug("%s to %s (state %d)", op, p->addr, p->state);
	pdx_ucx_address(a->ucx, &ucx, &ucx_len);
	peer_msg_begin(&pm, a, op, NULL, NULL);
	pdx_mp_msg_u64(&pm.m, "v", PEER_PROTOCOL_VERSION);
	pdx_mp_msg_u64(&pm.m, "instance", a->instance);
	pdx_mp_msg_str(&pm.m, "host", a->host_id);
	pdx_mp_msg_bool(&pm.m, "shm", ucx_has_shm());
	pdx_mp_msg_u64(&pm.m, "compat",
		       pdx_kv_layout_compat_hash(&a->reg.layout));
	pdx_layout_pack(pdx_mp_msg_key(&pm.m, "layout"), &a->reg.layout);
	pdx_mp_msg_bin(&pm.m, "ucx", ucx, ucx_len);
	pdx_mp_msg_bool(&pm.m, "cuda_ucx", pdx_ucx_has_cuda(a->ucx));
	staged_pack_hello(a, &pm.m);
	msgpack_pack_array(pdx_mp_msg_key(&pm.m, "regions"), a->reg.n_regions);
	for (uint32_t i = 0; i < a->reg.n_regions; i++) {
		const struct region *r = &a->reg.regions[i];

		pdx_mp_msg_map_open(&pm.m, NULL);
		pdx_mp_msg_str(&pm.m, "name", r->shm_name);
		pdx_mp_msg_u64(&pm.m, "addr", (uint64_t)(uintptr_t)r->addr);
		pdx_mp_msg_u64(&pm.m, "size", r->size);
		pdx_mp_msg_bin(&pm.m, "rkey", r->rkey, r->rkey_len);
		if (r->cuda) {
			pdx_mp_msg_str(&pm.m, "type", "cuda");
			pdx_mp_msg_bin(&pm.m, "ipc", r->ipc, PDX_CUDA_IPC_BYTES);
		}
		pdx_mp_msg_map_close(&pm.m);
	}
	if (peer_msg_send(&pm, p) == PDX_OK && strcmp(op, "hello") == 0) {
		/* A stale peer's new transfers wait for its answer, which
		 * tells whether it restarted. */
		p->state = PEER_HELLO_SENT;
		p->stale = false;
		p->hello_sent_ns = pdx_now_ns();
	}
}

struct peer *peer_get(struct agent *a, const char *addr)
{
	struct peer *p = peer_lookup(a, addr, true);
	uint64_t bound = (uint64_t)a->cfg.handshake_timeout_ms * 1000000ULL;
	uint64_t now = pdx_now_ns();
	uint64_t quiet = 2ULL * a->cfg.heartbeat_ms * 1000000ULL;

	if (!p || !a->reg.ok)
		return p;
	/* A hello that got no answer in time is sent again; so is one to a
	 * peer that stopped answering (it may have restarted), and to one
	 * we have not heard from for two heartbeat periods (one we have
	 * transfers with answers our pings every period). Heartbeats watch
	 * only peers with transfers: one killed while we had none with it
	 * and restarted on the same address would otherwise get our next
	 * "want" on its dead predecessor's handshake, and its hello crossing
	 * that want would fail the transfer as begun with the old one
	 * (found by scripts/soak: the first request to a restarted prefill
	 * instance failed, and that instance kept the KV for a lease). The
	 * hello costs a round trip, only after a quiet spell. */
	if (p->state == PEER_NEW ||
	    (p->state == PEER_READY && (p->stale || now - p->heard_ns > quiet)) ||
	    (p->state == PEER_HELLO_SENT && now - p->hello_sent_ns > bound))
		send_hello(a, p, "hello");
	return p;
}

/* UCX found the peer dead: its transfers fail now; the endpoint is closed
 * when the peer is met again (never from inside this callback). */
static void peer_ep_error(void *arg, pdx_status_t status)
{
	struct peer *p = arg;

	log_warn("peer %s unreachable: %s", p->addr, pdx_status_str(status));
	p->state = PEER_NEW;
	p->ep_failed = true;
	staged_peer_gone(p->agent, p); /* no "free" will come */
	xfers_peer_failed(p->agent, p, 0, PDX_EPEER, "ucx endpoint failed");
}

/* Maps the peer's shared memory where it can be (same host), else says it
 * cannot be, e.g. when /dev/shm is not shared. */
static bool map_peer_regions(struct peer *p)
{
	for (uint32_t i = 0; i < p->n_regions; i++) {
		struct remote_region *r = &p->regions[i];
		int fd = r->shm_name[0] ? shm_open(r->shm_name, O_RDWR, 0) : -1;
		struct stat st;

		if (fd >= 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_size >= r->size)
			r->map = mmap(NULL, r->size, PROT_READ | PROT_WRITE,
				      MAP_SHARED | MAP_POPULATE, fd, 0);
		if (fd >= 0)
			close(fd);
		if (r->map && r->map != MAP_FAILED)
			pdx_prefault(r->map, r->size);
		if (!r->map || r->map == MAP_FAILED) {
			r->map = NULL;
			for (uint32_t j = 0; j < i; j++) {
				munmap(p->regions[j].map, p->regions[j].size);
				p->regions[j].map = NULL;
			}
			return false;
		}
	}
	return true;
}

/* Opens the peer's GPU memory here with CUDA IPC (same host). */
static bool open_peer_gpu(struct agent *a, struct peer *p)
{
	char err[PDX_REASON_MAX];

	for (uint32_t i = 0; i < p->n_regions; i++) {
		struct remote_region *r = &p->regions[i];

		if (gpu_mem_open(a->gpu, r->ipc, &r->dptr, err, sizeof(err))) {
			log_warn("peer %s: its GPU memory cannot be opened here: %s",
				 p->addr, err);
			for (uint32_t j = 0; j < i; j++) {
				gpu_mem_close(a->gpu, p->regions[j].dptr);
				p->regions[j].dptr = NULL;
			}
			return false;
		}
	}
	return true;
}

/* GPU memory on both sides (docs/gpu.md): UCX moves it where it can, else
 * our stream copies into the peer's memory where CUDA IPC opens it (same
 * host), else pinned host staging, which works everywhere. A forced path
 * that cannot work refuses the handshake with why. */
static pdx_status_t choose_gpu_path(struct agent *a, struct peer *p,
				    const msgpack_object *staging, char *err,
				    size_t errlen)
{
	bool put = pdx_ucx_has_cuda(a->ucx) && p->cuda_ucx;

	for (uint32_t i = 0; i < p->n_regions; i++)
		put = put && p->regions[i].rkey; /* it registered them all */
	/* On one host we map its staging whatever our own path: it may send
	 * to us by staged while we send to it otherwise (a forced path, or
	 * its CUDA IPC opening failed where ours worked). */
	if (p->same_host && p->peer_shm)
		staged_peer_map(a, p, staging);

	switch (a->cfg.data_path) {
	case DATA_CUDA_PUT:
		if (!put) {
			snprintf(err, errlen, "data path cuda-put: %s UCX has no CUDA support",
				 pdx_ucx_has_cuda(a->ucx) ? "the peer's" : "our");
			return PDX_EINCOMPAT;
		}
		p->path = DATA_CUDA_PUT;
		return PDX_OK;
	case DATA_CUDA_IPC:
		if (!p->same_host || !open_peer_gpu(a, p)) {
			snprintf(err, errlen, "data path cuda-ipc: cannot open %s's GPU memory here (%s)",
				 p->addr, p->same_host ? "see the log" : "another host");
			return PDX_EINCOMPAT;
		}
		p->path = DATA_CUDA_IPC;
		return PDX_OK;
	case DATA_STAGED:
		break;
	case DATA_AUTO:
		if (put) {
			p->path = DATA_CUDA_PUT;
			return PDX_OK;
		}
		if (p->same_host && open_peer_gpu(a, p)) {
			p->path = DATA_CUDA_IPC;
			return PDX_OK;
		}
		break;
	default:
		snprintf(err, errlen, "data path %s moves host memory; the KV is in GPU memory",
			 data_path_name(a->cfg.data_path));
		return PDX_EINCOMPAT;
	}
	/* Staged. Where the peer's staging maps here, we assume ours maps
	 * there: no copy between the two (a receiver that cannot map it
	 * fails the transfer, saying so). */
	p->path = DATA_STAGED;
	p->staged_shared = p->staging_map != NULL;
	return PDX_OK;
}

/* Measured on one host (docs/architecture.md): a copy between mapped
 * pools runs at memcpy speed, UCX put (cma) at about half of it, and over
 * TCP UCX emulates put two orders of magnitude slower than messages. */
static enum data_path choose_path(struct agent *a, struct peer *p)
{
	bool shm_lane = p->same_host && ucx_has_shm() && p->peer_shm;

	switch (a->cfg.data_path) {
	case DATA_IPC:
		if (p->same_host && map_peer_regions(p))
			return DATA_IPC;
		log_warn("peer %s: cannot map its memory; using ucx", p->addr);
		return shm_lane ? DATA_PUT : DATA_AM;
	case DATA_PUT:
	case DATA_AM:
		return a->cfg.data_path;
	default: /* shared memory only where UCX_TLS allows it */
		if (shm_lane && map_peer_regions(p))
			return DATA_IPC;
		return shm_lane ? DATA_PUT : DATA_AM;
	}
}

/* A region of GPU memory: its handle, for CUDA IPC on the same host. */
static bool region_is_cuda(const msgpack_object *o, struct remote_region *r)
{
	char type[16];
	const void *h;
	size_t hlen;

	if (pdx_mp_get_str(o, "type", type, sizeof(type)) ||
	    strcmp(type, "cuda") != 0)
		return false;
	r->cuda = true;
	if (pdx_mp_get_bin(o, "ipc", &h, &hlen) == 0 &&
	    hlen == PDX_CUDA_IPC_BYTES)
		memcpy(r->ipc, h, PDX_CUDA_IPC_BYTES);
	return true;
}

/* Handshake content -> a ready peer. On failure writes why to err. */
static pdx_status_t peer_accept(struct agent *a, struct peer *p,
				const msgpack_object *m, char *err,
				size_t errlen)
{
	struct pdx_kv_layout layout;
	const msgpack_object *regions, *shm;
	const void *ucx;
	size_t ucx_len;
	uint64_t v = 0, instance, compat;
	char host[192], diff[PDX_REASON_MAX];
	pdx_status_t st;

	if (pdx_mp_get_u64(m, "v", &v) || v != PEER_PROTOCOL_VERSION) {
		snprintf(err, errlen, "protocol version %llu != %d",
			 (unsigned long long)v, PEER_PROTOCOL_VERSION);
		return PDX_EINCOMPAT;
	}
	regions = pdx_mp_get(m, "regions");
	shm = pdx_mp_get(m, "shm");
	if (pdx_mp_get_u64(m, "instance", &instance) ||
	    pdx_mp_get_str(m, "host", host, sizeof(host)) ||
	    pdx_mp_get_u64(m, "compat", &compat) ||
	    pdx_mp_get_bin(m, "ucx", &ucx, &ucx_len) || !regions ||
	    regions->type != MSGPACK_OBJECT_ARRAY ||
	    regions->via.array.size > PDX_MAX_REGIONS) {
		snprintf(err, errlen, "malformed handshake");
		return PDX_EINVAL;
	}
	st = pdx_layout_unpack(pdx_mp_get(m, "layout") ? pdx_mp_get(m, "layout") : m,
			       &layout, err, errlen);
	if (st)
		return st;
	if (pdx_kv_layout_diff(&a->reg.layout, &layout, diff, sizeof(diff)) ||
	    compat != pdx_kv_layout_compat_hash(&layout)) {
		snprintf(err, errlen, "layout differs (ours vs %s): %s", p->addr,
			 diff[0] ? diff : "compatibility hash");
		free(layout.layer);
		return PDX_EINCOMPAT;
	}
	if (peer_known(p) && p->instance == instance) {
		free(layout.layer); /* a repeated hello: the cache stands */
		p->state = PEER_READY;
		return PDX_OK;
	}
	if (p->ep) {
		log_info("peer %s restarted: transfers begun with it fail", p->addr);
		xfers_peer_failed(a, p, p->instance, PDX_EPEER, "peer restarted");
	}
	peer_reset(a, p);
	p->layout = layout;
	p->instance = instance;
	p->same_host = strcmp(host, a->host_id) == 0;
	p->peer_shm = shm && shm->type == MSGPACK_OBJECT_BOOLEAN && shm->via.boolean;
	p->cuda_ucx = pdx_mp_get(m, "cuda_ucx") &&
		      pdx_mp_get(m, "cuda_ucx")->type == MSGPACK_OBJECT_BOOLEAN &&
		      pdx_mp_get(m, "cuda_ucx")->via.boolean;
	p->cuda = false;
	st = pdx_ucx_ep_new(a->ucx, ucx, ucx_len,
			    !(p->same_host && p->peer_shm && ucx_has_shm()),
			    peer_ep_error, p, &p->ep);
	if (st) {
		snprintf(err, errlen, "ucx endpoint to %s: %s", p->addr,
			 pdx_status_str(st));
		return st;
	}
	p->n_regions = regions->via.array.size;
	p->regions = calloc(p->n_regions ? p->n_regions : 1, sizeof(*p->regions));
	if (!p->regions)
		return PDX_ENOMEM;
	for (uint32_t i = 0; i < p->n_regions; i++) {
		const msgpack_object *r = &regions->via.array.ptr[i];
		const void *rk;
		size_t rk_len;

		if (pdx_mp_get_u64(r, "addr", &p->regions[i].addr) ||
		    pdx_mp_get_u64(r, "size", &p->regions[i].size) ||
		    pdx_mp_get_bin(r, "rkey", &rk, &rk_len)) {
			snprintf(err, errlen, "malformed region %u", i);
			return PDX_EINVAL;
		}
		pdx_mp_get_str(r, "name", p->regions[i].shm_name,
			       sizeof(p->regions[i].shm_name));
		if (region_is_cuda(r, &p->regions[i])) {
			p->cuda = true;
			if (rk_len == 0) /* its UCX cannot register GPU memory */
				continue;
		}
		st = pdx_ucx_rkey_unpack(p->ep, rk, rk_len, &p->regions[i].rkey);
		if (st) {
			snprintf(err, errlen, "rkey %u of %s: %s", i, p->addr,
				 pdx_status_str(st));
			return st;
		}
	}
	/* Its layout must fit the regions it offers: refused here with a
	 * reason, not found out at the first push. */
	{
		uint64_t sizes[PDX_MAX_REGIONS];
		char why[PDX_REASON_MAX];

		for (uint32_t i = 0; i < p->n_regions; i++)
			sizes[i] = p->regions[i].size;
		if (pdx_kv_layout_check(&p->layout, sizes, p->n_regions, why,
					sizeof(why))) {
			snprintf(err, errlen, "layout of %s does not fit its "
				 "regions: %s", p->addr, why);
			return PDX_EINVAL;
		}
	}
	if (a->reg.cuda != p->cuda) {
		snprintf(err, errlen, "our KV is in %s memory, %s's in %s memory: not supported",
			 a->reg.cuda ? "GPU" : "host", p->addr,
			 p->cuda ? "GPU" : "host");
		return PDX_EINCOMPAT;
	}
	if (a->reg.cuda) {
		st = choose_gpu_path(a, p, pdx_mp_get(m, "staging"), err,
				     errlen);
		if (st)
			return st;
	} else if (data_path_gpu(a->cfg.data_path)) {
		snprintf(err, errlen, "data path %s needs GPU memory; the KV is in host memory",
			 data_path_name(a->cfg.data_path));
		return PDX_EINCOMPAT;
	} else {
		p->path = choose_path(a, p);
	}
	p->state = PEER_READY;
	log_info("peer %s ready: %s, data by %s%s", p->addr,
		 p->same_host ? "same host" : "remote host",
		 data_path_name(p->path),
		 p->staged_shared ? ", its staging mapped here" : "");
	return PDX_OK;
}

/* {"op": "want", "xfer", "blocks": ours, "skip"} */
static pdx_status_t send_want(struct agent *a, struct peer *p,
			      const struct xfer *x)
{
	struct peer_msg pm;

	peer_msg_begin(&pm, a, "want", &x->id, NULL);
	pdx_mp_msg_u32s(&pm.m, "blocks", x->blocks, x->n_blocks);
	pdx_mp_msg_u64(&pm.m, "skip", x->skip);
	return peer_msg_send(&pm, p);
}

void xfers_peer_ready(struct agent *a, struct peer *p)
{
	struct xfer *x, *tmp;

	if (!p)
		return;
	HASH_ITER(hh, a->xfers, x, tmp) {
		if (x->peer != p || x->finished || !x->announced)
			continue;
		if (p->state == PEER_REFUSED) {
			xfer_fail(x, PDX_EINCOMPAT, false, "peer %s refused: %s",
				  p->addr, p->refusal);
		} else if (p->state != PEER_READY) {
			continue;
		} else if (x->role == XFER_RECV && !x->want_sent) {
			x->want_sent = true;
			log_debug("want to %s", p->addr);
			x->peer_instance = p->instance;
			if (send_want(a, p, x))
				xfer_fail(x, PDX_EPEER, false,
					  "cannot reach %s", p->addr);
		} else if (x->role == XFER_SEND) {
			push_try(x);
		}
	}
}

static void on_hello(struct agent *a, const char *from, const msgpack_object *m,
		     bool is_ack)
{
	struct peer *p = peer_lookup(a, from, true);
	char err[PDX_REASON_MAX];
	pdx_status_t st;

	if (!p)
		return;
	p->heard_ns = pdx_now_ns(); /* first met through its hello: heard now */
	log_debug("%s from %s (state %d)", is_ack ? "hello_ack" : "hello", from,
		  p->state);
	if (!a->reg.ok) {
		snprintf(err, sizeof(err), "no engine registered at %s", a->peer_addr);
		st = PDX_ENOTREG;
	} else {
		st = peer_accept(a, p, m, err, sizeof(err));
	}
	metrics_handshake(a, st == PDX_OK);
	if (st) {
		log_warn("handshake with %s refused: %s", from, err);
		peer_reset(a, p);
		if (!is_ack)
			peer_send(a, p, "hello_nack", NULL, err);
		p->state = PEER_REFUSED;
		snprintf(p->refusal, sizeof(p->refusal), "%s", err);
	} else if (!is_ack) {
		send_hello(a, p, "hello_ack");
	}
	xfers_peer_ready(a, p);
	if (p->state == PEER_REFUSED)
		peer_reset(a, p); /* the next transfer tries afresh */
}

static void on_hello_nack(struct agent *a, struct peer *p,
			  const msgpack_object *m)
{
	char reason[PDX_REASON_MAX] = "refused";

	pdx_mp_get_str(m, "reason", reason, sizeof(reason));
	log_warn("handshake refused by %s: %s", p->addr, reason);
	metrics_handshake(a, false);
	peer_reset(a, p);
	p->state = PEER_REFUSED;
	snprintf(p->refusal, sizeof(p->refusal), "%s", reason);
	xfers_peer_ready(a, p);
	peer_reset(a, p);
}

static void on_want(struct agent *a, struct peer *p, const msgpack_object *m)
{
	struct pdx_xfer_id id;
	struct xfer *x;
	uint32_t *blocks = NULL;
	size_t n = 0;
	uint64_t skip = 0;
	const char *why;

	if (pdx_mp_get_xfer(m, "xfer", &id))
		return;
	if (!a->reg.ok || pdx_mp_get_u32s(m, "blocks", MAX_BLOCKS, &blocks, &n) || n == 0 ||
	    pdx_mp_get_u64(m, "skip", &skip) || skip > n) {
		free(blocks);
		peer_send(a, p, "error", &id, "want: malformed or no handshake");
		return;
	}
	for (size_t i = 0; i < n; i++) {
		if (blocks[i] >= p->layout.blocks) {
			free(blocks);
			peer_send(a, p, "error", &id,
				  "want: block outside your registered layout");
			return;
		}
	}
	x = xfer_find(a, &id);
	xfer_claim(x, p);
	if (!x && (why = pdx_ended_find(a->ended, &id, p->addr)) != NULL) {
		char reason[PDX_REASON_MAX];

		free(blocks);
		snprintf(reason, sizeof(reason), "transfer ended here: %s", why);
		peer_send(a, p, "error", &id, reason);
		return;
	}
	/* another agent's, in flight or ended here (an open send it
	 * claimed first) */
	if ((x && (x->role != XFER_SEND || x->remote_blocks || x->finished ||
		   strcmp(x->peer_addr, p->addr) != 0)) ||
	    (!x && pdx_ended_find(a->ended, &id, NULL))) {
		free(blocks);
		log_warn("want from %s refused: transfer is not for it", p->addr);
		peer_send(a, p, "error", &id, "transfer is not for this agent");
		return;
	}
	if (!x) {
		/* Before our engine announced it: hold it, bounded in time. */
		x = xfer_new(a, &id, XFER_SEND, p->addr, a->cfg.xfer_timeout_ms);
		if (!x) {
			free(blocks);
			peer_send(a, p, "error", &id, "sender is full");
			return;
		}
		x->peer = p;
	}
	x->remote_blocks = blocks;
	x->n_remote = (uint32_t)n; /* checked against ours before any push */
	x->skip = (uint32_t)skip;
	x->peer_instance = p->instance;
	pdx_xfer_sm_blocks_known(&x->sm);
	if (x->announced) {
		xfer_begin_phase(x); /* the lease ends, the transfer begins */
		push_try(x);
	}
}

static struct xfer *peer_xfer(struct agent *a, struct peer *p,
			      const msgpack_object *m, const char *op)
{
	struct pdx_xfer_id id;
	struct xfer *x;

	if (pdx_mp_get_xfer(m, "xfer", &id))
		return NULL;
	x = xfer_find(a, &id);
	if (!x || x->finished || strcmp(x->peer_addr, p->addr) != 0) {
		if (strcmp(op, "done") == 0)
			peer_send(a, p, "error", &id, "unknown transfer");
		log_debug("%s from %s for a transfer not in flight: ignored", op,
			  p->addr);
		return NULL;
	}
	return x;
}

static void on_done(struct agent *a, struct peer *p, const msgpack_object *m)
{
	struct xfer *x = peer_xfer(a, p, m, "done");
	uint64_t bytes, am_bytes = 0;

	if (!x)
		return;
	if (x->role != XFER_RECV || !x->announced ||
	    pdx_mp_get_u64(m, "bytes", &bytes)) {
		peer_send(a, p, "error", &x->id, "done: not a transfer to you");
		return;
	}
	pdx_mp_get_u64(m, "am_bytes", &am_bytes);
	if (pdx_mp_get_i64(m, "first_token", &x->first_token) ||
	    x->first_token < 0 || x->first_token > UINT32_MAX)
		x->first_token = -1; /* optional */
	log_debug("done from %s: %llu bytes", p->addr, (unsigned long long)bytes);
	x->done_seen = true;
	x->am_expected = am_bytes;
	x->bytes = bytes;
	recv_try_complete(x);
}

static void on_abort(struct agent *a, struct peer *p, const msgpack_object *m,
		     bool refused)
{
	char reason[PDX_REASON_MAX] = "no reason given", why[PDX_REASON_MAX];
	struct pdx_xfer_id id;
	struct xfer *x;

	/* An abort presenting an open send's id claims it as a want would
	 * (the id is its credential), to end it: a decode request that left
	 * before asking for its KV frees the sender's blocks now. */
	if (!refused && pdx_mp_get_xfer(m, "xfer", &id) == 0)
		xfer_claim(xfer_find(a, &id), p);
	x = peer_xfer(a, p, m, "abort");
	pdx_mp_get_str(m, "reason", reason, sizeof(reason));
	if (!x && !refused && pdx_mp_get_xfer(m, "xfer", &id) == 0 &&
	    !xfer_find(a, &id)) {
		/* Before our engine heard of it: when it announces it, it
		 * fails at once. */
		snprintf(why, sizeof(why), "aborted by %s: %s", p->addr, reason);
		pdx_ended_add(a->ended, &id, p->addr, why);
	}
	if (!x)
		return;
	if (!x->announced) {
		/* Our engine has not announced it yet: remember, so that it
		 * fails at once when it does instead of waiting for blocks
		 * that will never come. */
		snprintf(x->peer_abort, sizeof(x->peer_abort), "%s by %s: %s",
			 refused ? "refused" : "aborted", p->addr, reason);
		return;
	}
	xfer_fail(x, refused ? PDX_ENOENT : PDX_ECANCELED, false, "%s by %s: %s",
		  refused ? "refused" : "aborted", p->addr, reason);
}

/* A ping says the peer is alive and lists the transfers its engine holds
 * queued for us: their senders' leases are renewed (liveness.c sends
 * ours). */
static void on_ping(struct agent *a, const char *from, const msgpack_object *m)
{
	struct peer *p = peer_get(a, from);
	const msgpack_object *hold = pdx_mp_get(m, "hold");
	uint64_t lease_end;

	if (!p)
		return;
	peer_send(a, p, "pong", NULL, NULL);
	/* Renewals count only from a peer we shook hands with (it may have
	 * restarted and lost them); peer_get() sent it a hello if not. */
	if (!peer_known(p) || !hold || hold->type != MSGPACK_OBJECT_ARRAY)
		return;
	lease_end = pdx_now_ns() + (uint64_t)a->cfg.lease_ms * 1000000ULL;
	for (uint32_t i = 0; i < hold->via.array.size; i++) {
		struct pdx_xfer_id id;
		struct xfer *x;

		if (pdx_mp_obj_xfer(&hold->via.array.ptr[i], &id))
			continue;
		/* Unknown here: our engine has not announced it, and its
		 * lease starts in full when it does. */
		x = xfer_find(a, &id);
		xfer_claim(x, p);
		if (x && x->role == XFER_SEND && x->peer == p && !x->finished &&
		    lease_end > x->lease_ns) {
			x->lease_ns = lease_end;
			metrics_lease_renewed(a);
		}
	}
}

void peer_on_msg(struct agent *a, const void *buf, size_t len,
		 const char *user)
{
	msgpack_unpacked msg;
	char op[32], from[PDX_ADDR_MAX];
	struct peer *p;

	if (pdx_mp_parse(buf, len, &msg, op, sizeof(op)) ||
	    pdx_mp_get_str(&msg.data, "from", from, sizeof(from)) ||
	    strncmp(from, "tcp://", 6) != 0) {
		log_warn("malformed peer message (%zu bytes): ignored", len);
		msgpack_unpacked_destroy(&msg);
		return;
	}
	/* With CURVE a member speaks only for the address its key has. */
	if (a->curve && (!user || strcmp(user, from) != 0)) {
		log_warn("%s claiming to be from %s, but its key is %s's: "
			 "dropped", op, from, user ? user : "nobody");
		msgpack_unpacked_destroy(&msg);
		return;
	}
	if ((p = peer_lookup(a, from, false)) != NULL)
		p->heard_ns = pdx_now_ns();
	if (strcmp(op, "ping") == 0) {
		on_ping(a, from, &msg.data);
	} else if (strcmp(op, "pong") == 0) {
		/* heard: that is all it says */
	} else if (strcmp(op, "hello") == 0 || strcmp(op, "hello_ack") == 0) {
		on_hello(a, from, &msg.data, op[5] == '_');
	} else if (strcmp(op, "hello_nack") == 0) {
		if ((p = peer_lookup(a, from, false)) != NULL)
			on_hello_nack(a, p, &msg.data);
	} else if (!peer_known(p = peer_lookup(a, from, false))) {
		struct pdx_xfer_id id;

		/* Perhaps we restarted and it still holds our old handshake. */
		log_warn("%s from %s without a handshake: refused", op, from);
		p = peer_lookup(a, from, true);
		if (p && pdx_mp_get_xfer(&msg.data, "xfer", &id) == 0 &&
		    strcmp(op, "error") != 0 && strcmp(op, "abort") != 0)
			peer_send(a, p, "error", &id,
				  "no handshake with you: send hello first");
	} else if (strcmp(op, "want") == 0) {
		on_want(a, p, &msg.data);
	} else if (strcmp(op, "done") == 0) {
		on_done(a, p, &msg.data);
	} else if (strcmp(op, "abort") == 0 || strcmp(op, "error") == 0) {
		on_abort(a, p, &msg.data, op[0] == 'e');
	} else {
		log_warn("unknown op %s from %s: ignored", op, from);
	}
	msgpack_unpacked_destroy(&msg);
}

void peers_free(struct agent *a)
{
	struct peer *p, *tmp;

	HASH_ITER(hh, a->peers, p, tmp) {
		peer_reset(a, p);
		zmq_close(p->dealer);
		HASH_DEL(a->peers, p);
		free(p);
	}
}
