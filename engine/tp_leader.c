/* The leader's end of a TP instance: followers joining, passes and
 * transfer actions out, passes written and events back, liveness. */
#define PDX_LOG_TOPIC "tp"
#include "engine/tp_leader.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/ipc_path.h"
#include "common/log.h"
#include "common/stall.h"

#define ID_MAX 256

struct rank {
	bool joined, gone;
	int send_errno; /* a send to it failed (ZMQ_ROUTER_MANDATORY): why */
	uint8_t id[ID_MAX]; /* its ROUTER routing id */
	size_t id_len;
	uint64_t heard_ns; /* when anything last came from it */
	uint64_t done;	   /* the last pass it wrote */
	char peer[PDX_ADDR_MAX];
	/* its agent link, as its last ping said: PDX_OK, or why it is away */
	pdx_status_t agent;
	char agent_why[PDX_REASON_MAX];
};

struct pdx_tp_leader {
	struct pdx_tp_leader_params p;
	char model[64];
	void *zctx, *sock;
	struct pdx_ipc_path ipc; /* an ipc:// --tp-leader's socket file */
	struct event *ev, *tick;
	struct rank ranks[PDX_TP_MAX]; /* [0]: this one */
	uint64_t seq;		       /* the last pass sent */
	uint64_t step_ns;	       /* when it went out */
	uint64_t tick_ns;	       /* when on_tick last ran */
	uint64_t awake_ns;	       /* silences count from here */
	bool broken;
	char why[PDX_REASON_MAX];
};

/* Sends m to rank r. The ROUTER is mandatory, so a rank whose connection
 * is gone, or that reads nothing while its queue filled up, fails the
 * send rather than losing the message unseen; the next tick breaks the
 * group for it (callbacks never run inside a pdx_tp_leader_* call). */
static void send_to(struct pdx_tp_leader *l, uint32_t r,
		    const struct pdx_tp_msg *m)
{
	struct rank *k = &l->ranks[r];
	uint8_t *buf;
	size_t len;

	if (pdx_tp_msg_encode(m, &buf, &len) != PDX_OK) {
		log_error("rank %u: out of memory for a message", r);
		return;
	}
	if (zmq_send(l->sock, k->id, k->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) <
		0 ||
	    zmq_send(l->sock, buf, len, ZMQ_DONTWAIT) < 0) {
		if (!k->send_errno)
			k->send_errno = zmq_errno() ? zmq_errno() : EIO;
		event_active(l->tick, EV_TIMEOUT, 0);
	}
	free(buf);
	/* ZMQ_FD is edge-triggered: a send may take its edge */
	event_active(l->ev, EV_READ, 0);
}

static void refuse(struct pdx_tp_leader *l, const uint8_t *id, size_t id_len,
		   const char *why)
{
	struct pdx_tp_msg m = {.kind = PDX_TP_REFUSE};
	uint8_t *buf;
	size_t len;

	log_error("a follower refused: %s", why);
	snprintf(m.text, sizeof(m.text), "%s", why);
	if (pdx_tp_msg_encode(&m, &buf, &len) != PDX_OK)
		return;
	zmq_send(l->sock, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(l->sock, buf, len, ZMQ_DONTWAIT);
	free(buf);
}

static void break_group(struct pdx_tp_leader *l, const char *why)
{
	if (l->broken)
		return;
	l->broken = true;
	snprintf(l->why, sizeof(l->why), "%s", why);
	log_error("%s: the instance serves nothing until it is restarted",
		  why);
	l->p.cbs.broken(l->p.cbs.arg, l->why);
}

static bool all_joined(const struct pdx_tp_leader *l)
{
	for (uint32_t r = 1; r < l->p.size; r++)
		if (!l->ranks[r].joined)
			return false;
	return true;
}

static void on_hello(struct pdx_tp_leader *l, const uint8_t *id,
		     size_t id_len, const struct pdx_tp_msg *m)
{
	char why[PDX_REASON_MAX];
	struct rank *k;

	why[0] = '\0';
	if (m->size != l->p.size)
		snprintf(why, sizeof(why),
			 "rank %u has --tp-size %u, the leader %u", m->rank,
			 m->size, l->p.size);
	else if (m->rank == 0 || m->rank >= l->p.size)
		snprintf(why, sizeof(why), "rank %u: want 1 to %u", m->rank,
			 l->p.size - 1);
	else if (strcmp(m->text, l->model) || m->blocks != l->p.blocks)
		snprintf(why, sizeof(why),
			 "rank %u runs %s with %u KV blocks, the leader %s "
			 "with %u",
			 m->rank, m->text, m->blocks, l->model, l->p.blocks);
	else if (m->value != l->p.role)
		/* a follower before the hello said its role sends 0, which
		 * reads as "both": a rank of another pdx-engine version */
		snprintf(why, sizeof(why),
			 "rank %u has --role %s, the leader %s%s", m->rank,
			 m->value <= PDX_ROLE_DECODE
			     ? pdx_engine_role_name(m->value)
			     : "?",
			 pdx_engine_role_name(l->p.role),
			 m->value == PDX_ROLE_BOTH
			     ? " (or it runs an older pdx-engine, whose hello "
			       "does not say its role: run one pdx-engine "
			       "version on every rank)"
			     : "");
	else if (l->ranks[m->rank].joined)
		snprintf(why, sizeof(why),
			 "rank %u joined already%s; restart the instance",
			 m->rank, l->ranks[m->rank].gone ? " and left" : "");
	if (why[0]) {
		refuse(l, id, id_len, why);
		return;
	}
	k = &l->ranks[m->rank];
	k->joined = true;
	memcpy(k->id, id, id_len);
	k->id_len = id_len;
	k->heard_ns = pdx_now_ns();
	k->done = l->seq; /* nothing before it joined is its to write */
	snprintf(k->peer, sizeof(k->peer), "%s", m->peer);
	log_info("tensor-parallel rank %u joined, its agent at %s", m->rank,
		 k->peer);
	if (all_joined(l))
		log_info("all %u tensor-parallel ranks joined", l->p.size);
}

/* The rank a routing id belongs to, 0 when none. */
static uint32_t rank_of(const struct pdx_tp_leader *l, const uint8_t *id,
			size_t id_len)
{
	for (uint32_t r = 1; r < l->p.size; r++) {
		const struct rank *k = &l->ranks[r];

		if (k->joined && k->id_len == id_len &&
		    !memcmp(k->id, id, id_len))
			return r;
	}
	return 0;
}

static void on_message(struct pdx_tp_leader *l, const uint8_t *id,
		       size_t id_len, const struct pdx_tp_msg *m)
{
	struct pdx_engine_event ev = {0};
	uint32_t r;
	bool was;

	if (m->kind == PDX_TP_HELLO) {
		on_hello(l, id, id_len, m);
		return;
	}
	r = rank_of(l, id, id_len);
	if (!r || l->ranks[r].gone)
		return; /* not joined, or gone for good */
	l->ranks[r].heard_ns = pdx_now_ns();
	switch (m->kind) {
	case PDX_TP_STEP_DONE:
		was = pdx_tp_leader_caught_up(l);
		if (m->status != PDX_OK) {
			char why[PDX_REASON_MAX];

			snprintf(why, sizeof(why),
				 "tensor-parallel rank %u: forward pass: %s",
				 r, m->text);
			break_group(l, why);
			return;
		}
		l->ranks[r].done = m->seq;
		if (!was && pdx_tp_leader_caught_up(l))
			l->p.cbs.caught_up(l->p.cbs.arg);
		break;
	case PDX_TP_EVENT:
		ev.xfer = m->xfer;
		ev.kind = (enum pdx_event_kind)m->value;
		ev.status = m->status;
		ev.first_token = -1;
		snprintf(ev.reason, sizeof(ev.reason), "%s", m->text);
		l->p.cbs.event(l->p.cbs.arg, r, &ev);
		break;
	case PDX_TP_PING:
		if (m->status != PDX_OK && l->ranks[r].agent == PDX_OK)
			log_warn("tensor-parallel rank %u: its agent is away: "
				 "%s", r, m->text);
		else if (m->status == PDX_OK && l->ranks[r].agent != PDX_OK)
			log_info("tensor-parallel rank %u: its agent is back",
				 r);
		l->ranks[r].agent = m->status;
		snprintf(l->ranks[r].agent_why, sizeof(l->ranks[r].agent_why),
			 "%s", m->text);
		if (m->peer[0] && strcmp(m->peer, l->ranks[r].peer)) {
			log_info("tensor-parallel rank %u: its agent is at %s "
				 "now (was %s)", r, m->peer, l->ranks[r].peer);
			snprintf(l->ranks[r].peer, sizeof(l->ranks[r].peer),
				 "%s", m->peer);
		}
		break;
	default:
		break;
	}
}

/* Drains the socket (ZMQ_FD is edge-triggered). */
static void on_readable(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_tp_leader *l = arg;
	uint8_t id[ID_MAX];
	struct pdx_tp_msg m;
	zmq_msg_t body;
	int n, more;
	size_t sz;

	for (;;) {
		n = zmq_recv(l->sock, id, sizeof(id), ZMQ_DONTWAIT);
		if (n < 0)
			return;
		zmq_msg_init(&body);
		sz = sizeof(more);
		more = 0;
		zmq_getsockopt(l->sock, ZMQ_RCVMORE, &more, &sz);
		if (!more || n > ID_MAX ||
		    zmq_msg_recv(&body, l->sock, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&body);
			continue;
		}
		if (pdx_tp_msg_decode(zmq_msg_data(&body), zmq_msg_size(&body),
				      &m) == PDX_OK) {
			on_message(l, id, (size_t)n, &m);
			pdx_tp_msg_clear(&m);
		} else {
			log_warn("a message that is not one: dropped");
		}
		zmq_msg_close(&body);
	}
}

/* Why rank r is gone, into why; false while it is not. A rank that
 * answers pings but not the pass it was sent is gone too: the step would
 * wait for it forever. */
static bool rank_gone(const struct pdx_tp_leader *l, uint32_t r, uint64_t now,
		      char *why, size_t len)
{
	const struct rank *k = &l->ranks[r];
	uint64_t bound = (uint64_t)l->p.liveness_ms * 1000000;

	uint64_t heard = k->heard_ns > l->awake_ns ? k->heard_ns : l->awake_ns;
	uint64_t step = l->step_ns > l->awake_ns ? l->step_ns : l->awake_ns;

	if (k->send_errno)
		snprintf(why, len,
			 "tensor-parallel rank %u is gone (cannot send to "
			 "it: %s)",
			 r, zmq_strerror(k->send_errno));
	else if (now - heard > bound)
		snprintf(why, len,
			 "tensor-parallel rank %u is gone (nothing from it "
			 "for %u ms)",
			 r, l->p.liveness_ms);
	else if (k->done != l->seq && now - step > bound)
		snprintf(why, len,
			 "tensor-parallel rank %u is gone (pass %llu not "
			 "written in %u ms)",
			 r, (unsigned long long)k->done + 1, l->p.liveness_ms);
	else
		return false;
	return true;
}

/* Pings every follower and breaks the group for one that is gone: not
 * for silence while this process itself did not run (common/stall.h). */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_tp_leader *l = arg;
	struct pdx_tp_msg ping = {.kind = PDX_TP_PING};
	uint64_t now = pdx_now_ns();
	uint64_t stalled = pdx_stall_check(
	    &l->tick_ns, now, (uint64_t)l->p.liveness_ms * 1000000 / 2);
	char why[PDX_REASON_MAX];

	if (stalled) {
		log_warn("this process did not run for %llu ms: its followers' "
			 "silences count from now",
			 (unsigned long long)(stalled / 1000000));
		l->awake_ns = now;
	}
	for (uint32_t r = 1; r < l->p.size; r++) {
		struct rank *k = &l->ranks[r];

		if (!k->joined || k->gone)
			continue;
		if (rank_gone(l, r, now, why, sizeof(why))) {
			k->gone = true;
			break_group(l, why);
			continue;
		}
		send_to(l, r, &ping);
	}
}

pdx_status_t pdx_tp_leader_new(const struct pdx_tp_leader_params *p,
			       struct pdx_tp_leader **out, char *err,
			       size_t errlen)
{
	uint32_t ms = p->liveness_ms / 4 ? p->liveness_ms / 4 : 1;
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	struct pdx_tp_leader *l = calloc(1, sizeof(*l));
	int fd, zero = 0, one = 1;
	size_t len = sizeof(fd);

	if (!l) {
		snprintf(err, errlen, "out of memory");
		return PDX_ENOMEM;
	}
	l->p = *p;
	snprintf(l->model, sizeof(l->model), "%s", p->model);
	l->p.model = l->model;
	l->ranks[0].joined = true;
	l->zctx = zmq_ctx_new();
	l->sock = l->zctx ? zmq_socket(l->zctx, ZMQ_ROUTER) : NULL;
	if (!l->sock) {
		snprintf(err, errlen, "zmq: %s", zmq_strerror(zmq_errno()));
		goto fail;
	}
	zmq_setsockopt(l->sock, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(l->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof(one));
	/* a path another instance's leader serves (two deployments given
	 * one --tp-leader) is refused, not taken: common/ipc_path.h */
	if (pdx_ipc_bind(l->sock, zmq_bind, p->addr, "tensor-parallel leader",
			 &l->ipc, err, errlen))
		goto fail;
	zmq_getsockopt(l->sock, ZMQ_FD, &fd, &len);
	l->ev = event_new(p->base, fd, EV_READ | EV_PERSIST, on_readable, l);
	l->tick = event_new(p->base, -1, EV_PERSIST, on_tick, l);
	if (!l->ev || !l->tick || event_add(l->ev, NULL) ||
	    event_add(l->tick, &tv)) {
		snprintf(err, errlen, "out of memory");
		pdx_tp_leader_free(l);
		return PDX_ENOMEM;
	}
	*out = l;
	return PDX_OK;
fail:
	pdx_tp_leader_free(l);
	return PDX_EIO;
}

void pdx_tp_leader_free(struct pdx_tp_leader *l)
{
	if (!l)
		return;
	if (l->ev)
		event_free(l->ev);
	if (l->tick)
		event_free(l->tick);
	if (l->sock)
		zmq_close(l->sock);
	if (l->zctx)
		zmq_ctx_term(l->zctx);
	pdx_ipc_path_remove(&l->ipc);
	free(l);
}

pdx_status_t pdx_tp_leader_status(const struct pdx_tp_leader *l, char *reason,
				  size_t reason_len)
{
	if (l->broken) {
		if (reason)
			snprintf(reason, reason_len, "%s", l->why);
		return PDX_EPEER;
	}
	for (uint32_t r = 1; r < l->p.size; r++) {
		if (l->ranks[r].joined)
			continue;
		if (reason)
			snprintf(reason, reason_len,
				 "tensor-parallel rank %u of %u has not "
				 "joined (--tp-leader %s)",
				 r, l->p.size, l->p.addr);
		return PDX_EPEER;
	}
	return PDX_OK;
}

pdx_status_t pdx_tp_leader_agents(const struct pdx_tp_leader *l,
				  char *reason, size_t reason_len)
{
	for (uint32_t r = 1; r < l->p.size; r++) {
		if (l->ranks[r].agent == PDX_OK)
			continue;
		if (reason)
			snprintf(reason, reason_len,
				 "tensor-parallel rank %u: %s", r,
				 l->ranks[r].agent_why);
		return l->ranks[r].agent;
	}
	return PDX_OK;
}

const char *pdx_tp_leader_peer(const struct pdx_tp_leader *l, uint32_t r)
{
	return r < l->p.size ? l->ranks[r].peer : "";
}

pdx_status_t pdx_tp_leader_step(struct pdx_tp_leader *l,
				const struct pdx_synth_run *runs, size_t n)
{
	struct pdx_tp_msg m = {.kind = PDX_TP_STEP};
	uint32_t bt = l->p.block_tokens;

	if (pdx_tp_leader_status(l, NULL, 0) != PDX_OK)
		return PDX_EPEER;
	m.runs = calloc(n ? n : 1, sizeof(*m.runs));
	if (!m.runs)
		return PDX_ENOMEM;
	m.n_runs = (uint32_t)n;
	/* pointers into the leader's runs: only encoded, never freed */
	for (size_t i = 0; i < n; i++) {
		const struct pdx_synth_run *s = &runs[i];
		struct pdx_tp_run *r = &m.runs[i];

		r->a = s->a;
		r->b = s->b;
		if (s->b > s->a) {
			r->n_blocks = (s->b - 1) / bt - s->a / bt + 1;
			r->blocks = (uint32_t *)s->blocks + s->a / bt;
			r->hash = (uint64_t *)s->hash + s->a;
		}
	}
	m.seq = ++l->seq;
	l->step_ns = pdx_now_ns();
	for (uint32_t r = 1; r < l->p.size; r++)
		send_to(l, r, &m);
	free(m.runs);
	return PDX_OK;
}

bool pdx_tp_leader_caught_up(const struct pdx_tp_leader *l)
{
	if (l->broken)
		return true;
	for (uint32_t r = 1; r < l->p.size; r++)
		if (l->ranks[r].joined && l->ranks[r].done != l->seq)
			return false;
	return true;
}

void pdx_tp_leader_xfer(struct pdx_tp_leader *l, const struct pdx_tp_msg *m)
{
	for (uint32_t r = 1; r < l->p.size; r++)
		if (l->ranks[r].joined && !l->ranks[r].gone)
			send_to(l, r, m);
}
