/* The peer link's messages as they arrive (docs/protocol.md section 2):
 * each op to its handler; the handshake's to handshake.c, pull's
 * (readable, pulled) to pull.c, want, done, abort, error and ping here. */
#define PDX_LOG_TOPIC "peer"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mp.h"

#define MAX_BLOCKS (1u << 20)

/* A want for id sent to our instance before this one (we restarted, or
 * our engine registered again, and our hello with the new instance
 * crossed the want): nothing of it is sent, and the receiver, which
 * learns our instance from that hello, asks again with it ("renewed").
 * It is not served: a receiver before this answer fails the transfer at
 * our hello, as begun with our old instance, and tells us abort, which
 * ends our side; served, our engine's transfer would end "sent" and
 * write blocks the receiver's engine was told failed. */
static void want_stale(struct agent *a, struct peer *p,
		       const struct pdx_xfer_id *id)
{
	log_info("want from %s to our earlier instance: refused, to be "
		 "asked again", p->addr);
	peer_send(a, p, "error", id, PEER_STALE_WANT);
}

static void on_want(struct agent *a, struct peer *p, const msgpack_object *m)
{
	struct pdx_xfer_id id, of;
	struct xfer *x;
	uint32_t *blocks = NULL;
	size_t n = 0;
	uint64_t skip = 0;
	bool pull = false, renewed = false;
	const char *why;
	uint64_t to;

	if (pdx_mp_get_xfer(m, "xfer", &id))
		return;
	/* absent: an agent before this field, which cannot say */
	if (pdx_mp_get(m, "to_instance") &&
	    (pdx_mp_get_u64(m, "to_instance", &to) || to != a->instance)) {
		want_stale(a, p, &id);
		return;
	}
	if (!a->reg.ok || pdx_mp_get_u32s(m, "blocks", MAX_BLOCKS, &blocks, &n) || n == 0 ||
	    pdx_mp_get_u64(m, "skip", &skip) || skip > n ||
	    (pdx_mp_get(m, "pull") && pdx_mp_get_bool(m, "pull", &pull))) {
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
	/* Asked again after we restarted (its first want went to our
	 * earlier instance, or crossed our new hello): not held for an
	 * announcement to come, as the transfer may be our predecessor's,
	 * which our engine never announces. (A leg: its group, "of".) */
	if (pdx_mp_get_bool(m, "renewed", &renewed) == 0 && renewed) {
		bool leg = pdx_mp_get(m, "of") &&
			   pdx_mp_get_xfer(m, "of", &of) == 0 &&
			   memcmp(of.b, id.b, sizeof(id.b)) != 0;

		x = xfer_find(a, leg ? &of : &id);
		if ((!x || !x->announced) &&
		    !pdx_ended_find(a->ended, leg ? &of : &id, NULL)) {
			free(blocks);
			log_info("renewed want from %s for a transfer our "
				 "engine has not announced: refused", p->addr);
			peer_send(a, p, "error", &id, PEER_RENEWED_UNKNOWN);
			return;
		}
	}
	/* a leg of our engine's transfer "of" (TP p != d) */
	if (pdx_mp_get(m, "of") && pdx_mp_get_xfer(m, "of", &of) == 0 &&
	    memcmp(of.b, id.b, sizeof(id.b)) != 0) {
		tp_legs_want(a, p, &id, &of, blocks, (uint32_t)n,
			     (uint32_t)skip, pull);
		return;
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
	x->pull = pull;
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
		if (strcmp(op, "done") == 0 || strcmp(op, "readable") == 0)
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
	int64_t first_token;
	const void *meta;
	size_t meta_len;

	if (!x)
		return;
	xfer_mark(x, MARK_DONE_HEARD);
	if (x->role != XFER_RECV || !x->announced ||
	    pdx_mp_get_u64(m, "bytes", &bytes)) {
		peer_send(a, p, "error", &x->id, "done: not a transfer to you");
		return;
	}
	pdx_mp_get_u64(m, "am_bytes", &am_bytes);
	if (pdx_mp_get_i64(m, "first_token", &first_token))
		first_token = -1; /* optional */
	if (!pdx_mp_get_bin(m, "meta", &meta, &meta_len)) { /* optional */
		if (meta_len > PDX_META_MAX) {
			xfer_fail(x, PDX_ETOOBIG, true, "done: %zu bytes of meta,"
				  " over %d", meta_len, PDX_META_MAX);
			return;
		}
		if (xfer_set_meta(x, meta, meta_len)) {
			xfer_fail(x, PDX_ENOMEM, true, "out of memory for %zu "
				  "bytes of meta", meta_len);
			return;
		}
	}
	log_debug("done from %s: %llu bytes", p->addr, (unsigned long long)bytes);
	complete_done_heard(x, bytes, am_bytes, first_token);
}

static void abort_heard(struct agent *a, struct peer *p,
			const msgpack_object *m, bool refused)
{
	char reason[PDX_REASON_MAX] = "no reason given", why[PDX_REASON_MAX];
	struct pdx_xfer_id id;
	struct xfer *x;

	pdx_mp_get_str(m, "reason", reason, sizeof(reason));
	/* From a peer of another TP size: our open send, its group of legs,
	 * or a leg that had not asked yet: the engines' transfer fails. */
	if (!refused && pdx_mp_get_xfer(m, "xfer", &id) == 0 &&
	    tp_legs_abort(a, p, &id, reason))
		return;
	/* An abort presenting an open send's id claims it as a want would
	 * (the id is its credential), to end it: a decode request that left
	 * before asking for its KV frees the sender's blocks now. */
	if (!refused && pdx_mp_get_xfer(m, "xfer", &id) == 0)
		xfer_claim(xfer_find(a, &id), p);
	x = peer_xfer(a, p, m, "abort");
	if (!x && !refused && pdx_mp_get_xfer(m, "xfer", &id) == 0 &&
	    !xfer_find(a, &id)) {
		/* Before our engine heard of it: when it announces it, it
		 * fails at once. */
		snprintf(why, sizeof(why), "aborted by %s: %s", p->addr, reason);
		pdx_ended_add(a->ended, &id, p->addr, why);
	}
	if (!x)
		return;
	/* The sender holds no handshake with us while we hold one with it
	 * (its UCX endpoint to us failed, or it dropped us as silent, across
	 * a partition that healed since, or it restarted and our want went
	 * on its predecessor's handshake), or our want named its earlier
	 * instance: it refused our want before moving anything. Meet it
	 * afresh and ask once more, as xfers_peer_ready() does when its
	 * answer comes (a want to a new instance says "renewed"); a hello
	 * already sent for the wants that crossed its restart
	 * (handshake.c, rewant_settle) is that answer. */
	if (refused && x->role == XFER_RECV && x->want_sent &&
	    !x->done_seen && !x->wanted_again && !x->finished &&
	    (strcmp(reason, PEER_NO_HANDSHAKE) == 0 ||
	     strcmp(reason, PEER_STALE_WANT) == 0)) {
		log_info("want to %s refused (%s): hello, then want again",
			 p->addr, reason);
		x->wanted_again = true;
		x->want_sent = false;
		if (!x->want_unsure)
			p->stale = true;
		x->want_unsure = false;
		peer_get(a, p->addr);
		if (p->state == PEER_READY) /* nothing to wait for */
			xfers_peer_ready(a, p);
		return;
	}
	if (refused && x->role == XFER_RECV &&
	    strcmp(reason, PEER_RENEWED_UNKNOWN) == 0) {
		xfer_fail(x, PDX_EPEER, true, "peer %s: peer restarted, and "
			  "its new instance has no such transfer", p->addr);
		return;
	}
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

/* Our send of id to p still has operations in flight, or moved bytes
 * whose operations ended here, perhaps still on their way (a put over
 * TCP: complete_stop_flush): "stopped" goes once they ended, and the
 * endpoint was flushed (xfer_maybe_release); true then. */
static bool stopped_owed(struct agent *a, struct peer *p,
			 const struct pdx_xfer_id *id)
{
	struct xfer *x = xfer_find(a, id);

	if (!x || x->role != XFER_SEND || strcmp(x->peer_addr, p->addr) != 0)
		return false;
	if (!x->inflight && (x->finished || !xfer_pushed(x)))
		return false;
	x->owe_stopped = true;
	return true;
}

/* A pull of ours from p still has reads in flight: the sender keeps its
 * memory for them until "stopped", sent once they ended
 * (xfer_maybe_release); true then. */
static bool reads_owe_stopped(struct xfer *x)
{
	if (!x->pull || !xfer_ops_out(x)) /* (a wait for room reads nothing) */
		return false;
	x->owe_stopped = true;
	return true;
}

/* A receiver's abort is answered "stopped" once nothing we sent can still
 * land in its blocks (docs/protocol.md, "stopped"): now, or when the
 * operations of our send in flight to it ended. */
/* An abort from a peer we hold no handshake with (its engine refused the
 * request before any handshake): a send of ours for it, or open, ends
 * now (its KV was kept to the lease). Only that: a TP leg's id needs the
 * peer's rank, which its hello would have said. */
static void abort_unmet(struct agent *a, struct peer *p,
			const struct pdx_xfer_id *id, const msgpack_object *m)
{
	char reason[PDX_REASON_MAX] = "no reason given";
	struct xfer *x = xfer_find(a, id);

	pdx_mp_get_str(m, "reason", reason, sizeof(reason));
	if (x && x->role == XFER_SEND && !x->finished && !x->tp && !x->group &&
	    !x->remote_blocks &&
	    (!x->peer_addr[0] || strcmp(x->peer_addr, p->addr) == 0))
		xfer_fail(x, PDX_ECANCELED, false, "aborted by %s: %s",
			  p->addr, reason);
}

static void on_abort(struct agent *a, struct peer *p, const msgpack_object *m,
		     bool refused)
{
	struct pdx_xfer_id id;
	struct xfer *x;
	bool later, ours_to_receive;

	if (refused || pdx_mp_get_xfer(m, "xfer", &id)) {
		abort_heard(a, p, m, refused);
		return;
	}
	x = xfer_find(a, &id);
	ours_to_receive = x && x->role == XFER_RECV &&
			  strcmp(x->peer_addr, p->addr) == 0;
	/* The peer's own abort comes once its operations ended (as
	 * "stopped" would): a sender's, of a receive waiting for that, or a
	 * pull's receiver's, once its reads ended, of a send of ours it was
	 * reading: that transfer waits no more. */
	if (x && x->await_stopped && strcmp(x->peer_addr, p->addr) == 0) {
		xfer_stop_heard(x);
		return;
	}
	later = p->stops && (stopped_owed(a, p, &id) ||
			     (ours_to_receive && reads_owe_stopped(x)));
	abort_heard(a, p, m, refused);
	/* (a sender's abort of what we receive by push is answered by
	 * nothing; of a pull we read, "stopped" once our reads ended) */
	if (p->stops && !later && (!ours_to_receive || x->pull))
		peer_send(a, p, "stopped", &id, NULL);
}

/* "stopped": the sender writes nothing more of the transfer we aborted. */
static void on_stopped(struct agent *a, struct peer *p, const msgpack_object *m)
{
	struct pdx_xfer_id id;
	struct xfer *x;

	if (pdx_mp_get_xfer(m, "xfer", &id))
		return;
	x = xfer_find(a, &id);
	if (x && x->await_stopped && strcmp(x->peer_addr, p->addr) == 0)
		xfer_stop_heard(x);
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
		/* a decode rank of another TP size holds our open send (or
		 * its legs' group) without claiming it: legs will */
		if (!tp_legs_holder(a, p, x))
			xfer_claim(x, p);
		if (x && x->role == XFER_SEND && !x->finished &&
		    (x->peer == p || tp_legs_holder(a, p, x)) &&
		    lease_end > x->lease_ns) {
			x->lease_ns = lease_end;
			metrics_lease_renewed(a);
		}
	}
}

/* The peer's engine is gone (its connection to that agent closed): what
 * we cached of its registration, maps of its memory included, goes now,
 * so that an engine restarted there finds its memory free (GPU memory
 * open here by CUDA IPC, a pool in /dev/shm mapped here, stay allocated
 * otherwise). Its next registration comes with a new instance, in a
 * hello. One about an instance other than the one we know is old news. */
static void on_gone(struct agent *a, struct peer *p, const msgpack_object *m)
{
	uint64_t instance;

	if (pdx_mp_get_u64(m, "instance", &instance) ||
	    instance != p->instance) {
		log_debug("gone from %s for another instance: ignored",
			  p->addr);
		return;
	}
	log_info("peer %s: its engine is gone: transfers with it fail, and "
		 "its memory is no longer mapped here", p->addr);
	xfers_peer_failed(a, p, p->instance, PDX_EPEER,
			  "its engine is gone (its connection to its agent "
			  "closed)");
	peer_reset(a, p);
}

/* {"op": "probe", "nonce"}: an agent's check of its own advertised
 * address (advertise_check.c). Ours came back: peers reach us there.
 * Another's came here: that agent advertises an address that leads to
 * this one, and its peers' answers come here instead of to it. */
static void on_probe(struct agent *a, const char *from,
		     const msgpack_object *m)
{
	struct advertise_check *c = &a->advertise;
	const void *nonce;
	size_t len;

	if (pdx_mp_get_bin(m, "nonce", &nonce, &len) ||
	    len != sizeof(c->nonce)) {
		log_warn("probe from %s without a nonce: ignored", from);
		return;
	}
	if (c->sent && !memcmp(nonce, c->nonce, len)) {
		if (c->late)
			log_info("--advertise %s reaches this agent now, "
				 "%llu ms after start",
				 a->peer_addr,
				 (unsigned long long)((pdx_now_ns() - c->sent_ns) /
						      1000000));
		c->reached = true;
		c->late = false;
		return;
	}
	if (!pdx_once_a_second(&c->other_ns))
		return;
	if (strcmp(from, a->peer_addr) == 0)
		log_warn("another agent advertises this agent's address %s: "
			 "its probe came here, so its peers' answers come "
			 "here too and its transfers fail; give it its own "
			 "--advertise", from);
	else
		log_warn("another agent advertises %s, which leads to this "
			 "agent (advertised %s): its probe came here, so its "
			 "peers' answers come here too and its transfers "
			 "fail; give it its own --advertise",
			 from, a->peer_addr);
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
	/* a peer reached us: at our advertised address, which is where
	 * every peer sends */
	if (strcmp(op, "probe") != 0) {
		a->advertise.peer_heard = true;
		if (a->advertise.late)
			log_info("a message from %s came: peers reach this "
				 "agent at --advertise %s, though its own probe "
				 "did not (a NAT that does not hairpin?): the "
				 "warning is taken back",
				 from, a->peer_addr);
		a->advertise.late = false;
	}
	if (strcmp(op, "ping") == 0) {
		on_ping(a, from, &msg.data);
	} else if (strcmp(op, "probe") == 0) {
		on_probe(a, from, &msg.data);
	} else if (strcmp(op, "pong") == 0) {
		/* heard: that is all it says */
	} else if (strcmp(op, "hello") == 0 || strcmp(op, "hello_ack") == 0) {
		handshake_on_hello(a, from, &msg.data, op[5] == '_');
	} else if (strcmp(op, "hello_nack") == 0) {
		if ((p = peer_lookup(a, from, false)) != NULL)
			handshake_on_nack(a, p, &msg.data);
	} else if (strcmp(op, "stopped") == 0 && p) {
		/* It needs no handshake: the sender of a transfer we aborted
		 * writes nothing more into its blocks. Our endpoint to it may
		 * have failed (that failed the transfer, and our abort told
		 * it so): refused, its engine waited 5 x --peer-timeout-ms
		 * for blocks nobody writes. */
		on_stopped(a, p, &msg.data);
	} else if (strcmp(op, "gone") == 0) {
		/* whatever our endpoint's state: its maps go (never met:
		 * nothing to drop) */
		if (p)
			on_gone(a, p, &msg.data);
	} else if (!peer_known(p = peer_lookup(a, from, false))) {
		struct pdx_xfer_id id;

		p = peer_lookup(a, from, true);
		if (p && strcmp(op, "abort") == 0 &&
		    pdx_mp_get_xfer(&msg.data, "xfer", &id) == 0) {
			/* It needs no handshake: a transfer for that peer ends
			 * (a decode engine that refused its request before
			 * any handshake; before, the prefill side kept the KV
			 * to its lease). A receive of its that waits for our
			 * word (a restarted agent's, which never heard of it:
			 * nothing lands) ends now, or when our operations
			 * still in flight to it ended (its UCX endpoint
			 * failed, the ipc lanes copy on). */
			log_debug("abort from %s without a handshake", from);
			abort_unmet(a, p, &id, &msg.data);
			if (!stopped_owed(a, p, &id))
				peer_send(a, p, "stopped", &id, NULL);
		} else if (strcmp(op, "error") != 0 &&
			   strcmp(op, "abort") != 0 &&
			   strcmp(op, "stopped") != 0) {
			/* Perhaps we restarted and it still holds our old
			 * handshake. */
			log_warn("%s from %s without a handshake: refused", op,
				 from);
			if (p && pdx_mp_get_xfer(&msg.data, "xfer", &id) == 0)
				peer_send(a, p, "error", &id, PEER_NO_HANDSHAKE);
		}
	} else if (strcmp(op, "want") == 0) {
		on_want(a, p, &msg.data);
	} else if (strcmp(op, "done") == 0) {
		on_done(a, p, &msg.data);
	} else if (strcmp(op, "readable") == 0 || strcmp(op, "pulled") == 0) {
		struct xfer *x = peer_xfer(a, p, &msg.data, op);

		if (x && op[0] == 'r')
			pull_on_readable(x, &msg.data);
		else if (x)
			pull_on_pulled(x, &msg.data);
	} else if (strcmp(op, "abort") == 0 || strcmp(op, "error") == 0) {
		on_abort(a, p, &msg.data, op[0] == 'e');
	} else {
		log_warn("unknown op %s from %s: ignored", op, from);
	}
	msgpack_unpacked_destroy(&msg);
}

/* Only a hello_nack of a peer that cannot reach us comes on our DEALER
 * to it (peer_return.c), and only while we wait for its answer to our
 * hello: it is the peer's word (with CURVE, the key we connected to is
 * its), and it proves nothing about our address reaching peers. It is
 * kept for our hello's own bound (xfer.c), not acted on at once: the
 * peer's connects may yet join (lost SYNs, a flap), and its hello_ack,
 * queued, then comes and wins. */
void peer_on_reply(struct agent *a, struct peer *p, const void *buf,
		   size_t len)
{
	msgpack_unpacked msg;
	char op[32], from[PDX_ADDR_MAX];
	bool unreachable = false;

	if (pdx_mp_parse(buf, len, &msg, op, sizeof(op)) ||
	    pdx_mp_get_str(&msg.data, "from", from, sizeof(from)) ||
	    strcmp(op, "hello_nack") != 0 || strcmp(from, p->addr) != 0 ||
	    pdx_mp_get_bool(&msg.data, "unreachable", &unreachable) ||
	    !unreachable || p->state != PEER_HELLO_SENT ||
	    pdx_mp_get_str(&msg.data, "reason", p->cannot_reach_us,
			   sizeof(p->cannot_reach_us))) {
		log_debug("a message from %s on our connection to it (%zu "
			  "bytes): dropped", p->addr, len);
		msgpack_unpacked_destroy(&msg);
		return;
	}
	log_warn("peer %s cannot reach this agent at its --advertise %s, so "
		 "its answers do not come: %s",
		 p->addr, a->peer_addr, p->cannot_reach_us);
	msgpack_unpacked_destroy(&msg);
}
