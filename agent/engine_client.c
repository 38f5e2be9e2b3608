/* Engine client: the engine side of the engine link (docs/protocol.md,
 * section 1) over a ZeroMQ DEALER carrying one msgpack map per frame.
 *
 * The socket is created with ZMQ_IMMEDIATE, so a message is queued only on
 * a completed connection: a register made while the agent is away waits
 * (up to timeout_ms) for it, and any other call fails at once (PDX_EPEER),
 * instead of parking the message in a pipe that a later agent would read. A register that timed out therefore cannot be answered
 * by a stale "registered" much later, except when the agent got it but
 * answered too late; pdx_engine_register() drains such leftovers first.
 *
 * The link's own liveness. ZMTP heartbeats (liveness_ms / 4 apart, a
 * connection whose pings go unanswered for the rest of liveness_ms is
 * closed) and a socket monitor tell us when the agent goes away: its
 * process exits (the ipc connection closes at once) or freezes (stopped,
 * a stuck host: the heartbeat closes it; ZeroMQ's own thread answers
 * pings, so an agent whose loop is busy or stuck while its process runs
 * is not "away"). Either way what the agent said before it went is read
 * first, then every transfer announced on the link and not yet ended
 * fails at once with PDX_EAGENT, by an event made here, and what the
 * agent may still say about those transfers later is dropped: each
 * announced transfer ends in exactly one event, agent or no agent. The
 * client tracks the transfers in flight for that. Such a failure does
 * not mean nobody touches the blocks any more (engine.h).
 *
 * An agent that restarts (same address) has forgotten the registration.
 * The monitor also reports each connection whose handshake completed: the
 * first call after one (pdx_engine_next_event() included, which the fd
 * wakes for it) registers again, the same message waited for like
 * pdx_engine_register(), so the restarted agent serves the engine's next
 * transfer instead of failing it "not registered". Until then
 * announcements fail at once with PDX_EPEER and
 * pdx_engine_link_status() says why.
 */
#define PDX_LOG_TOPIC "engine"

#include <pdx/engine.h>

#include <errno.h>
#include <stdbool.h>
#include <sys/epoll.h>
#include <unistd.h>
#include <uthash.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/layout_mp.h"
#include "common/log.h"
#include "common/mp.h"

#define PROTOCOL_VERSION 1
#define DEFAULT_TIMEOUT_MS 10000
#define DEFAULT_LIVENESS_MS 1000
#define EVENT_QUEUE_MAX (1u << 20) /* events parked during register */
#define RCV_HWM 100000
#define SND_HWM 100000 /* a full queue means a stuck agent, not a burst */
#define SHM_NAME_MAX 255           /* NAME_MAX for shm_open() */

/* A transfer announced on the link whose event has not come yet. */
struct live_xfer {
	struct pdx_xfer_id id;
	uint64_t t_first_ns; /* announced */
	UT_hash_handle hh;
};

struct pdx_engine {
	void *ctx;
	void *sock;
	int timeout_ms;
	int liveness_ms;
	uint32_t xfer_timeout_ms;
	void *mon;         /* PAIR: the socket monitor's connection events */
	int efd;           /* epoll over both sockets' ZMQ_FDs: pdx_engine_fd() */
	void *reg;         /* the last accepted register message, to resend */
	size_t reg_len;
	char peer[PDX_ADDR_MAX]; /* what that register answered */
	bool up;           /* a connection's handshake completed, not lost since */
	bool registered;   /* that connection carries our register */
	uint64_t down_ns;  /* when the link was lost (0: never was) */
	uint64_t relink_ns; /* the last try to register again */
	bool registering;   /* that register is out, its answer to come */
	char why_down[PDX_REASON_MAX];
	struct live_xfer *live; /* announced, their event still to come */
	/* FIFO of events that arrived while register waited for its answer */
	struct pdx_engine_event *q;
	size_t q_cap;
	size_t q_head;
	size_t q_len;
};

/* ---- small helpers ---- */

static int remaining_ms(uint64_t deadline_ns)
{
	uint64_t now = pdx_now_ns();
	uint64_t left;

	if (now >= deadline_ns)
		return 0;
	left = (deadline_ns - now + 999999) / 1000000;
	return left > (uint64_t)INT32_MAX ? INT32_MAX : (int)left;
}

static bool peer_ok(const char *peer)
{
	size_t n;

	if (!peer)
		return false;
	n = strnlen(peer, PDX_ADDR_MAX);
	return n > 0 && n < PDX_ADDR_MAX;
}

/* Copies a str field, truncating it to outlen - 1 bytes. */
static int get_str_trunc(const msgpack_object *map, const char *key, char *out,
			 size_t outlen)
{
	const msgpack_object *o = pdx_mp_get(map, key);
	size_t n;

	if (!o || o->type != MSGPACK_OBJECT_STR || outlen == 0)
		return -1;
	n = o->via.str.size < outlen - 1 ? o->via.str.size : outlen - 1;
	memcpy(out, o->via.str.ptr, n);
	out[n] = '\0';
	return 0;
}

static int queue_push(struct pdx_engine *e, const struct pdx_engine_event *ev)
{
	if (e->q_len == e->q_cap) {
		size_t cap = e->q_cap ? e->q_cap * 2 : 16;
		struct pdx_engine_event *q;

		if (e->q_cap >= EVENT_QUEUE_MAX)
			return -1;
		q = malloc(cap * sizeof(*q));
		if (!q)
			return -1;
		/* unroll the ring into the new array */
		for (size_t i = 0; i < e->q_len; i++)
			q[i] = e->q[(e->q_head + i) % e->q_cap];
		free(e->q);
		e->q = q;
		e->q_cap = cap;
		e->q_head = 0;
	}
	e->q[(e->q_head + e->q_len) % e->q_cap] = *ev;
	e->q_len++;
	return 0;
}

static bool queue_pop(struct pdx_engine *e, struct pdx_engine_event *ev)
{
	if (!e->q_len)
		return false;
	*ev = e->q[e->q_head];
	e->q_head = (e->q_head + 1) % e->q_cap;
	e->q_len--;
	return true;
}

/* ---- transfers in flight ---- */

static bool live_has(struct pdx_engine *e, const struct pdx_xfer_id *x)
{
	struct live_xfer *t;

	HASH_FIND(hh, e->live, x->b, sizeof(x->b), t);
	return t != NULL;
}

/* Takes t (made by the caller before announcing x, so that nothing can
 * fail after the announcement went out). */
static void live_add(struct pdx_engine *e, struct live_xfer *t,
		     const struct pdx_xfer_id *x)
{
	t->id = *x;
	t->t_first_ns = pdx_now_ns();
	HASH_ADD(hh, e->live, id.b, sizeof(t->id.b), t);
}

/* Takes x off the transfers in flight; false when it was not there. */
static bool live_take(struct pdx_engine *e, const struct pdx_xfer_id *x)
{
	struct live_xfer *t;

	HASH_FIND(hh, e->live, x->b, sizeof(x->b), t);
	if (!t)
		return false;
	HASH_DEL(e->live, t);
	free(t);
	return true;
}

/* An event read while something else is awaited, for a later
 * pdx_engine_next_event(); one for a transfer no longer in flight here
 * (the link was lost, its event made here) is dropped. */
static void keep_event(struct pdx_engine *e, const struct pdx_engine_event *ev)
{
	if (!live_take(e, &ev->xfer))
		log_debug("dropped an event for a transfer not in flight");
	else if (queue_push(e, ev))
		log_error("event queue full: an event was lost");
}

static pdx_status_t drain_to_queue(struct pdx_engine *e);

/* ---- the link's liveness ---- */

/* The agent went away: every transfer in flight fails now, by an event
 * of ours (the agent's own about them, if it ever comes, is dropped). */
static void link_lost(struct pdx_engine *e)
{
	struct live_xfer *t, *tmp;
	unsigned n = 0;

	e->up = false;
	e->registered = false;
	e->registering = false;
	e->down_ns = pdx_now_ns();
	snprintf(e->why_down, sizeof(e->why_down),
		 "the link to the agent was lost (the agent exited, restarted "
		 "or did not answer heartbeats for %d ms)",
		 e->liveness_ms);
	HASH_ITER(hh, e->live, t, tmp)
	{
		struct pdx_engine_event ev = {
		    .xfer = t->id,
		    .kind = PDX_EVENT_FAILED,
		    .status = PDX_EAGENT,
		    .t_first_ns = t->t_first_ns,
		    .t_last_ns = e->down_ns,
		    .first_token = -1,
		};

		snprintf(ev.reason, sizeof(ev.reason), "%s", e->why_down);
		if (queue_push(e, &ev))
			log_error("event queue full: an event was lost");
		HASH_DEL(e->live, t);
		free(t);
		n++;
	}
	log_warn("%s; %u transfers in flight failed", e->why_down, n);
}

/* Reads the link's monitor: a connection whose handshake completed
 * brings the link up (not registered on it yet), a closed one takes it
 * down. */
static void link_watch(struct pdx_engine *e)
{
	for (;;) {
		zmq_msg_t msg;
		int more = 0;
		size_t sz = sizeof(more);
		uint16_t ev = 0;

		zmq_msg_init(&msg);
		if (zmq_msg_recv(&msg, e->mon, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&msg);
			if (errno == EINTR)
				continue;
			return;
		}
		if (zmq_msg_size(&msg) >= sizeof(ev))
			memcpy(&ev, zmq_msg_data(&msg), sizeof(ev));
		if (zmq_getsockopt(e->mon, ZMQ_RCVMORE, &more, &sz) == 0 && more)
			zmq_msg_recv(&msg, e->mon, 0); /* the endpoint */
		zmq_msg_close(&msg);
		if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
			e->up = true;
			e->registered = false;
			snprintf(e->why_down, sizeof(e->why_down),
				 "the agent is back; registering again");
		} else if (ev == ZMQ_EVENT_DISCONNECTED && e->up) {
			/* what it said before it went still counts */
			drain_to_queue(e);
			link_lost(e);
		}
	}
}

/* ---- the socket ---- */

/* Sends one frame. register waits up to timeout_ms for room (or a
 * connection); everything else returns at once, PDX_EPEER when the agent
 * is away: an engine calls these on its event loop, which must not stop
 * for timeout_ms per message while its agent is dead. */
static pdx_status_t send_frame(struct pdx_engine *e, const void *buf, size_t len,
			       bool wait)
{
	uint64_t deadline = pdx_now_ns() + (uint64_t)e->timeout_ms * 1000000ULL;

	for (;;) {
		zmq_pollitem_t it = { e->sock, 0, ZMQ_POLLOUT, 0 };
		int left;

		if (zmq_send(e->sock, buf, len, ZMQ_DONTWAIT) >= 0)
			return PDX_OK;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN) {
			log_error("send to agent: %s", zmq_strerror(errno));
			return PDX_EIO;
		}
		if (!wait) {
			log_warn("send to agent: not connected, or %d messages queued",
				 SND_HWM);
			return PDX_EPEER;
		}
		left = remaining_ms(deadline);
		if (left == 0) {
			log_warn("send to agent: not connected or queue full after %d ms",
				 e->timeout_ms);
			return PDX_ETIMEDOUT;
		}
		if (zmq_poll(&it, 1, left) < 0 && errno != EINTR) {
			log_error("poll agent socket: %s", zmq_strerror(errno));
			return PDX_EIO;
		}
	}
}

static void relink(struct pdx_engine *e);

/* Every message but register: after a reconnection, register first;
 * while the agent is away (or has not taken our register again), fail at
 * once. */
static pdx_status_t send_out(struct pdx_engine *e, struct pdx_mp_out *o)
{
	pdx_status_t st = PDX_EPEER;

	relink(e);
	if (!e->reg || (e->up && e->registered))
		st = send_frame(e, o->buf.data, o->buf.size, false);
	pdx_mp_out_free(o);
	return st;
}

/* Receives one whole message without waiting. Returns 1 with *msg set (the
 * caller closes it), 0 when nothing is there, -1 on a socket failure. A
 * message of more than one frame is dropped (and 0 or the next one is
 * tried): the protocol has single-frame messages only. */
static int recv_frame(struct pdx_engine *e, zmq_msg_t *msg)
{
	for (;;) {
		int more = 0;
		size_t sz = sizeof(more);

		zmq_msg_init(msg);
		if (zmq_msg_recv(msg, e->sock, ZMQ_DONTWAIT) < 0) {
			int err = errno;

			zmq_msg_close(msg);
			if (err == EAGAIN)
				return 0;
			if (err == EINTR)
				continue;
			log_error("receive from agent: %s", zmq_strerror(err));
			return -1;
		}
		if (zmq_getsockopt(e->sock, ZMQ_RCVMORE, &more, &sz) == 0 && more) {
			/* drain and drop the rest of a multi-frame message */
			do {
				zmq_msg_close(msg);
				zmq_msg_init(msg);
				if (zmq_msg_recv(msg, e->sock, 0) < 0)
					break;
				sz = sizeof(more);
				if (zmq_getsockopt(e->sock, ZMQ_RCVMORE, &more, &sz))
					more = 0;
			} while (more);
			zmq_msg_close(msg);
			log_warn("dropped a multi-frame message from the agent");
			continue;
		}
		return 1;
	}
}

/* Reads an "event" map into *ev; -1 when a required field is missing. */
static int parse_event(const msgpack_object *m, struct pdx_engine_event *ev)
{
	char kind[16];
	int64_t status;

	memset(ev, 0, sizeof(*ev));
	if (pdx_mp_get_xfer(m, "xfer", &ev->xfer) ||
	    pdx_mp_get_str(m, "kind", kind, sizeof(kind)) ||
	    pdx_mp_get_i64(m, "status", &status) ||
	    get_str_trunc(m, "reason", ev->reason, sizeof(ev->reason)) ||
	    pdx_mp_get_u64(m, "bytes", &ev->bytes) ||
	    pdx_mp_get_u64(m, "t_first", &ev->t_first_ns) ||
	    pdx_mp_get_u64(m, "t_last", &ev->t_last_ns))
		return -1;
	if (strcmp(kind, "sent") == 0)
		ev->kind = PDX_EVENT_SENT;
	else if (strcmp(kind, "received") == 0)
		ev->kind = PDX_EVENT_RECEIVED;
	else if (strcmp(kind, "failed") == 0)
		ev->kind = PDX_EVENT_FAILED;
	else
		return -1;
	if (status < -100000 || status > 0)
		return -1;
	ev->status = (pdx_status_t)status;
	if (pdx_mp_get_i64(m, "first_token", &ev->first_token) ||
	    ev->first_token < 0 || ev->first_token > UINT32_MAX)
		ev->first_token = -1; /* optional; older agents lack it */
	/* a failure always carries a failure status */
	if (ev->kind == PDX_EVENT_FAILED && ev->status == PDX_OK)
		ev->status = PDX_EIO;
	return 0;
}

enum msg_kind { MSG_SKIP, MSG_EVENT, MSG_OTHER };

/* Classifies a received frame. For "event" fills *ev; for anything else
 * that parses, leaves the parsed message in *up (caller destroys) and the op
 * in op. */
static enum msg_kind classify(zmq_msg_t *msg, msgpack_unpacked *up, char *op,
			      size_t oplen, struct pdx_engine_event *ev)
{
	if (pdx_mp_parse(zmq_msg_data(msg), zmq_msg_size(msg), up, op, oplen)) {
		log_warn("skipped a malformed message from the agent (%zu bytes)",
			 zmq_msg_size(msg));
		return MSG_SKIP;
	}
	if (strcmp(op, "event") == 0) {
		if (parse_event(&up->data, ev)) {
			log_warn("skipped a malformed event from the agent");
			return MSG_SKIP;
		}
		return MSG_EVENT;
	}
	return MSG_OTHER;
}

/* ---- the API ---- */

/* One fd for the engine's loop: readable when either socket (messages,
 * or the monitor's connection events) may have something. */
static int watch_both(struct pdx_engine *e)
{
	void *socks[2] = {e->sock, e->mon};

	e->efd = epoll_create1(EPOLL_CLOEXEC);
	if (e->efd < 0)
		return -1;
	for (int i = 0; i < 2; i++) {
		struct epoll_event ev = {.events = EPOLLIN};
		int fd = -1;
		size_t sz = sizeof(fd);

		if (zmq_getsockopt(socks[i], ZMQ_FD, &fd, &sz) ||
		    epoll_ctl(e->efd, EPOLL_CTL_ADD, fd, &ev))
			return -1;
	}
	return 0;
}

pdx_status_t pdx_engine_connect(const struct pdx_engine_params *params,
				struct pdx_engine **out)
{
	struct pdx_engine *e;
	int linger = 0, immediate = 1, hwm = RCV_HWM, shwm = SND_HWM;
	int hb_ivl, hb_timeout;
	char mon[64];

	if (!out)
		return PDX_EINVAL;
	*out = NULL;
	if (!params || !params->agent || !params->agent[0] ||
	    strnlen(params->agent, PDX_ADDR_MAX) >= PDX_ADDR_MAX ||
	    params->timeout_ms < 0 || params->liveness_ms < 0)
		return PDX_EINVAL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return PDX_ENOMEM;
	e->efd = -1;
	e->timeout_ms = params->timeout_ms ? params->timeout_ms : DEFAULT_TIMEOUT_MS;
	e->liveness_ms =
	    params->liveness_ms ? params->liveness_ms : DEFAULT_LIVENESS_MS;
	/* a ping every quarter; one unanswered for the rest closes the link */
	hb_ivl = e->liveness_ms / 4 ? e->liveness_ms / 4 : 1;
	hb_timeout = e->liveness_ms - hb_ivl ? e->liveness_ms - hb_ivl : 1;
	snprintf(e->why_down, sizeof(e->why_down),
		 "no connection to the agent at %s yet", params->agent);
	e->xfer_timeout_ms = params->xfer_timeout_ms;
	e->ctx = zmq_ctx_new();
	if (!e->ctx) {
		free(e);
		return PDX_ENOMEM;
	}
	e->sock = zmq_socket(e->ctx, ZMQ_DEALER);
	if (!e->sock ||
	    zmq_setsockopt(e->sock, ZMQ_LINGER, &linger, sizeof(linger)) ||
	    zmq_setsockopt(e->sock, ZMQ_IMMEDIATE, &immediate, sizeof(immediate)) ||
	    zmq_setsockopt(e->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm)) ||
	    zmq_setsockopt(e->sock, ZMQ_SNDHWM, &shwm, sizeof(shwm)) ||
	    zmq_setsockopt(e->sock, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof(hb_ivl)) ||
	    zmq_setsockopt(e->sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout,
			   sizeof(hb_timeout))) {
		log_error("engine socket: %s", zmq_strerror(errno));
		pdx_engine_free(e);
		return PDX_EIO;
	}
	snprintf(mon, sizeof(mon), "inproc://pdx-engine-monitor-%p", (void *)e);
	e->mon = zmq_socket(e->ctx, ZMQ_PAIR);
	if (!e->mon ||
	    zmq_setsockopt(e->mon, ZMQ_LINGER, &linger, sizeof(linger)) ||
	    zmq_socket_monitor(e->sock, mon,
			       ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
				   ZMQ_EVENT_DISCONNECTED) ||
	    zmq_connect(e->mon, mon)) {
		log_error("engine socket monitor: %s", zmq_strerror(errno));
		pdx_engine_free(e);
		return PDX_EIO;
	}
	if (watch_both(e)) {
		log_error("engine link fd: %s", strerror(errno));
		pdx_engine_free(e);
		return PDX_EIO;
	}
	if (zmq_connect(e->sock, params->agent)) {
		log_error("connect to agent at %s: %s", params->agent,
			  zmq_strerror(errno));
		pdx_engine_free(e);
		return errno == EINVAL || errno == EPROTONOSUPPORT ? PDX_EINVAL :
								     PDX_EIO;
	}
	*out = e;
	return PDX_OK;
}

void pdx_engine_free(struct pdx_engine *e)
{
	struct live_xfer *t, *tmp;

	if (!e)
		return;
	if (e->mon)
		zmq_close(e->mon);
	if (e->sock) {
		zmq_socket_monitor(e->sock, NULL, 0);
		zmq_close(e->sock);
	}
	if (e->ctx)
		zmq_ctx_term(e->ctx);
	if (e->efd >= 0)
		close(e->efd);
	HASH_ITER(hh, e->live, t, tmp)
	{
		HASH_DEL(e->live, t);
		free(t);
	}
	free(e->q);
	free(e->reg);
	free(e);
}

static pdx_status_t check_regions(const struct pdx_engine_region *regions,
				  size_t n_regions, uint64_t *sizes)
{
	for (size_t i = 0; i < n_regions; i++) {
		const struct pdx_engine_region *r = &regions[i];

		if (r->size == 0) {
			log_error("region %zu: needs a size", i);
			return PDX_EINVAL;
		}
		if (r->type == PDX_MEM_CUDA) {
			if (r->cuda_device < 0) {
				log_error("region %zu: cuda device %d", i,
					  r->cuda_device);
				return PDX_EINVAL;
			}
		} else if (r->type != PDX_MEM_SHM || !r->shm_name ||
			   !r->shm_name[0] ||
			   strnlen(r->shm_name, SHM_NAME_MAX + 1) > SHM_NAME_MAX) {
			log_error("region %zu: needs type shm or cuda, and an shm name", i);
			return PDX_EINVAL;
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

static bool on_other(struct pdx_engine *e, const msgpack_object *m,
		     const char *op, struct pdx_engine_event *ev);

/* Takes whatever is already waiting: events go to the queue, and so does
 * the event made of a refused announcement (on_other); anything else (a
 * late answer to an earlier register) is dropped. */
static pdx_status_t drain_to_queue(struct pdx_engine *e)
{
	for (;;) {
		struct pdx_engine_event ev;
		msgpack_unpacked up;
		zmq_msg_t msg;
		char op[32];
		int rc = recv_frame(e, &msg);

		if (rc < 0)
			return PDX_EIO;
		if (rc == 0)
			return PDX_OK;
		switch (classify(&msg, &up, op, sizeof(op), &ev)) {
		case MSG_EVENT:
			keep_event(e, &ev);
			break;
		case MSG_OTHER:
			if (on_other(e, &up.data, op, &ev) && queue_push(e, &ev))
				log_error("event queue full: an event was lost");
			break;
		case MSG_SKIP:
			break;
		}
		msgpack_unpacked_destroy(&up);
		zmq_msg_close(&msg);
	}
}

/* Reads an answer to register: returns 1 with *st set for "registered" and
 * "error", 0 for anything else (a message register does not wait for). */
static int register_answer(const msgpack_object *m, const char *op,
			   char *peer_addr, size_t peer_addr_len,
			   pdx_status_t *st)
{
	char peer[PDX_ADDR_MAX], reason[PDX_REASON_MAX];
	int64_t status;

	if (strcmp(op, "registered") == 0) {
		if (pdx_mp_get_str(m, "peer", peer, sizeof(peer)) || !peer[0]) {
			log_error("register: answer without a peer address");
			*st = PDX_EIO;
		} else if (peer_addr && strlen(peer) >= peer_addr_len) {
			*st = PDX_ETOOBIG;
		} else {
			if (peer_addr)
				memcpy(peer_addr, peer, strlen(peer) + 1);
			*st = PDX_OK;
		}
		return 1;
	}
	if (strcmp(op, "error") == 0) {
		char refused[32];

		/* an answer to something else (older agents name nothing) */
		if (!pdx_mp_get_str(m, "refused", refused, sizeof(refused)) &&
		    strcmp(refused, "register") != 0) {
			log_debug("register: ignored an error about \"%s\"",
				  refused);
			return 0;
		}
		if (get_str_trunc(m, "reason", reason, sizeof(reason)))
			snprintf(reason, sizeof(reason), "(no reason)");
		if (pdx_mp_get_i64(m, "status", &status) || status >= 0 ||
		    status < -100000)
			status = PDX_EIO;
		log_error("register refused by the agent: %s (%s)", reason,
			  pdx_status_str((pdx_status_t)status));
		*st = (pdx_status_t)status;
		return 1;
	}
	log_debug("register: ignored \"%s\" from the agent", op);
	return 0;
}

/* Sends a packed register and waits for its answer; events that come
 * meanwhile are queued. */
static pdx_status_t register_exchange(struct pdx_engine *e, const void *buf,
				      size_t len, char *peer_addr,
				      size_t peer_addr_len)
{
	uint64_t deadline = pdx_now_ns() + (uint64_t)e->timeout_ms * 1000000ULL;
	pdx_status_t st;

	st = drain_to_queue(e);
	if (st == PDX_OK)
		st = send_frame(e, buf, len, true);
	if (st != PDX_OK)
		return st;
	for (;;) {
		zmq_pollitem_t it = { e->sock, 0, ZMQ_POLLIN, 0 };
		struct pdx_engine_event ev;
		msgpack_unpacked up;
		zmq_msg_t msg;
		char op[32];
		int rc, left;

		rc = recv_frame(e, &msg);
		if (rc < 0)
			return PDX_EIO;
		if (rc == 0) {
			left = remaining_ms(deadline);
			if (left == 0) {
				log_warn("register: no answer from the agent in %d ms",
					 e->timeout_ms);
				return PDX_ETIMEDOUT;
			}
			if (zmq_poll(&it, 1, left) < 0 && errno != EINTR)
				return PDX_EIO;
			continue;
		}
		rc = 0;
		switch (classify(&msg, &up, op, sizeof(op), &ev)) {
		case MSG_SKIP:
			break;
		case MSG_EVENT:
			keep_event(e, &ev);
			break;
		case MSG_OTHER:
			rc = register_answer(&up.data, op, e->peer,
					     sizeof(e->peer), &st);
			if (!rc && on_other(e, &up.data, op, &ev) &&
			    queue_push(e, &ev))
				log_error("event queue full: an event was lost");
			break;
		}
		msgpack_unpacked_destroy(&up);
		zmq_msg_close(&msg);
		if (!rc)
			continue;
		/* the handshake of the connection the register went out on was
		 * reported long before its answer came: it carries our register
		 * (a refused one leaves the agent's as it was) */
		link_watch(e);
		if (st == PDX_OK)
			e->registered = e->up;
		if (st == PDX_OK && peer_addr) {
			if (strlen(e->peer) >= peer_addr_len)
				return PDX_ETOOBIG;
			memcpy(peer_addr, e->peer, strlen(e->peer) + 1);
		}
		return st;
	}
}

/* The answer to the register relink() sent again. */
static void relinked(struct pdx_engine *e, pdx_status_t st, const char *was)
{
	e->registering = false;
	if (st != PDX_OK) {
		log_error("registering again: %s", pdx_status_str(st));
		snprintf(e->why_down, sizeof(e->why_down),
			 "the agent is back but registering again failed: %s",
			 pdx_status_str(st));
		return;
	}
	e->registered = e->up;
	e->relink_ns = 0; /* the next restart is met at once */
	log_info("registered again with the agent");
	if (strcmp(was, e->peer) != 0)
		log_warn("the agent's peer address is now %s (was %s)", e->peer,
			 was);
}

/* A message that is not an event: the answer to a register sent again,
 * or an error refusing an announcement, which ends that transfer (its one
 * event, made here: true with *ev set). Anything else is dropped. */
static bool on_other(struct pdx_engine *e, const msgpack_object *m,
		     const char *op, struct pdx_engine_event *ev)
{
	char refused[16] = "", was[PDX_ADDR_MAX];
	pdx_status_t st;
	int64_t status;

	if (e->registering) {
		memcpy(was, e->peer, sizeof(was));
		if (register_answer(m, op, e->peer, sizeof(e->peer), &st)) {
			relinked(e, st, was);
			return false;
		}
	}
	if (strcmp(op, "error") != 0 ||
	    pdx_mp_get_str(m, "refused", refused, sizeof(refused)) ||
	    (strcmp(refused, "send") != 0 && strcmp(refused, "recv") != 0) ||
	    pdx_mp_get_xfer(m, "xfer", &ev->xfer) || !live_has(e, &ev->xfer)) {
		log_debug("ignored \"%s\" from the agent", op);
		return false;
	}
	live_take(e, &ev->xfer);
	ev->kind = PDX_EVENT_FAILED;
	ev->status = pdx_mp_get_i64(m, "status", &status) || status >= 0 ||
				 status < -100000
			 ? PDX_EIO
			 : (pdx_status_t)status;
	ev->bytes = 0;
	ev->t_first_ns = ev->t_last_ns = pdx_now_ns();
	ev->first_token = -1;
	if (get_str_trunc(m, "reason", ev->reason, sizeof(ev->reason)))
		snprintf(ev->reason, sizeof(ev->reason), "refused by the agent");
	return true;
}

/* Registers again on a new connection to the agent (it restarted): the
 * restarted agent has no registration, and would fail what we say next.
 * The register goes out without waiting (the engine's loop never waits
 * for its agent); its answer is read like an event (on_other), until then
 * announcements fail at once. */
static void relink(struct pdx_engine *e)
{
	uint64_t now;

	link_watch(e);
	if (!e->reg || !e->up || e->registered)
		return;
	now = pdx_now_ns();
	if (e->registering &&
	    now - e->relink_ns < (uint64_t)e->timeout_ms * 1000000ULL)
		return; /* its answer is to come */
	if (e->registering)
		log_warn("registering again: no answer in %d ms", e->timeout_ms);
	/* a refusal (or no answer) is not asked again at every call: once
	 * per liveness */
	else if (e->relink_ns &&
		 now - e->relink_ns < (uint64_t)e->liveness_ms * 1000000ULL)
		return;
	e->registering = false;
	e->relink_ns = now;
	if (drain_to_queue(e) != PDX_OK ||
	    send_frame(e, e->reg, e->reg_len, false) != PDX_OK)
		return;
	log_info("the agent link connected again: registering again");
	e->registering = true;
}

pdx_status_t pdx_engine_register(struct pdx_engine *e,
				 const struct pdx_kv_layout *layout,
				 const struct pdx_engine_region *regions,
				 size_t n_regions, char *peer_addr,
				 size_t peer_addr_len)
{
	return pdx_engine_register_cuda(e, layout, regions, n_regions, NULL,
					peer_addr, peer_addr_len);
}

pdx_status_t pdx_engine_register_cuda(struct pdx_engine *e,
				      const struct pdx_kv_layout *layout,
				      const struct pdx_engine_region *regions,
				      size_t n_regions,
				      const struct pdx_engine_cuda_events *ev,
				      char *peer_addr, size_t peer_addr_len)
{
	struct pdx_mp_out o;
	uint64_t *sizes, n_ev = 0;
	char err[256];
	pdx_status_t st;

	if (!e || !layout || !layout->layer || !regions || n_regions == 0 ||
	    n_regions > PDX_MAX_REGIONS || (peer_addr && peer_addr_len == 0))
		return PDX_EINVAL;
	if (ev) {
		n_ev = (uint64_t)ev->slots * layout->layers;
		if (!ev->handles || ev->slots == 0 || ev->slots > 64)
			return PDX_EINVAL;
	}
	sizes = calloc(n_regions, sizeof(*sizes));
	if (!sizes)
		return PDX_ENOMEM;
	st = check_regions(regions, n_regions, sizes);
	if (st == PDX_OK) {
		st = pdx_kv_layout_check(layout, sizes, n_regions, err, sizeof(err));
		if (st != PDX_OK)
			log_error("register: layout refused: %s", err);
	}
	free(sizes);
	if (st != PDX_OK)
		return st;

	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, ev ? 6 : 4);
	pdx_mp_kv_str(&o.pk, "op", "register");
	pdx_mp_kv_u64(&o.pk, "v", PROTOCOL_VERSION);
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
	st = register_exchange(e, o.buf.data, o.buf.size, peer_addr,
			       peer_addr_len);
	if (st == PDX_OK) {
		free(e->reg);
		e->reg = malloc(o.buf.size);
		e->reg_len = e->reg ? o.buf.size : 0;
		if (e->reg)
			memcpy(e->reg, o.buf.data, o.buf.size);
	}
	pdx_mp_out_free(&o);
	return st;
}

static pdx_status_t announce(struct pdx_engine *e, const char *op,
			     const struct pdx_xfer_id *xfer, const char *peer,
			     const uint32_t *blocks, size_t n_blocks,
			     bool with_skip, uint32_t skip_tokens)
{
	struct pdx_mp_out o;
	struct live_xfer *t;
	pdx_status_t st;

	/* a send may leave its receiver open: the first to claim it */
	if (!e || !xfer || !(peer ? peer_ok(peer) : op[0] == 's') || !blocks ||
	    n_blocks == 0 || n_blocks > UINT32_MAX)
		return PDX_EINVAL;
	if (live_has(e, xfer))
		return PDX_EEXIST; /* the one in flight goes on */
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, 3 + (peer != NULL) + (with_skip ? 1 : 0) +
					(e->xfer_timeout_ms ? 1 : 0));
	pdx_mp_kv_str(&o.pk, "op", op);
	pdx_mp_kv_xfer(&o.pk, "xfer", xfer);
	if (peer)
		pdx_mp_kv_str(&o.pk, "peer", peer);
	pdx_mp_kv_u32s(&o.pk, "blocks", blocks, n_blocks);
	if (with_skip)
		pdx_mp_kv_u64(&o.pk, "skip_tokens", skip_tokens);
	if (e->xfer_timeout_ms)
		pdx_mp_kv_u64(&o.pk, "timeout_ms", e->xfer_timeout_ms);
	/* In flight only once it went out: send_out() may first find the
	 * link lost, which fails what is in flight (and this must not be:
	 * it fails here, by its return). */
	t = calloc(1, sizeof(*t));
	if (!t) {
		pdx_mp_out_free(&o);
		return PDX_ENOMEM;
	}
	st = send_out(e, &o);
	if (st == PDX_OK)
		live_add(e, t, xfer);
	else
		free(t);
	return st;
}

pdx_status_t pdx_engine_send(struct pdx_engine *e, const struct pdx_xfer_id *xfer,
			     const char *peer, const uint32_t *blocks,
			     size_t n_blocks)
{
	return announce(e, "send", xfer, peer, blocks, n_blocks, false, 0);
}

pdx_status_t pdx_engine_recv(struct pdx_engine *e, const struct pdx_xfer_id *xfer,
			     const char *peer, const uint32_t *blocks,
			     size_t n_blocks, uint32_t skip_tokens)
{
	return announce(e, "recv", xfer, peer, blocks, n_blocks,
			skip_tokens != 0, skip_tokens);
}

pdx_status_t pdx_engine_layer_done(struct pdx_engine *e, uint32_t layer,
				   const struct pdx_xfer_id *xfers, size_t n)
{
	return pdx_engine_layer_done_slot(e, layer, UINT32_MAX, xfers, n);
}

/* slot UINT32_MAX: no event to wait on. */
pdx_status_t pdx_engine_layer_done_slot(struct pdx_engine *e, uint32_t layer,
					uint32_t slot,
					const struct pdx_xfer_id *xfers,
					size_t n)
{
	struct pdx_mp_out o;
	bool with_slot = slot != UINT32_MAX;

	if (!e || !xfers || n == 0 || n > UINT32_MAX || layer >= PDX_MAX_LAYERS)
		return PDX_EINVAL;
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, with_slot ? 4 : 3);
	pdx_mp_kv_str(&o.pk, "op", "layer_done");
	pdx_mp_kv_u64(&o.pk, "layer", layer);
	if (with_slot)
		pdx_mp_kv_u64(&o.pk, "slot", slot);
	pdx_mp_str(&o.pk, "xfers");
	msgpack_pack_array(&o.pk, n);
	for (size_t i = 0; i < n; i++)
		pdx_mp_bin(&o.pk, xfers[i].b, sizeof(xfers[i].b));
	return send_out(e, &o);
}

pdx_status_t pdx_engine_token(struct pdx_engine *e,
			      const struct pdx_xfer_id *xfer, uint32_t token)
{
	struct pdx_mp_out o;

	if (!e || !xfer)
		return PDX_EINVAL;
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, 3);
	pdx_mp_kv_str(&o.pk, "op", "token");
	pdx_mp_kv_xfer(&o.pk, "xfer", xfer);
	pdx_mp_kv_u64(&o.pk, "token", token);
	return send_out(e, &o);
}

/* {op, xfer, peer?}: the messages about a transfer by id alone. */
static pdx_status_t send_xfer_op(struct pdx_engine *e, const char *op,
				 const struct pdx_xfer_id *xfer,
				 const char *peer)
{
	struct pdx_mp_out o;

	if (!e || !xfer || (peer && strlen(peer) >= PDX_ADDR_MAX))
		return PDX_EINVAL;
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, peer ? 3 : 2);
	pdx_mp_kv_str(&o.pk, "op", op);
	pdx_mp_kv_xfer(&o.pk, "xfer", xfer);
	if (peer)
		pdx_mp_kv_str(&o.pk, "peer", peer);
	return send_out(e, &o);
}

pdx_status_t pdx_engine_hold(struct pdx_engine *e,
			     const struct pdx_xfer_id *xfer, const char *peer)
{
	if (!peer)
		return PDX_EINVAL;
	return send_xfer_op(e, "hold", xfer, peer);
}

pdx_status_t pdx_engine_abort(struct pdx_engine *e,
			      const struct pdx_xfer_id *xfer)
{
	return send_xfer_op(e, "abort", xfer, NULL);
}

pdx_status_t pdx_engine_abort_at(struct pdx_engine *e,
				 const struct pdx_xfer_id *xfer,
				 const char *peer)
{
	return send_xfer_op(e, "abort", xfer, peer);
}

int pdx_engine_fd(const struct pdx_engine *e)
{
	return e ? e->efd : -1;
}

pdx_status_t pdx_engine_link_status(const struct pdx_engine *e, char *reason,
				    size_t reason_len)
{
	uint64_t ago_ms;

	if (!e)
		return PDX_EINVAL;
	if (e->up && (e->registered || !e->reg))
		return PDX_OK;
	if (reason && reason_len) {
		if (e->up || !e->down_ns) {
			snprintf(reason, reason_len, "%s", e->why_down);
		} else {
			ago_ms = (pdx_now_ns() - e->down_ns) / 1000000;
			snprintf(reason, reason_len, "%s, %llu ms ago",
				 e->why_down, (unsigned long long)ago_ms);
		}
	}
	return PDX_EPEER;
}

pdx_status_t pdx_engine_next_event(struct pdx_engine *e,
				   struct pdx_engine_event *ev)
{
	if (!e || !ev)
		return PDX_EINVAL;
	/* a new connection wakes the link's fd too: a restarted agent gets
	 * the registration at once, before its peers ask it for our KV */
	relink(e);
	if (queue_pop(e, ev))
		return PDX_OK;
	for (;;) {
		msgpack_unpacked up;
		zmq_msg_t msg;
		char op[32];
		enum msg_kind k;
		bool made;
		int rc = recv_frame(e, &msg);

		if (rc < 0)
			return PDX_EIO;
		if (rc == 0)
			return PDX_EAGAIN;
		k = classify(&msg, &up, op, sizeof(op), ev);
		made = k == MSG_OTHER && on_other(e, &up.data, op, ev);
		msgpack_unpacked_destroy(&up);
		zmq_msg_close(&msg);
		if (made || (k == MSG_EVENT && live_take(e, &ev->xfer)))
			return PDX_OK;
		if (k == MSG_EVENT)
			log_debug("dropped an event for a transfer not in flight");
	}
}

pdx_status_t pdx_engine_wait_event(struct pdx_engine *e, int timeout_ms,
				   struct pdx_engine_event *ev)
{
	uint64_t deadline = 0;

	if (!e || !ev || timeout_ms < -1)
		return PDX_EINVAL;
	if (timeout_ms >= 0)
		deadline = pdx_now_ns() + (uint64_t)timeout_ms * 1000000ULL;
	for (;;) {
		zmq_pollitem_t it[2] = {{e->sock, 0, ZMQ_POLLIN, 0},
					{e->mon, 0, ZMQ_POLLIN, 0}};
		pdx_status_t st = pdx_engine_next_event(e, ev);
		int left = -1;

		if (st != PDX_EAGAIN)
			return st;
		if (timeout_ms >= 0) {
			left = remaining_ms(deadline);
			if (left == 0)
				return PDX_ETIMEDOUT;
		}
		if (zmq_poll(it, 2, left) < 0 && errno != EINTR) {
			log_error("poll agent socket: %s", zmq_strerror(errno));
			return PDX_EIO;
		}
	}
}
