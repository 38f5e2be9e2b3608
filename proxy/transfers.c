/* Transfers counted in their instances' load until the agents report
 * them (see transfers.h). */
#define PDX_LOG_TOPIC "transfers"
#include "proxy/transfers.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mp.h"
#include "proxy/pool.h"

struct pdx_transfer {
	char id[33];		 /* the xfer_id as the proxy sent it */
	struct pdx_inst *side[2]; /* [PDX_POOL_PREFILL], [PDX_POOL_DECODE] */
	/* a side's ranks whose agents have not reported it done: a
	 * tensor-parallel instance's every rank's agent moves its part */
	unsigned left[2];
	uint64_t start_ns;
	UT_hash_handle hh;
};

/* This side's agent is done with it: it no longer counts there. */
static void side_end(struct pdx_transfer *x, int role)
{
	struct pdx_inst *i = x->side[role];

	if (!i)
		return;
	i->xfers--;
	pdx_pool_unref(i);
	x->side[role] = NULL;
}

static void transfer_free(struct pdx_transfers *t, struct pdx_transfer *x)
{
	side_end(x, PDX_POOL_PREFILL);
	side_end(x, PDX_POOL_DECODE);
	HASH_DEL(t->table, x);
	t->n--;
	free(x);
}

const char *const pdx_transfer_paths[PDX_TRANSFER_PATHS] = {
	"ipc", "put", "am", "cuda-put", "cuda-ipc", "staged",
};

/* A rank's "sent" notification: its bytes counted by the path it names,
 * and the transfer once its last rank sent. */
static void count_path(struct pdx_transfers *t, const msgpack_object *m,
		       bool last)
{
	char path[16];
	uint64_t bytes = 0;

	if (pdx_mp_get_str(m, "path", path, sizeof(path)))
		return;
	pdx_mp_get_u64(m, "bytes", &bytes);
	for (int i = 0; i < PDX_TRANSFER_PATHS; i++)
		if (!strcmp(path, pdx_transfer_paths[i])) {
			t->sent[i] += last;
			t->sent_bytes[i] += bytes;
		}
}

/* Is agent one of i's (any rank's)? */
static bool inst_agent(const struct pdx_inst *i, const char *agent)
{
	if (!i)
		return false;
	if (i->tp <= 1)
		return !strcmp(agent, i->peer);
	for (unsigned r = 0; r < i->tp; r++)
		if (!strcmp(agent, i->peers[r]))
			return true;
	return false;
}

/* One xfer_event: the side whose agent sent it is done once all its
 * ranks' agents said so; a failure ends it at once (the instance fails
 * the transfer on every rank). */
static void on_event(struct pdx_transfers *t, const void *buf, size_t len)
{
	char op[32], kind[16], agent[PDX_POOL_ADDR_MAX], id[33];
	struct pdx_transfer *x;
	struct pdx_xfer_id xid;
	msgpack_unpacked msg;
	int role;

	if (pdx_mp_parse(buf, len, &msg, op, sizeof(op)) ||
	    strcmp(op, "xfer_event") ||
	    pdx_mp_get_xfer(&msg.data, "xfer", &xid) ||
	    pdx_mp_get_str(&msg.data, "kind", kind, sizeof(kind)) ||
	    pdx_mp_get_str(&msg.data, "agent", agent, sizeof(agent))) {
		t->bad++;
		msgpack_unpacked_destroy(&msg);
		return;
	}
	t->events++;
	pdx_xfer_id_hex(&xid, id);
	HASH_FIND_STR(t->table, id, x);
	if (x && x->side[PDX_POOL_PREFILL] && !strcmp(kind, "sent"))
		count_path(t, &msg.data, x->left[PDX_POOL_PREFILL] == 1);
	msgpack_unpacked_destroy(&msg);
	if (!x) {
		t->unknown++;
		return;
	}
	if (!strcmp(kind, "sent"))
		role = PDX_POOL_PREFILL;
	else if (!strcmp(kind, "received"))
		role = PDX_POOL_DECODE;
	else /* "failed": either side; D's agents are always known */
		role = inst_agent(x->side[PDX_POOL_DECODE], agent)
			   ? PDX_POOL_DECODE
			   : PDX_POOL_PREFILL;
	log_debug("%s: %s by %s", id, kind, agent);
	if (!strcmp(kind, "failed"))
		pdx_pool_relearn(x->side[PDX_POOL_PREFILL],
				 x->side[PDX_POOL_DECODE]);
	if (strcmp(kind, "failed") && x->left[role] > 1)
		x->left[role]--;
	else
		side_end(x, role);
	if (!x->side[PDX_POOL_PREFILL] && !x->side[PDX_POOL_DECODE])
		transfer_free(t, x);
}

/* The socket's fd is edge-triggered: read until nothing is left. */
static void on_readable(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_transfers *t = arg;
	char buf[4096];

	for (;;) {
		int n = zmq_recv(t->sock, buf, sizeof(buf), ZMQ_DONTWAIT);

		if (n < 0)
			break;
		if ((size_t)n > sizeof(buf)) /* truncated: not ours */
			t->bad++;
		else
			on_event(t, buf, (size_t)n);
	}
}

/* x expired: said at warn, at most once a second with how many more
 * since, naming the instances whose agents said nothing. It went by
 * unsaid, and a deployment whose agents' --notify missed this proxy
 * balanced its load on transfers that only counted for a minute. */
static void say_expired(struct pdx_transfers *t, const struct pdx_transfer *x)
{
	const struct pdx_inst *p = x->side[PDX_POOL_PREFILL],
			      *d = x->side[PDX_POOL_DECODE];
	char more[64] = "";
	unsigned held;

	if (!pdx_said_now(&t->expired_said, &held))
		return;
	if (held)
		snprintf(more, sizeof(more),
			 " (and %u more since the last said)", held);
	log_warn("transfer %s not reported in %llu s by the agent(s) of %s%s%s%s"
		 "%s; no longer counted in their load: their --notify does "
		 "not reach this proxy (--notify-bind %s), or the transfer "
		 "hung%s",
		 x->id, (unsigned long long)(t->timeout_ns / 1000000000ull),
		 p ? "prefill " : "", p ? p->url : "", p && d ? " and " : "",
		 d ? "decode " : "", d ? d->url : "", t->endpoint, more);
}

static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_transfers *t = arg;
	uint64_t now = pdx_now_ns();
	struct pdx_transfer *x, *tmp;

	HASH_ITER(hh, t->table, x, tmp) {
		if (now - x->start_ns < t->timeout_ns)
			continue;
		say_expired(t, x);
		t->expired++;
		transfer_free(t, x);
	}
}

int pdx_transfers_open(struct pdx_transfers *t, struct event_base *base,
		       const char *addr, unsigned timeout_s, char *err,
		       size_t errlen)
{
	static const struct timeval second = {1, 0};
	size_t len = sizeof(t->endpoint);
	int fd = -1, hwm = 100000;

	t->timeout_ns = (uint64_t)timeout_s * 1000000000ull;
	t->zctx = zmq_ctx_new();
	t->sock = t->zctx ? zmq_socket(t->zctx, ZMQ_PULL) : NULL;
	if (!t->sock) {
		snprintf(err, errlen, "zmq: %s", zmq_strerror(zmq_errno()));
		return -1;
	}
	zmq_setsockopt(t->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
	/* an ipc:// path another process serves, or no socket, is refused
	 * rather than taken: common/ipc_path.h */
	if (pdx_ipc_bind(t->sock, zmq_bind, addr, "proxy", &t->ipc, err,
			 errlen))
		return -1;
	zmq_getsockopt(t->sock, ZMQ_LAST_ENDPOINT, t->endpoint, &len);
	len = sizeof(fd);
	zmq_getsockopt(t->sock, ZMQ_FD, &fd, &len);
	t->ev = event_new(base, fd, EV_READ | EV_PERSIST, on_readable, t);
	t->sweep = event_new(base, -1, EV_PERSIST, on_sweep, t);
	if (!t->ev || !t->sweep || event_add(t->ev, NULL) ||
	    event_add(t->sweep, &second)) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

void pdx_transfers_close(struct pdx_transfers *t)
{
	struct pdx_transfer *x, *tmp;

	HASH_ITER(hh, t->table, x, tmp) {
		transfer_free(t, x);
	}
	if (t->ev)
		event_free(t->ev);
	if (t->sweep)
		event_free(t->sweep);
	if (t->sock)
		zmq_close(t->sock);
	if (t->zctx)
		zmq_ctx_term(t->zctx);
	pdx_ipc_path_remove(&t->ipc);
	t->ev = t->sweep = NULL;
	t->sock = t->zctx = NULL;
}

static void side_start(struct pdx_transfer *x, int role, struct pdx_inst *i)
{
	if (!i)
		return;
	pdx_pool_ref(i);
	i->xfers++;
	x->side[role] = i;
	x->left[role] = i->tp > 1 ? i->tp : 1;
}

void pdx_transfers_start(struct pdx_transfers *t, const char *xfer_id,
			 struct pdx_inst *p, struct pdx_inst *d)
{
	struct pdx_transfer *x;
	size_t len = strlen(xfer_id);

	if (!t->sock || (!p && !d) || len >= sizeof(x->id) ||
	    t->n >= PDX_TRANSFERS_MAX)
		return;
	HASH_FIND_STR(t->table, xfer_id, x);
	/* an id twice: not expected (the proxy mints each); the newest
	 * counts */
	if (x)
		transfer_free(t, x);
	x = calloc(1, sizeof(*x));
	if (!x)
		return;
	memcpy(x->id, xfer_id, len + 1);
	x->start_ns = pdx_now_ns();
	side_start(x, PDX_POOL_PREFILL, p);
	side_start(x, PDX_POOL_DECODE, d);
	HASH_ADD_STR(t->table, id, x);
	t->n++;
}

void pdx_transfers_forget(struct pdx_transfers *t, const char *xfer_id)
{
	struct pdx_transfer *x;

	if (!t->sock)
		return;
	HASH_FIND_STR(t->table, xfer_id, x);
	if (x)
		transfer_free(t, x);
}
