/* The handshake (docs/protocol.md, "hello and hello_ack"): our hello,
 * sent before the first transfer with a peer and again when it may have
 * restarted; and theirs, taken in three steps: parsed into a struct
 * hello (nothing of ours touched), checked against our registration
 * (refused with why), applied to the peer (its endpoint, regions, rkeys
 * and data path). A peer ready or refused moves its transfers on. */
#define PDX_LOG_TOPIC "peer"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/fnv.h"
#include "common/layout_mp.h"
#include "common/log.h"
#include "common/mp.h"

/* A hello as it came, read into our types; regions and layout are its
 * own until hello_apply() gives them to the peer. */
struct hello {
	uint64_t v, instance, compat;
	char host[192];
	bool shm;      /* its UCX may use shared memory */
	bool cuda_ucx; /* its UCX moves GPU memory */
	bool cuda;     /* its KV is GPU memory (a region of type cuda) */
	bool done_ucx; /* it takes "done" by UCX on the ipc lanes */
	bool stops;    /* it answers a receiver's "abort" with "stopped" */
	bool slices;   /* it takes "slice" messages on the put lane too */
	struct tp_rank tp; /* its engine's rank of its TP size */
	char kv_dtype[PDX_KV_DTYPE_MAX]; /* its engine's; "": none said */
	const void *ucx; /* its worker address, in the message */
	size_t ucx_len;
	/* "ucx_ep": the number of its UCX endpoint to the worker whose
	 * address hashes to sn_worker (ucx.h, pdx_ucx_ep_sn()) */
	bool has_sn;
	uint64_t sn_worker, sn;
	struct pdx_kv_layout layout;
	struct remote_region *regions; /* addr, size, name, cuda, ipc */
	struct {
		const void *p; /* the packed rkey, in the message */
		size_t len;
	} *rkeys;
	uint32_t n_regions;
	const msgpack_object *staging;
};

static void hello_free(struct hello *h)
{
	free(h->layout.layer);
	free(h->regions);
	free(h->rkeys);
}

static uint64_t worker_hash(const void *addr, size_t len)
{
	return pdx_fnv1a64(PDX_FNV1A64_INIT, addr, len);
}

static bool get_bool(const msgpack_object *m, const char *key)
{
	const msgpack_object *o = pdx_mp_get(m, key);

	return o && o->type == MSGPACK_OBJECT_BOOLEAN && o->via.boolean;
}

/* One region of the hello; a GPU one carries its CUDA IPC handle. */
static int parse_region(const msgpack_object *o, struct remote_region *r,
			const void **rkey, size_t *rkey_len)
{
	char type[16];
	const void *ipc;
	size_t ipc_len;

	if (pdx_mp_get_u64(o, "addr", &r->addr) ||
	    pdx_mp_get_u64(o, "size", &r->size) ||
	    pdx_mp_get_bin(o, "rkey", rkey, rkey_len))
		return -1;
	pdx_mp_get_str(o, "name", r->shm_name, sizeof(r->shm_name));
	if (pdx_mp_get_str(o, "type", type, sizeof(type)) == 0 &&
	    strcmp(type, "cuda") == 0) {
		r->cuda = true;
		if (pdx_mp_get_bin(o, "ipc", &ipc, &ipc_len) == 0 &&
		    ipc_len == PDX_CUDA_IPC_BYTES)
			memcpy(r->ipc, ipc, PDX_CUDA_IPC_BYTES);
	}
	return 0;
}

/* Reads m into h (which hello_free() frees whatever this returns); a
 * message it cannot read is refused, saying what is wrong. */
static pdx_status_t hello_parse(const msgpack_object *m, struct hello *h,
				char *err, size_t errlen)
{
	const msgpack_object *regions = pdx_mp_get(m, "regions");
	const msgpack_object *layout = pdx_mp_get(m, "layout");
	const char *bad;

	memset(h, 0, sizeof(*h));
	bad = pdx_mp_get_u64(m, "v", &h->v)			      ? "v"
	      : pdx_mp_get_u64(m, "instance", &h->instance)	      ? "instance"
	      : pdx_mp_get_str(m, "host", h->host, sizeof(h->host)) ? "host"
	      : pdx_mp_get_u64(m, "compat", &h->compat)	      ? "compat"
	      : pdx_mp_get_bin(m, "ucx", &h->ucx, &h->ucx_len)      ? "ucx"
	      : !regions || regions->type != MSGPACK_OBJECT_ARRAY ||
		      regions->via.array.size > PDX_MAX_REGIONS
		  ? "regions"
		  : NULL;
	if (bad) {
		/* another version may say all this otherwise: the version,
		 * when it differs, is the reason */
		if (h->v && h->v != PEER_PROTOCOL_VERSION)
			return PDX_OK;
		snprintf(err, errlen, "malformed handshake: %s missing or "
			 "malformed", bad);
		return PDX_EINVAL;
	}
	h->shm = get_bool(m, "shm");
	h->cuda_ucx = get_bool(m, "cuda_ucx");
	h->done_ucx = get_bool(m, "done_ucx");
	h->stops = get_bool(m, "stops");
	h->slices = get_bool(m, "slices");
	pdx_mp_get_str(m, "kv_dtype", h->kv_dtype, sizeof(h->kv_dtype));
	h->staging = pdx_mp_get(m, "staging");
	if (pdx_mp_get(m, "ucx_ep")) {
		const msgpack_object *e = pdx_mp_get(m, "ucx_ep");

		if (pdx_mp_get_u64(e, "worker", &h->sn_worker) ||
		    pdx_mp_get_u64(e, "sn", &h->sn) || h->sn > UINT32_MAX) {
			snprintf(err, errlen, "malformed ucx_ep");
			return PDX_EINVAL;
		}
		h->has_sn = true;
	}
	h->tp = (struct tp_rank){ 0, 1 };
	if (pdx_mp_get(m, "tp")) {
		const msgpack_object *tp = pdx_mp_get(m, "tp");
		uint64_t rank, size;

		if (pdx_mp_get_u64(tp, "rank", &rank) ||
		    pdx_mp_get_u64(tp, "size", &size) || size > UINT32_MAX ||
		    rank > UINT32_MAX) {
			snprintf(err, errlen, "malformed tp");
			return PDX_EINVAL;
		}
		h->tp = (struct tp_rank){ (uint32_t)rank, (uint32_t)size };
	}
	h->n_regions = regions->via.array.size;
	h->regions = calloc(h->n_regions ? h->n_regions : 1, sizeof(*h->regions));
	h->rkeys = calloc(h->n_regions ? h->n_regions : 1, sizeof(*h->rkeys));
	if (!h->regions || !h->rkeys) {
		snprintf(err, errlen, "out of memory");
		return PDX_ENOMEM;
	}
	for (uint32_t i = 0; i < h->n_regions; i++) {
		if (parse_region(&regions->via.array.ptr[i], &h->regions[i],
				 &h->rkeys[i].p, &h->rkeys[i].len)) {
			snprintf(err, errlen, "malformed region %u", i);
			return PDX_EINVAL;
		}
		h->cuda = h->cuda || h->regions[i].cuda;
	}
	return pdx_layout_unpack(layout ? layout : m, &h->layout, err, errlen);
}

/* Whether we can transfer with the agent that sent h: an engine here,
 * the same protocol, the same layout (but for the order inside a block:
 * transfers convert it), which fits the regions it offers, and the same
 * kind of memory. */
static pdx_status_t hello_check(const struct agent *a, const struct peer *p,
				const struct hello *h, char *err, size_t errlen)
{
	char diff[PDX_REASON_MAX], why[PDX_REASON_MAX];
	struct pdx_kv_layout ordered, heads;
	uint64_t *sizes;
	int bad;

	/* Our own hello, come back: the peer's address leads to us (P
	 * listening on 0.0.0.0 and D advertising P's port under another
	 * name: P answered D's hello to itself, took its own answer, and
	 * kept itself as that peer, its own regions as the peer's). */
	if (h->instance == a->instance) {
		snprintf(err, errlen, "the hello from %s is this agent's own: "
			 "that address leads back here (does a peer's "
			 "--advertise name this agent's address?)",
			 p->addr);
		return PDX_EINCOMPAT;
	}
	if (!a->reg.ok) {
		snprintf(err, errlen, "no engine registered at %s", a->peer_addr);
		return PDX_ENOTREG;
	}
	if (h->v != PEER_PROTOCOL_VERSION) {
		snprintf(err, errlen, "protocol version %llu != %d",
			 (unsigned long long)h->v, PEER_PROTOCOL_VERSION);
		return PDX_EINCOMPAT;
	}
	/* The order inside a block may differ: transfers convert it
	 * (tp_order_slice). kv_heads may differ between TP sizes
	 * (tp_slice.c): checked apart. */
	ordered = h->layout;
	ordered.order = a->reg.layout.order;
	heads = ordered;
	heads.kv_heads = a->reg.layout.kv_heads;
	if (pdx_kv_layout_diff(&a->reg.layout, &heads, diff, sizeof(diff)) ||
	    h->compat != pdx_kv_layout_compat_hash(&h->layout) ||
	    (a->reg.tp.size == 1 && h->tp.size == 1 &&
	     pdx_kv_layout_diff(&a->reg.layout, &ordered, diff, sizeof(diff)))) {
		snprintf(err, errlen, "layout differs (ours vs %s): %s", p->addr,
			 diff[0] ? diff : "compatibility hash");
		return PDX_EINCOMPAT;
	}
	/* the layout knows bytes per element, not their type: bfloat16 and
	 * float16 read each other's KV as their own */
	if (a->reg.kv_dtype[0] && h->kv_dtype[0] &&
	    strcmp(a->reg.kv_dtype, h->kv_dtype)) {
		snprintf(err, errlen, "KV element types differ (ours vs %s): "
			 "%s != %s",
			 p->addr, a->reg.kv_dtype, h->kv_dtype);
		return PDX_EINCOMPAT;
	}
	if (tp_heads_refusal(&a->reg.layout, a->reg.tp, &h->layout, h->tp, why,
			     sizeof(why))) {
		snprintf(err, errlen, "layout differs (ours vs %s): %s", p->addr,
			 why);
		return PDX_EINCOMPAT;
	}
	/* Its layout must fit the regions it offers: refused here with a
	 * reason, not found out at the first push. */
	sizes = calloc(h->n_regions ? h->n_regions : 1, sizeof(*sizes));
	if (!sizes) {
		snprintf(err, errlen, "out of memory");
		return PDX_ENOMEM;
	}
	for (uint32_t i = 0; i < h->n_regions; i++)
		sizes[i] = h->regions[i].size;
	bad = pdx_kv_layout_check(&h->layout, sizes, h->n_regions, why,
				  sizeof(why));
	free(sizes);
	if (bad) {
		snprintf(err, errlen, "layout of %s does not fit its regions: %s",
			 p->addr, why);
		return PDX_EINVAL;
	}
	if (a->reg.cuda != h->cuda) {
		snprintf(err, errlen, "our KV is in %s memory, %s's in %s memory: not supported",
			 a->reg.cuda ? "GPU" : "host", p->addr,
			 h->cuda ? "GPU" : "host");
		return PDX_EINCOMPAT;
	}
	return PDX_OK;
}

/* hello or hello_ack: what a peer needs of us to pick a data path. */
static void send_hello(struct agent *a, struct peer *p, const char *op)
{
	struct peer_msg pm;
	const void *ucx;
	size_t ucx_len;
	int64_t sn_told;

	log_debug("%s to %s (state %d)", op, p->addr, p->state);
	pdx_ucx_address(a->ucx, &ucx, &ucx_len);
	peer_msg_begin(&pm, a, op, NULL, NULL);
	pdx_mp_msg_u64(&pm.m, "v", PEER_PROTOCOL_VERSION);
	pdx_mp_msg_u64(&pm.m, "instance", a->instance);
	pdx_mp_msg_str(&pm.m, "host", a->host_id);
	pdx_mp_msg_bool(&pm.m, "shm", path_ucx_has_shm());
	pdx_mp_msg_u64(&pm.m, "compat",
		       pdx_kv_layout_compat_hash(&a->reg.layout));
	pdx_layout_pack(pdx_mp_msg_key(&pm.m, "layout"), &a->reg.layout);
	pdx_mp_msg_bin(&pm.m, "ucx", ucx, ucx_len);
	sn_told = -1;
	if (p->worker) { /* our endpoint's number, for it to pair with */
		sn_told = pdx_ucx_ep_sn(a->ucx, p->worker, p->worker_len);
		pdx_mp_msg_map_open(&pm.m, "ucx_ep");
		pdx_mp_msg_u64(&pm.m, "worker",
			       worker_hash(p->worker, p->worker_len));
		pdx_mp_msg_u64(&pm.m, "sn", (uint64_t)sn_told);
		pdx_mp_msg_map_close(&pm.m);
	}
	pdx_mp_msg_bool(&pm.m, "cuda_ucx", pdx_ucx_has_cuda(a->ucx));
	staged_pack_hello(a, &pm.m);
	pdx_mp_msg_bool(&pm.m, "done_ucx", true);
	pdx_mp_msg_bool(&pm.m, "stops", true);
	if (!a->no_slices)
		pdx_mp_msg_bool(&pm.m, "slices", true);
	if (a->reg.kv_dtype[0])
		pdx_mp_msg_str(&pm.m, "kv_dtype", a->reg.kv_dtype);
	pdx_mp_msg_map_open(&pm.m, "tp");
	pdx_mp_msg_u64(&pm.m, "rank", a->reg.tp.rank);
	pdx_mp_msg_u64(&pm.m, "size", a->reg.tp.size);
	pdx_mp_msg_map_close(&pm.m);
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
	if (strcmp(op, "hello") == 0)
		p->sn_told = sn_told;
	if (peer_msg_send(&pm, p) == PDX_OK && strcmp(op, "hello") == 0) {
		/* A stale peer's new transfers wait for its answer, which
		 * tells whether it restarted. */
		p->state = PEER_HELLO_SENT;
		p->stale = false;
		p->hello_sent_ns = pdx_now_ns();
		p->cannot_reach_us[0] = '\0';
	} else if (strcmp(op, "hello") == 0 && p->state == PEER_HELLO_SENT) {
		/* not queued (ZeroMQ has no connection to put it on: a
		 * CURVE agent and a plain one; or the queue is full): the
		 * transfers that wait now are bounded from this try, not
		 * from the hello before, or they failed at once saying no
		 * answer came in the whole bound (a new user's find) */
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

	char why[PDX_REASON_MAX];

	/* UCX says "timed out" or "connection reset" and nothing of why:
	 * the words a user needs are that the peer or the wire went */
	snprintf(why, sizeof(why), "its UCX data connection failed (%s): its "
		 "agent died, or the network between us", pdx_status_str(status));
	log_warn("peer %s: %s", p->addr, why);
	p->state = PEER_NEW;
	p->ep_failed = true;
	staged_peer_gone(p->agent, p); /* no "free" will come */
	xfers_peer_failed(p->agent, p, 0, PDX_EPEER, why);
}

/* Nothing of x was heard from its sender: no "done", no "readable", no
 * byte by active message, no read of ours under way. (A push by put or
 * ipc lands unseen: that the want was refused is the proof.) */
static bool recv_unheard(const struct xfer *x)
{
	return x->role == XFER_RECV && !x->done_seen && !x->bytes &&
	       !x->am_bytes && !x->remote_blocks && !x->inflight;
}

/* p's hello says a new instance: the transfers begun with the old one
 * fail ("peer restarted"), but for receives nothing of which moved as
 * far as we can tell. One whose want was refused (wanted_again, want
 * not sent) moved nothing: it asks the new instance. One whose want went
 * to the old instance's handshake and is unanswered may have reached
 * either one: the new one refuses it (PEER_NO_HANDSHAKE: it had no
 * handshake with us; PEER_STALE_WANT: its engine registered again), and
 * then it is asked again; the old one may have moved bytes, and the new
 * one then never answers it: it fails when our hello sent after it is
 * answered (p->rewant), which the refusal precedes (both ways on one
 * ZeroMQ connection, in order). The race of docs/reliability.md: a peer
 * killed and restarted within two heartbeat periods got our want on its
 * predecessor's handshake, and its hello crossing that want failed it. */
static void peer_restarted(struct agent *a, struct peer *p)
{
	struct xfer *x, *tmp;
	char hex[33];

	HASH_ITER(hh, a->xfers, x, tmp) {
		/* held by our engine's queue, not asked for yet: the KV the
		 * old instance kept for it went with it (or with its engine),
		 * so the request learns now, not at its want or the bound */
		if (x->peer == p && !x->finished && x->held && !x->announced) {
			xfer_fail(x, PDX_EPEER, true, "peer %s restarted: the KV "
				  "it kept for this transfer went with it",
				  p->addr);
			continue;
		}
		if (x->peer != p || x->finished ||
		    (x->peer_instance != p->instance && !x->want_unsure))
			continue;
		if (x->role == XFER_RECV && !x->want_sent && x->wanted_again)
			continue; /* refused: its want goes at the answer */
		if (x->want_sent && recv_unheard(x)) {
			pdx_xfer_id_hex(&x->id, hex);
			log_info("xfer %s: its want to %s may have reached the "
				 "new instance: it waits for its answer", hex,
				 p->addr);
			x->want_unsure = true;
			p->rewant = REWANT_HELLO;
			continue;
		}
		xfer_fail(x, PDX_EPEER, true, "peer %s: peer restarted",
			  p->addr);
	}
}

/* After a hello or hello_ack of p was handled: the hello that bounds the
 * wait of wants unsure goes now (after our hello_ack, when it was a
 * hello), and at the answer to it those still unsure fail; their want
 * reached the old instance, or was lost with its connection. */
static void rewant_settle(struct agent *a, struct peer *p, bool is_ack)
{
	struct xfer *x, *tmp;

	if (p->rewant == REWANT_HELLO) {
		send_hello(a, p, "hello");
		if (p->state != PEER_HELLO_SENT) { /* could not send */
			p->rewant = REWANT_NONE;
			xfers_peer_failed(a, p, p->instance, PDX_EPEER,
					  "peer restarted");
			return;
		}
		p->rewant = REWANT_ACK;
		HASH_ITER(hh, a->xfers, x, tmp) {
			if (x->peer == p && x->want_unsure)
				xfer_arm(x); /* the hello bounds it too */
		}
		return;
	}
	if (p->rewant != REWANT_ACK || !is_ack)
		return;
	p->rewant = REWANT_NONE;
	HASH_ITER(hh, a->xfers, x, tmp) {
		if (x->peer == p && x->want_unsure && !x->finished)
			xfer_fail(x, PDX_EPEER, true,
				  "peer %s: peer restarted", p->addr);
	}
}

/* Our endpoint to p is made anew at its hello's number (sn_ahead()),
 * the same instance: what of ours moved on the old one, paired with one
 * the peer closed, went nowhere (a put to a closed endpoint is dropped
 * by the peer's worker). Those transfers fail: a push whose flush went
 * to the new endpoint said "done" with its first layers lost, and its
 * receiver reported it received, wrong bytes (they are not counted on
 * the put lane). */
static void ep_renewed_fail(struct agent *a, struct peer *p)
{
	struct xfer *x, *tmp;

	HASH_ITER(hh, a->xfers, x, tmp) {
		if (x->peer != p || x->finished ||
		    !(x->role == XFER_SEND || x->pull) ||
		    !(x->bytes || x->am_bytes || x->inflight))
			continue;
		xfer_fail(x, PDX_EPEER, true, "peer %s: our UCX endpoint to "
			  "it was made anew mid-transfer (its own to us was "
			  "made since)", p->addr);
	}
}

/* Whether our endpoint to h's sender reports peer errors (one shared per
 * peer worker, transport/ucx.h), which numbers must pair: not one over
 * shared memory to the same host, made once and kept. */
static bool ep_reports_errors(const struct agent *a, const struct hello *h)
{
	return !(strcmp(h->host, a->host_id) == 0 && h->shm &&
		 path_ucx_has_shm());
}

/* Whether h's sender's UCX endpoint to our worker is numbered higher
 * than ours to its (ucx.h, pdx_ucx_ep_sn()): it cut its endpoint and
 * made another since, and ours pairs with the one it closed. Not when
 * it did not say, or said for another worker of ours (we restarted). */
static bool sn_ahead(const struct agent *a, const struct hello *h)
{
	const void *ours;
	size_t len;

	if (!h->has_sn || !ep_reports_errors(a, h))
		return false;
	pdx_ucx_address(a->ucx, &ours, &len);
	return h->sn_worker == worker_hash(ours, len) &&
	       h->sn > pdx_ucx_ep_sn(a->ucx, h->ucx, h->ucx_len);
}

/* Whether h (a hello_ack) says a number of its sender's endpoint lower
 * than ours, which our hello it answers did not say (it had none: we had
 * forgotten the peer, and its worker with it; or ours changed since): it
 * pairs with one we closed, and follows our number only at our next
 * hello, which goes now. */
static bool sn_behind_untold(const struct agent *a, const struct peer *p,
			     const struct hello *h)
{
	const void *ours;
	size_t len;
	uint32_t sn;

	if (!h->has_sn || !ep_reports_errors(a, h))
		return false;
	pdx_ucx_address(a->ucx, &ours, &len);
	sn = pdx_ucx_ep_sn(a->ucx, h->ucx, h->ucx_len);
	return h->sn_worker == worker_hash(ours, len) && h->sn < sn &&
	       p->sn_told != (int64_t)sn;
}

/* A checked hello -> a ready peer: its endpoint, its regions with their
 * rkeys, its data path. A repeated hello (same instance) leaves the cache
 * as it stands; a new instance fails what was begun with the old one. */
static pdx_status_t hello_apply(struct agent *a, struct peer *p,
				struct hello *h, char *err, size_t errlen)
{
	bool behind = sn_ahead(a, h); /* ours pairs with one it closed */
	uint8_t *worker;
	pdx_status_t st;

	if (peer_known(p) && p->instance == h->instance && !p->ep_renew &&
	    !behind) {
		p->state = PEER_READY;
		return PDX_OK;
	}
	if (p->ep && p->instance != h->instance) {
		log_info("peer %s restarted: transfers begun with it fail "
			 "(but receives it may not have been asked for)",
			 p->addr);
		peer_restarted(a, p);
	} else if (p->ep_renew) {
		log_debug("peer %s: a new handshake, as we have a new "
			  "instance",
			  p->addr);
	} else if (behind) {
		/* it cut its endpoint to us (found us silent, or forgot us)
		 * and made another: ours led to the one it closed (a pull
		 * from it timed out) */
		log_info("peer %s made a new UCX endpoint to us (its number "
			 "%llu): ours is made anew to pair with it", p->addr,
			 (unsigned long long)h->sn);
		ep_renewed_fail(a, p);
	} else if (p->ep) {
		/* the same instance: our endpoint to it failed (its transfers
		 * failed then), and it is met again */
		log_info("peer %s met again after its UCX endpoint failed: a "
			 "new endpoint", p->addr);
	}
	peer_reset(a, p);
	p->layout = h->layout;
	h->layout.layer = NULL;
	p->instance = h->instance;
	p->same_host = strcmp(h->host, a->host_id) == 0;
	p->peer_shm = h->shm;
	p->cuda_ucx = h->cuda_ucx;
	p->cuda = h->cuda;
	p->done_ucx = h->done_ucx;
	p->stops = h->stops;
	p->slices = h->slices;
	p->tp = h->tp;
	worker = malloc(h->ucx_len ? h->ucx_len : 1);
	if (!worker) {
		snprintf(err, errlen, "out of memory");
		return PDX_ENOMEM;
	}
	memcpy(worker, h->ucx, h->ucx_len);
	free(p->worker);
	p->worker = worker;
	p->worker_len = h->ucx_len;
	st = behind ? pdx_ucx_ep_skip_to(a->ucx, h->ucx, h->ucx_len,
					 (uint32_t)h->sn)
		    : PDX_OK;
	if (st == PDX_EINVAL) {
		snprintf(err, errlen, "ucx endpoint to %s: its number %llu "
			 "is too far ahead of ours (%u)", p->addr,
			 (unsigned long long)h->sn,
			 pdx_ucx_ep_sn(a->ucx, h->ucx, h->ucx_len));
		return st;
	}
	if (st) {
		snprintf(err, errlen, "ucx endpoint to %s: %s", p->addr,
			 pdx_status_str(st));
		return st;
	}
	st = pdx_ucx_ep_new(a->ucx, h->ucx, h->ucx_len,
			    ep_reports_errors(a, h), peer_ep_error, p, &p->ep);
	if (st) {
		/* unreachable: UCX found no transport of ours that reaches
		 * one of its (UCX_TLS tcp on one host, sm,self on the
		 * other: a new user's find) */
		snprintf(err, errlen, "ucx endpoint to %s: %s%s", p->addr,
			 pdx_status_str(st),
			 st == PDX_EPEER ? " (no UCX transport of ours reaches "
					   "one of its: are UCX_TLS and "
					   "UCX_NET_DEVICES alike on both?)"
					 : "");
		return st;
	}
	p->regions = h->regions;
	p->n_regions = h->n_regions;
	h->regions = NULL;
	for (uint32_t i = 0; i < p->n_regions; i++) {
		/* a GPU region's rkey is empty where its UCX cannot register
		 * GPU memory */
		if (p->regions[i].cuda && h->rkeys[i].len == 0)
			continue;
		st = pdx_ucx_rkey_unpack(p->ep, h->rkeys[i].p, h->rkeys[i].len,
					 &p->regions[i].rkey);
		if (st) {
			snprintf(err, errlen, "rkey %u of %s: %s", i, p->addr,
				 pdx_status_str(st));
			return st;
		}
	}
	st = path_choose(a, p, h->staging, err, errlen);
	if (st)
		return st;
	p->state = PEER_READY;
	log_info("peer %s ready: %s, data by %s%s", p->addr,
		 p->same_host ? "same host" : "remote host",
		 data_path_name(p->path),
		 p->staged_shared ? ", its staging mapped here" : "");
	return PDX_OK;
}

/* {"op": "want", "xfer", "blocks": ours, "skip", "pull" when we read,
 * "to_instance": the sender's instance as its last hello said,
 * "renewed": true when our first want went to an earlier instance} */
static pdx_status_t send_want(struct agent *a, struct peer *p,
			      const struct xfer *x, bool renewed)
{
	struct peer_msg pm;

	peer_msg_begin(&pm, a, "want", &x->id, NULL);
	pdx_mp_msg_u64(&pm.m, "to_instance", p->instance);
	if (renewed)
		pdx_mp_msg_bool(&pm.m, "renewed", true);
	pdx_mp_msg_u32s(&pm.m, "blocks", x->blocks, x->n_blocks);
	pdx_mp_msg_u64(&pm.m, "skip", x->skip);
	if (x->pull)
		pdx_mp_msg_bool(&pm.m, "pull", true);
	if (x->group)
		pdx_mp_msg_xfer(&pm.m, "of", &x->group->id);
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
			xfer_fail(x, p->refusal_st, false,
				  "peer %s refused: %s", p->addr, p->refusal);
		} else if (p->state != PEER_READY) {
			continue;
		} else if (x->role == XFER_RECV && !x->want_sent) {
			/* with every block held here there is nothing to read */
			const char *why = x->pull && x->skip < x->n_blocks
						  ? pull_refusal(a, p)
						  : NULL;
			char leg_why[PDX_REASON_MAX];

			if (!why) {
				tp_order_slice(x, p);
				if (tp_peer_refusal(x, p, leg_why,
						    sizeof(leg_why))) {
					xfer_fail(x, PDX_EINCOMPAT, true, "%s",
						  leg_why);
					continue;
				}
			}
			if (why) {
				xfer_fail(x, PDX_EINCOMPAT, true,
					  "pull from %s: %s", p->addr, why);
				continue;
			}
			/* asked before, of an instance before this one */
			bool renewed = x->peer_instance &&
				       x->peer_instance != p->instance;

			x->want_sent = true;
			log_debug("want to %s%s", p->addr,
				  renewed ? " (renewed: it restarted)" : "");
			x->peer_instance = p->instance;
			if (send_want(a, p, x, renewed))
				xfer_fail(x, PDX_EPEER, false,
					  "cannot reach %s", p->addr);
		} else if (x->role == XFER_SEND) {
			push_try(x);
		}
	}
}

/* {"op": "hello_nack", "reason", "no_engine": true when we refused for
 * want of an engine}: the peer's transfers with us fail EPEER then (our
 * engine ended: our side's doing), else EINCOMPAT (the two do not pair) */
static void send_nack(struct agent *a, struct peer *p, pdx_status_t st,
		      const char *why)
{
	struct peer_msg pm;

	peer_msg_begin(&pm, a, "hello_nack", NULL, why);
	if (st == PDX_ENOTREG)
		pdx_mp_msg_bool(&pm.m, "no_engine", true);
	peer_msg_send(&pm, p);
}

void handshake_on_hello(struct agent *a, const char *from,
			const msgpack_object *m, bool is_ack)
{
	struct peer *p = peer_lookup(a, from, true);
	char err[PDX_REASON_MAX];
	struct hello h;
	pdx_status_t st;
	bool tell_sn, own;

	if (!p)
		return;
	p->heard_ns = pdx_now_ns(); /* first met through its hello: heard now */
	log_debug("%s from %s (state %d)", is_ack ? "hello_ack" : "hello", from,
		  p->state);
	st = hello_parse(m, &h, err, sizeof(err));
	if (!st)
		st = hello_check(a, p, &h, err, sizeof(err));
	if (!st)
		st = hello_apply(a, p, &h, err, sizeof(err));
	tell_sn = !st && is_ack && sn_behind_untold(a, p, &h);
	own = h.instance == a->instance; /* a nack would come back here */
	hello_free(&h);
	metrics_handshake(a, st == PDX_OK);
	/* our answer goes to its address: does it get there? (only for a
	 * hello we took: anyone may send one naming any address, and learn
	 * from our word what our connects there met) */
	if (!is_ack && !st && a->peer_return)
		a->peer_return->answered(a, p);
	if (st) {
		/* said once for each reason a peer is refused for: a peer
		 * whose hellos keep coming (its retries) says nothing new */
		if (strcmp(p->refusal, err))
			log_warn("handshake with %s refused: %s", from, err);
		else
			log_debug("handshake with %s refused again", from);
		peer_reset(a, p);
		if (!is_ack && !own)
			send_nack(a, p, st, err);
		else if (!own && !a->reg.ok)
			/* it took our hello, sent before our engine's end,
			 * and maps that engine's memory: the gone said at
			 * the end did not go to it (no handshake yet) */
			tell_gone(a, p);
		p->state = PEER_REFUSED;
		p->refusal_st = PDX_EINCOMPAT;
		snprintf(p->refusal, sizeof(p->refusal), "%s", err);
		p->rewant = REWANT_NONE; /* its transfers fail below */
	} else {
		p->refusal[0] = '\0'; /* a refusal after this is said again */
		if (!is_ack)
			send_hello(a, p, "hello_ack");
		else if (tell_sn) {
			log_info("peer %s: its UCX endpoint to us is numbered "
				 "below ours: our number goes in a hello",
				 p->addr);
			send_hello(a, p, "hello");
		}
		rewant_settle(a, p, is_ack);
	}
	xfers_peer_ready(a, p);
	if (p->state == PEER_REFUSED)
		peer_reset(a, p); /* the next transfer tries afresh */
}

void handshake_on_nack(struct agent *a, struct peer *p,
		       const msgpack_object *m)
{
	char reason[PDX_REASON_MAX] = "refused";
	bool no_engine = false;

	pdx_mp_get_str(m, "reason", reason, sizeof(reason));
	pdx_mp_get_bool(m, "no_engine", &no_engine);
	log_warn("handshake refused by %s: %s", p->addr, reason);
	metrics_handshake(a, false);
	peer_reset(a, p);
	p->rewant = REWANT_NONE; /* its transfers fail below */
	p->state = PEER_REFUSED;
	p->refusal_st = no_engine ? PDX_EPEER : PDX_EINCOMPAT;
	snprintf(p->refusal, sizeof(p->refusal), "%s", reason);
	xfers_peer_ready(a, p);
	peer_reset(a, p);
}
