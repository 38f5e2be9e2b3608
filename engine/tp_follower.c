/* A follower rank: the leader's passes and transfer actions on its own
 * pool and agent. */
#define PDX_LOG_TOPIC "tp"
#include "engine/tp_follower.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/stall.h"
#include "engine/tp_wire.h"

/* One transfer of its agent's, from the leader's SEND or RECV to its
 * event. */
struct xfer {
	LIST_ENTRY(xfer) link;
	struct pdx_tp_follower *f;
	struct pdx_kv_waiter w;
	bool recv;
	uint32_t *blocks, n_blocks; /* taken from the message */
	uint32_t *tokens, n_tokens; /* recv: the prompt */
};

struct pdx_tp_follower {
	struct pdx_tp_follower_params p;
	void *zctx, *sock;
	struct event *ev, *tick;
	uint64_t heard_ns; /* 0: nothing from the leader yet */
	uint64_t waited_ns; /* until then: when the wait was last said */
	uint64_t tick_ns;  /* when on_tick last ran */
	bool failed;
	LIST_HEAD(, xfer) xfers;
};

static void send_msg(struct pdx_tp_follower *f, const struct pdx_tp_msg *m)
{
	uint8_t *buf;
	size_t len;

	if (pdx_tp_msg_encode(m, &buf, &len) != PDX_OK) {
		log_error("out of memory for a message to the leader");
		return;
	}
	if (zmq_send(f->sock, buf, len, ZMQ_DONTWAIT) < 0)
		log_warn("to the leader: %s", zmq_strerror(zmq_errno()));
	free(buf);
	event_active(f->ev, EV_READ, 0); /* ZMQ_FD is edge-triggered */
}

static void leave(struct pdx_tp_follower *f, const char *why)
{
	log_error("rank %u leaves: %s", f->p.rank, why);
	f->failed = true;
	event_base_loopexit(f->p.base, NULL);
}

static void xfer_free(struct xfer *x)
{
	pdx_kv_link_cancel(x->f->p.link, &x->w);
	LIST_REMOVE(x, link);
	free(x->blocks);
	free(x->tokens);
	free(x);
}

static struct xfer *find(struct pdx_tp_follower *f,
			 const struct pdx_xfer_id *id)
{
	struct xfer *x;

	LIST_FOREACH(x, &f->xfers, link)
	{
		if (!memcmp(&x->w.xfer, id, sizeof(*id)))
			return x;
	}
	return NULL;
}

/* The KV received for x matches its prompt, this rank's heads of it
 * (kv_pool_verify(): the leader's check, on this rank's slice). */
static bool received_ok(struct xfer *x, char *why, size_t len)
{
	uint64_t *hash = malloc(sizeof(*hash) * x->n_tokens), wrong = 0;
	uint32_t bad = 0;
	pdx_status_t st = PDX_ENOMEM;

	if (hash) {
		pdx_synth_hashes(PDX_SYNTH_HASH_SEED, x->tokens, x->n_tokens,
				 hash);
		st = pdx_kv_pool_verify(x->f->p.pool, x->blocks, hash,
					x->n_tokens, &wrong, &bad);
	}
	free(hash);
	if (st != PDX_OK)
		snprintf(why, len, "checking the received KV: %s",
			 pdx_status_str(st));
	else if (wrong)
		snprintf(why, len, "received KV differs at position %u", bad);
	return st == PDX_OK && !wrong;
}

static void on_event(void *arg, const struct pdx_engine_event *ev)
{
	struct xfer *x = arg;
	struct pdx_tp_follower *f = x->f;
	struct pdx_tp_msg m = {
	    .kind = PDX_TP_EVENT,
	    .xfer = ev->xfer,
	    .value = ev->kind,
	    .status = ev->status,
	};
	char why[PDX_REASON_MAX];

	snprintf(m.text, sizeof(m.text), "%s", ev->reason);
	if (ev->kind == PDX_EVENT_RECEIVED && x->recv &&
	    !received_ok(x, why, sizeof(why))) {
		log_warn("rank %u: %s", f->p.rank, why);
		m.value = PDX_EVENT_FAILED;
		m.status = PDX_EIO;
		snprintf(m.text, sizeof(m.text), "%s", why);
	}
	send_msg(f, &m);
	xfer_free(x);
}

static void xfer_start(struct pdx_tp_follower *f, struct pdx_tp_msg *m)
{
	struct xfer *x = calloc(1, sizeof(*x));
	pdx_status_t st = PDX_ENOMEM;
	struct pdx_engine_event ev = {.xfer = m->xfer,
				      .kind = PDX_EVENT_FAILED};
	char away[PDX_REASON_MAX];

	if (x) {
		x->f = f;
		x->recv = m->kind == PDX_TP_RECV;
		x->w.xfer = m->xfer;
		x->w.cb = on_event;
		x->w.arg = x;
		x->blocks = m->block_ids;
		x->n_blocks = m->n_block_ids;
		x->tokens = m->tokens;
		x->n_tokens = m->n_tokens;
		m->block_ids = m->tokens = NULL;
		LIST_INSERT_HEAD(&f->xfers, x, link);
		if (x->recv && x->n_tokens == 0)
			st = PDX_EINVAL; /* no prompt to check */
		else if (x->recv)
			st = pdx_kv_link_recv(f->p.link, &x->w, &m->peers,
					      x->blocks, x->n_blocks, m->value);
		else
			st = pdx_kv_link_send(f->p.link, &x->w, &m->peers,
					      x->blocks, x->n_blocks);
	}
	if (st == PDX_OK)
		return;
	ev.status = st;
	snprintf(ev.reason, sizeof(ev.reason), "%s",
		 st == PDX_EINVAL ? "no sender named for this rank "
				    "(kv_transfer_params.remote_agents)"
				  : pdx_status_str(st));
	/* refused because our agent is away: as a transfer it had under
	 * way would have ended (the leader quarantines the blocks) */
	if (st != PDX_ENOMEM && st != PDX_EINVAL &&
	    pdx_kv_link_status(f->p.link, away, sizeof(away)) != PDX_OK) {
		ev.status = PDX_EAGENT;
		snprintf(ev.reason, sizeof(ev.reason), "%s", away);
	}
	if (x)
		on_event(x, &ev);
}

/* One forward pass: the leader's runs, in this pool. */
static void step(struct pdx_tp_follower *f, const struct pdx_tp_msg *m)
{
	uint32_t bt = pdx_kv_pool_layout(f->p.pool)->block_tokens;
	struct pdx_synth_run *runs = calloc(m->n_runs ? m->n_runs : 1,
					    sizeof(*runs));
	struct pdx_tp_msg done = {.kind = PDX_TP_STEP_DONE, .seq = m->seq};
	pdx_status_t st = runs ? PDX_OK : PDX_ENOMEM;
	uint32_t slot;

	/* the synthetic model indexes blocks and hashes from position 0:
	 * tables that long, with the run's part filled in */
	for (uint32_t i = 0; st == PDX_OK && i < m->n_runs; i++) {
		const struct pdx_tp_run *r = &m->runs[i];
		uint32_t first = r->a / bt;
		uint32_t *blocks;
		uint64_t *hash;

		if (r->b == r->a)
			continue;
		if (r->n_blocks != (r->b - 1) / bt - first + 1) {
			st = PDX_EINVAL;
			break;
		}
		blocks = malloc(sizeof(*blocks) * (first + r->n_blocks));
		hash = malloc(sizeof(*hash) * r->b);
		runs[i] = (struct pdx_synth_run){
		    .blocks = blocks, .hash = hash, .a = r->a, .b = r->b};
		if (!blocks || !hash) {
			st = PDX_ENOMEM;
			break;
		}
		memcpy(blocks + first, r->blocks, sizeof(*blocks) * r->n_blocks);
		memcpy(hash + r->a, r->hash, sizeof(*hash) * (r->b - r->a));
	}
	if (st == PDX_OK)
		st = pdx_kv_pool_pass(f->p.pool, runs, m->n_runs,
				      UINT32_MAX, &slot);
	for (uint32_t i = 0; runs && i < m->n_runs; i++) {
		free((void *)runs[i].blocks);
		free((void *)runs[i].hash);
	}
	free(runs);
	done.status = st;
	if (st != PDX_OK)
		snprintf(done.text, sizeof(done.text), "%s",
			 pdx_status_str(st));
	send_msg(f, &done);
}

static void on_message(struct pdx_tp_follower *f, struct pdx_tp_msg *m)
{
	struct xfer *x = NULL;

	f->heard_ns = pdx_now_ns();
	if (m->kind >= PDX_TP_LAYER && m->kind <= PDX_TP_ABORT)
		x = find(f, &m->xfer);
	switch (m->kind) {
	case PDX_TP_REFUSE:
		leave(f, m->text);
		break;
	case PDX_TP_STEP:
		step(f, m);
		break;
	case PDX_TP_SEND:
	case PDX_TP_RECV:
		xfer_start(f, m);
		break;
	case PDX_TP_LAYER:
		if (x)
			pdx_kv_link_layer_done(f->p.link, &x->w, m->value,
					       PDX_KV_POOL_NO_SLOT);
		break;
	case PDX_TP_TOKEN:
		if (x)
			pdx_kv_link_token(f->p.link, &x->w, m->value);
		break;
	case PDX_TP_HOLD:
		pdx_kv_link_hold(f->p.link, &m->xfer, &m->peers);
		break;
	case PDX_TP_ABORT:
		/* its event still comes, once nothing more lands in this
		 * rank's blocks: forwarded to the leader, which waits for it */
		if (x && x->w.active)
			pdx_kv_link_abort(f->p.link, &x->w);
		else if (x)
			xfer_free(x);
		break;
	case PDX_TP_ABORT_AT:
		pdx_kv_link_abort_at(f->p.link, &m->xfer, &m->peers);
		break;
	default:
		break; /* PDX_TP_PING: heard */
	}
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_tp_follower *f = arg;
	struct pdx_tp_msg m;
	zmq_msg_t body;

	while (!f->failed) {
		zmq_msg_init(&body);
		if (zmq_msg_recv(&body, f->sock, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&body);
			return;
		}
		if (pdx_tp_msg_decode(zmq_msg_data(&body), zmq_msg_size(&body),
				      &m) == PDX_OK) {
			on_message(f, &m);
			pdx_tp_msg_clear(&m);
		} else {
			log_warn("a message from the leader that is not one: "
				 "dropped");
		}
		zmq_msg_close(&body);
	}
}

/* Pings the leader; once heard, a leader silent for liveness_ms is
 * gone: not for silence while this process itself did not run
 * (common/stall.h). */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_tp_follower *f = arg;
	struct pdx_tp_msg ping = {.kind = PDX_TP_PING};
	uint64_t now = pdx_now_ns();
	uint64_t stalled = pdx_stall_check(
	    &f->tick_ns, now, (uint64_t)f->p.liveness_ms * 1000000 / 2);
	char why[96];

	if (stalled && f->heard_ns) {
		log_warn("this process did not run for %llu ms: the leader's "
			 "silence counts from now",
			 (unsigned long long)(stalled / 1000000));
		f->heard_ns = now;
	}
	ping.status = pdx_kv_link_status(f->p.link, ping.text,
					 sizeof(ping.text));
	snprintf(ping.peer, sizeof(ping.peer), "%s",
		 pdx_kv_link_peer(f->p.link));

	/* the ranks may start in any order, so a follower waits for its
	 * leader for good; but it says so every ten liveness periods, or a
	 * wrong --tp-leader looks like a hang */
	if (!f->heard_ns &&
	    now - f->waited_ns >= (uint64_t)f->p.liveness_ms * 10000000) {
		if (f->waited_ns)
			log_warn("rank %u: no word from the leader at %s yet (is "
				 "rank 0 running, with this --tp-leader?)",
				 f->p.rank, f->p.leader);
		f->waited_ns = now;
	}
	if (f->heard_ns &&
	    now - f->heard_ns > (uint64_t)f->p.liveness_ms * 1000000) {
		snprintf(why, sizeof(why),
			 "the leader is gone (nothing from it for %u ms)",
			 f->p.liveness_ms);
		leave(f, why);
		return;
	}
	send_msg(f, &ping);
}

pdx_status_t pdx_tp_follower_new(const struct pdx_tp_follower_params *p,
				 struct pdx_tp_follower **out, char *err,
				 size_t errlen)
{
	uint32_t ms = p->liveness_ms / 4 ? p->liveness_ms / 4 : 1;
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	struct pdx_tp_follower *f = calloc(1, sizeof(*f));
	struct pdx_tp_msg hello = {
	    .kind = PDX_TP_HELLO,
	    .rank = p->rank,
	    .size = p->size,
	    .blocks = pdx_kv_pool_layout(p->pool)->blocks,
	    .value = p->role,
	};
	int fd, zero = 0;
	size_t len = sizeof(fd);

	if (!f) {
		snprintf(err, errlen, "out of memory");
		return PDX_ENOMEM;
	}
	f->p = *p;
	LIST_INIT(&f->xfers);
	f->zctx = zmq_ctx_new();
	f->sock = f->zctx ? zmq_socket(f->zctx, ZMQ_DEALER) : NULL;
	if (!f->sock || zmq_setsockopt(f->sock, ZMQ_LINGER, &zero,
				       sizeof(zero)) ||
	    zmq_connect(f->sock, p->leader) < 0) {
		snprintf(err, errlen, "connecting to the leader at %s: %s",
			 p->leader, zmq_strerror(zmq_errno()));
		pdx_tp_follower_free(f);
		return PDX_EIO;
	}
	zmq_getsockopt(f->sock, ZMQ_FD, &fd, &len);
	f->ev = event_new(p->base, fd, EV_READ | EV_PERSIST, on_readable, f);
	f->tick = event_new(p->base, -1, EV_PERSIST, on_tick, f);
	if (!f->ev || !f->tick || event_add(f->ev, NULL) ||
	    event_add(f->tick, &tv)) {
		snprintf(err, errlen, "out of memory");
		pdx_tp_follower_free(f);
		return PDX_ENOMEM;
	}
	snprintf(hello.text, sizeof(hello.text), "%s", p->model);
	snprintf(hello.peer, sizeof(hello.peer), "%s",
		 pdx_kv_link_peer(p->link));
	send_msg(f, &hello);
	*out = f;
	return PDX_OK;
}

void pdx_tp_follower_free(struct pdx_tp_follower *f)
{
	if (!f)
		return;
	while (!LIST_EMPTY(&f->xfers))
		xfer_free(LIST_FIRST(&f->xfers));
	if (f->ev)
		event_free(f->ev);
	if (f->tick)
		event_free(f->tick);
	if (f->sock)
		zmq_close(f->sock);
	if (f->zctx)
		zmq_ctx_term(f->zctx);
	free(f);
}

bool pdx_tp_follower_failed(const struct pdx_tp_follower *f)
{
	return f->failed;
}
