/* engine_client: the engine client library against a scripted fake agent
 * (a ROUTER in a thread of this process): what goes on the wire, events
 * parked while register waits, malformed events skipped, bounded waits and
 * argument checks; events only for transfers announced here, an error
 * reply refusing an announcement as its event, and the agent going away
 * (what is in flight fails with EAGENT, an announcement racing it fails or
 * gets its one event). What engine authors get wrong: NULLs to the pure
 * helpers, a call from a second thread while one is under way, calls in a
 * forked child, events left unread by the hundred thousand, a peer
 * address buffer too small for register's answer. Needs no pdx-agent
 * (argv[1] is ignored).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/mp.h"
#include "tests/integ/harness.h"

enum reg_mode { REG_OK, REG_ERROR, REG_SILENT };

static void *zctx, *router;
static char endpoint[512];
static volatile int reg_mode;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char last_op[32];
static zmq_msg_t flood_ident; /* who asked for the flood */
static char *last_msg;
static size_t last_len;
static int n_msgs;

static void send_to(zmq_msg_t *ident, struct pdx_mp_out *o)
{
	zmq_msg_t id;

	zmq_msg_init(&id);
	zmq_msg_copy(&id, ident);
	zmq_msg_send(&id, router, ZMQ_SNDMORE);
	zmq_send(router, o->buf.data, o->buf.size, 0);
	pdx_mp_out_free(o);
}

/* An event map; drop names a key to leave out, kind may be bogus. */
static void event(zmq_msg_t *ident, const struct pdx_xfer_id *x,
		  const char *kind, int status, const char *reason,
		  const char *drop)
{
	struct pdx_mp_out o;
	const char *keys[] = { "op", "xfer", "kind", "status", "reason",
			       "bytes", "t_first", "t_last" };
	int n = 0;

	for (int i = 0; i < 8; i++)
		if (!drop || strcmp(drop, keys[i]))
			n++;
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, n);
	for (int i = 0; i < 8; i++) {
		const char *k = keys[i];

		if (drop && !strcmp(drop, k))
			continue;
		if (!strcmp(k, "op"))
			pdx_mp_kv_str(&o.pk, k, "event");
		else if (!strcmp(k, "xfer"))
			pdx_mp_kv_xfer(&o.pk, k, x);
		else if (!strcmp(k, "kind"))
			pdx_mp_kv_str(&o.pk, k, kind);
		else if (!strcmp(k, "status"))
			pdx_mp_kv_i64(&o.pk, k, status);
		else if (!strcmp(k, "reason"))
			pdx_mp_kv_str(&o.pk, k, reason);
		else if (!strcmp(k, "bytes"))
			pdx_mp_kv_u64(&o.pk, k, 4096);
		else if (!strcmp(k, "t_first"))
			pdx_mp_kv_u64(&o.pk, k, 111);
		else
			pdx_mp_kv_u64(&o.pk, k, 222);
	}
	send_to(ident, &o);
}

#define FLOOD 120000

/* Events by the hundred thousand, for transfers nobody announced: an
 * engine that reads none of them for a while (they pile up unread). */
static void flood(void)
{
	struct pdx_xfer_id y;
	zmq_msg_t id;

	memset(&y, 0xf0, sizeof(y));
	zmq_msg_init(&id);
	for (uint32_t i = 0; i < FLOOD; i++) {
		memcpy(y.b, &i, sizeof(i));
		zmq_msg_copy(&id, &flood_ident);
		event(&id, &y, "failed", PDX_ECANCELED, "flood", NULL);
	}
	zmq_msg_close(&id);
}

/* The fake agent's socket at endpoint; nothing it sends is dropped for
 * a slow reader (SNDHWM 0). */
static int router_open(void)
{
	int linger = 0, unbounded = 0;

	router = zmq_socket(zctx, ZMQ_ROUTER);
	zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof(linger));
	zmq_setsockopt(router, ZMQ_SNDHWM, &unbounded, sizeof(unbounded));
	if (zmq_bind(router, endpoint)) {
		h_note("bind %s: %s", endpoint, zmq_strerror(errno));
		return -1;
	}
	return 0;
}

/* The agent restarts at the same address: a new socket, so a new
 * connection (the engine has to register on it again). */
static void restart(void)
{
	zmq_close(router);
	router_open();
}

static void *fake_agent(void *arg)
{
	(void)arg;
	for (;;) {
		zmq_msg_t ident, body;
		msgpack_unpacked up;
		struct pdx_xfer_id x;
		struct pdx_mp_out o;
		char op[32];

		zmq_msg_init(&ident);
		zmq_msg_init(&body);
		if (zmq_msg_recv(&ident, router, 0) < 0 ||
		    zmq_msg_recv(&body, router, 0) < 0) {
			/* context shut down */
			zmq_msg_close(&ident);
			zmq_msg_close(&body);
			break;
		}
		if (pdx_mp_parse(zmq_msg_data(&body), zmq_msg_size(&body), &up,
				 op, sizeof(op))) {
			snprintf(op, sizeof(op), "(malformed)");
		}
		pthread_mutex_lock(&mu);
		snprintf(last_op, sizeof(last_op), "%s", op);
		free(last_msg);
		last_len = zmq_msg_size(&body);
		last_msg = malloc(last_len);
		memcpy(last_msg, zmq_msg_data(&body), last_len);
		n_msgs++;
		pthread_mutex_unlock(&mu);

		memset(&x, 0x42, sizeof(x));
		if (!strcmp(op, "register") && reg_mode == REG_OK) {
			/* events before the answer: one malformed, one good */
			event(&ident, &x, "sent", 0, "", "t_last");
			event(&ident, &x, "received", 0, "", NULL);
			pdx_mp_out_init(&o);
			msgpack_pack_map(&o.pk, 2);
			pdx_mp_kv_str(&o.pk, "op", "registered");
			pdx_mp_kv_str(&o.pk, "peer", "tcp://fake:1");
			send_to(&ident, &o);
		} else if (!strcmp(op, "register") && reg_mode == REG_ERROR) {
			pdx_mp_out_init(&o);
			msgpack_pack_map(&o.pk, 3);
			pdx_mp_kv_str(&o.pk, "op", "error");
			pdx_mp_kv_i64(&o.pk, "status", PDX_ERANGE);
			pdx_mp_kv_str(&o.pk, "reason", "blocks end past region 0");
			send_to(&ident, &o);
		} else if (!strcmp(op, "abort") &&
			   !pdx_mp_get_xfer(&up.data, "xfer", &x) &&
			   x.b[0] == 0xdd && x.b[1] == 0xdd) {
			/* this agent dies: its connection closes */
			msgpack_unpacked_destroy(&up);
			zmq_msg_close(&ident);
			zmq_msg_close(&body);
			break;
		} else if (!strcmp(op, "recv") &&
			   !pdx_mp_get_xfer(&up.data, "xfer", &x) &&
			   x.b[0] == 0xee && x.b[1] == 0xee) {
			/* refused by an error reply, not an event */
			pdx_mp_out_init(&o);
			msgpack_pack_map(&o.pk, 5);
			pdx_mp_kv_str(&o.pk, "op", "error");
			pdx_mp_kv_str(&o.pk, "refused", "recv");
			pdx_mp_kv_xfer(&o.pk, "xfer", &x);
			pdx_mp_kv_i64(&o.pk, "status", PDX_EEXIST);
			pdx_mp_kv_str(&o.pk, "reason", "xfer: already in use here");
			send_to(&ident, &o);
		} else if (!strcmp(op, "hold") &&
			   !pdx_mp_get_xfer(&up.data, "xfer", &x) &&
			   x.b[0] == 0xf1 && x.b[1] == 0xf1) {
			zmq_msg_init(&flood_ident);
			zmq_msg_copy(&flood_ident, &ident);
			flood();
			zmq_msg_close(&flood_ident);
		} else if (!strcmp(op, "hold") &&
			   !pdx_mp_get_xfer(&up.data, "xfer", &x) &&
			   x.b[0] == 0xcc && x.b[1] == 0xcc) {
			restart();
		} else if (!strcmp(op, "abort")) {
			pdx_mp_get_xfer(&up.data, "xfer", &x);
			/* garbage, a bogus kind, a stray answer, then the event */
			zmq_msg_t id2;

			zmq_msg_init(&id2);
			zmq_msg_copy(&id2, &ident);
			zmq_msg_send(&id2, router, ZMQ_SNDMORE);
			zmq_send(router, "\xc1\xc1", 2, 0);
			event(&ident, &x, "exploded", 0, "", NULL);
			pdx_mp_out_init(&o);
			msgpack_pack_map(&o.pk, 2);
			pdx_mp_kv_str(&o.pk, "op", "registered");
			pdx_mp_kv_str(&o.pk, "peer", "tcp://stale:1");
			send_to(&ident, &o);
			event(&ident, &x, "failed", PDX_ECANCELED,
			      "aborted by engine", NULL);
		}
		msgpack_unpacked_destroy(&up);
		zmq_msg_close(&ident);
		zmq_msg_close(&body);
	}
	zmq_close(router); /* the socket belongs to this thread */
	return NULL;
}

/* Waits for the fake agent to have seen `count` messages; returns the last
 * one parsed into *up (caller destroys), or -1. */
static int last_message(int count, msgpack_unpacked *up, char *op)
{
	uint64_t deadline = pdx_now_ns() + 3000000000ULL;
	int rc = -1;

	while (pdx_now_ns() < deadline) {
		pthread_mutex_lock(&mu);
		if (n_msgs >= count) {
			rc = pdx_mp_parse(last_msg, last_len, up, op, 32);
			pthread_mutex_unlock(&mu);
			return rc;
		}
		pthread_mutex_unlock(&mu);
		h_sleep_ms(5);
	}
	return rc;
}

/* The pure helpers given NULL: a status, 0 or an empty string, no crash. */
static void null_helpers(const struct pdx_kv_layout *l)
{
	char why[64] = "stale", hex[33] = "stale";

	CHECK(pdx_kv_layout_block_bytes(NULL) == 0 &&
		      pdx_kv_layout_block_bytes_all(NULL) == 0 &&
		      pdx_kv_layout_compat_hash(NULL) == 0,
	      "a layout's sizes and hash of NULL: 0");
	CHECK(pdx_kv_layout_check(NULL, NULL, 0, why, sizeof(why)) ==
			  PDX_EINVAL &&
		      strstr(why, "needs a layout"),
	      "pdx_kv_layout_check(NULL): EINVAL, saying why (%s)", why);
	CHECK(pdx_kv_layout_check(l, NULL, 1, NULL, 0) == PDX_EINVAL,
	      "pdx_kv_layout_check without region sizes: EINVAL");
	CHECK(pdx_kv_layout_diff(NULL, l, why, sizeof(why)) == 1 &&
		      strstr(why, "no layout"),
	      "pdx_kv_layout_diff with NULL: differs, saying so (%s)", why);
	CHECK_EQ(pdx_xfer_id_random(NULL), PDX_EINVAL,
		 "pdx_xfer_id_random(NULL): EINVAL");
	pdx_xfer_id_hex(NULL, hex);
	pdx_xfer_id_hex(NULL, NULL);
	CHECK(hex[0] == '\0', "pdx_xfer_id_hex(NULL): an empty string");
}

struct waiter {
	struct pdx_engine *e;
	pdx_status_t st;
};

static void *wait_in_thread(void *arg)
{
	struct waiter *w = arg;
	struct pdx_engine_event ev;

	w->st = pdx_engine_wait_event(w->e, 2000, &ev);
	return NULL;
}

/* A second thread's call while one is under way on the engine (vLLM's
 * scheduler and worker, unlocked): refused at once, never run beside it
 * on the same sockets and tables (before: crashes, now and then). */
static void two_threads(struct pdx_engine *e)
{
	struct waiter w = { e, PDX_OK };
	struct pdx_xfer_id x;
	pthread_t th;
	uint64_t t0, ms;
	pdx_status_t st;

	pdx_xfer_id_random(&x);
	pthread_create(&th, NULL, wait_in_thread, &w);
	h_sleep_ms(300); /* well inside its wait */
	t0 = pdx_now_ns();
	st = pdx_engine_abort(e, &x);
	ms = (pdx_now_ns() - t0) / 1000000;
	CHECK(st == PDX_EINVAL && ms < 100,
	      "a call from a second thread while wait_event is under way on "
	      "the engine fails at once: EINVAL (%s, %llu ms)",
	      pdx_status_str(st), (unsigned long long)ms);
	pthread_join(th, NULL);
	CHECK_EQ(w.st, PDX_ETIMEDOUT, "the call under way goes on undisturbed");
	CHECK_EQ(pdx_engine_abort(e, &x), PDX_ENOTREG,
		 "once it returned, the engine is the next caller's (not "
		 "registered)");
}

/* A worker pool forked after connecting: the parent's engine in the
 * child refuses every call, saying why, and can be freed there (before:
 * the first call spun for ever on ZeroMQ's EINTR). */
static void forked_child(struct pdx_engine *e)
{
	struct pdx_xfer_id x;
	pid_t pid;
	int ws = 0;

	pdx_xfer_id_random(&x);
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		pdx_status_t st;
		int ok;

		alarm(5);
		st = pdx_engine_abort(e, &x);
		ok = st == PDX_EINVAL &&
		     strstr(pdx_engine_last_error(e), "forked") != NULL;
		if (!ok)
			printf("child: %s: %s\n", pdx_status_str(st),
			       pdx_engine_last_error(e));
		pdx_engine_free(e);
		fflush(stdout);
		_exit(ok ? 0 : 1);
	}
	waitpid(pid, &ws, 0);
	CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
	      "in a forked child the parent's engine refuses calls (EINVAL, "
	      "\"forked\") and is freed, instead of hanging (%s %d)",
	      WIFEXITED(ws) ? "exit" : "signal",
	      WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
	CHECK_EQ(pdx_engine_abort(e, &x), PDX_ENOTREG,
		 "the parent's engine is as it was (not registered)");
}

/* An engine that leaves FLOOD events unread while liveness_ms passes
 * seven times over: its agent is not taken for hung (before: ZeroMQ
 * stopped reading the connection at 100000 messages, heartbeats
 * included, and every transfer in flight failed EAGENT). */
static void unread_pile(const struct pdx_shm_pool *pool)
{
	struct pdx_engine_params ep = { .agent = endpoint, .liveness_ms = 200 };
	struct pdx_engine *e;
	struct pdx_engine_event ev;
	struct pdx_xfer_id xa, xf;
	char peer[PDX_ADDR_MAX], why[PDX_REASON_MAX] = "";
	uint32_t block = 1;
	int xa_events = 0;
	pdx_status_t st;

	reg_mode = REG_OK;
	if (pdx_engine_connect(&ep, &e) != PDX_OK ||
	    pdx_engine_register(e, &pool->layout, &pool->region, 1, peer,
				sizeof(peer)) != PDX_OK) {
		CHECK_FAIL("an engine registers with the fake agent again");
		return;
	}
	pdx_xfer_id_random(&xa);
	memset(&xf, 0xf1, sizeof(xf));
	CHECK(pdx_engine_send(e, &xa, "tcp://peer:9", &block, 1) == PDX_OK &&
		      pdx_engine_hold(e, &xf, "tcp://peer:9") == PDX_OK,
	      "a transfer in flight, and %d events coming", FLOOD);
	h_sleep_ms(1400);
	while ((st = pdx_engine_next_event(e, &ev)) == PDX_OK)
		xa_events += !memcmp(&ev.xfer, &xa, sizeof(xa));
	CHECK(st == PDX_EAGAIN && xa_events == 0,
	      "events left unread pile up: the transfer in flight goes on "
	      "(%d events for it, last: %s)",
	      xa_events, xa_events ? ev.reason : "-");
	st = pdx_engine_link_status(e, why, sizeof(why));
	CHECK(st == PDX_OK, "the link stays up (%s)", why);
	pdx_engine_free(e);
}

/* register's answer does not fit the caller's buffer: ETOOBIG, but the
 * agent holds the register, and so does the library, which sends it
 * again to the agent restarted (before: it kept the earlier one, here
 * none, and the restarted agent heard no register). */
static void small_peer_buffer(const struct pdx_shm_pool *pool)
{
	struct pdx_engine_params ep = { .agent = endpoint, .timeout_ms = 2000 };
	struct pdx_engine *e;
	struct pdx_engine_event ev;
	struct pdx_xfer_id xc;
	char peer[4];
	uint64_t deadline;
	int before, again = 0;
	pdx_status_t st;

	reg_mode = REG_OK;
	if (pdx_engine_connect(&ep, &e) != PDX_OK) {
		CHECK_FAIL("connect");
		return;
	}
	st = pdx_engine_register(e, &pool->layout, &pool->region, 1, peer,
				 sizeof(peer));
	CHECK(st == PDX_ETOOBIG &&
		      !strcmp(pdx_engine_peer_addr(e), "tcp://fake:1") &&
		      strstr(pdx_engine_last_error(e), "registered all the same"),
	      "register with no room for the peer address: ETOOBIG, the "
	      "address from pdx_engine_peer_addr() (%s: %s)",
	      pdx_status_str(st), pdx_engine_last_error(e));
	pthread_mutex_lock(&mu);
	before = n_msgs;
	pthread_mutex_unlock(&mu);
	memset(&xc, 0xcc, sizeof(xc));
	pdx_engine_hold(e, &xc, "tcp://peer:9"); /* the fake agent restarts */
	deadline = pdx_now_ns() + 3000000000ULL;
	while (!again && pdx_now_ns() < deadline) {
		pdx_engine_next_event(e, &ev);
		h_sleep_ms(20);
		pthread_mutex_lock(&mu);
		again = n_msgs > before + 1 && !strcmp(last_op, "register");
		pthread_mutex_unlock(&mu);
	}
	CHECK(again, "that register is the one sent again to the agent "
		     "restarted");
	pdx_engine_free(e);
}

int main(int argc, char **argv)
{
	struct pdx_model m = *pdx_model_find("tiny");
	struct pdx_engine_params ep = { 0 };
	struct pdx_engine *e = NULL, *lonely = NULL;
	struct pdx_engine_event ev;
	struct pdx_xfer_id x, x42, xr;
	struct pdx_shm_pool pool;
	struct pdx_engine_region cuda = { .type = PDX_MEM_CUDA, .size = 1 << 20,
					  .cuda_device = -1 };
	msgpack_unpacked up;
	pthread_t th;
	char dir[256], peer[PDX_ADDR_MAX], op[32], longpeer[300];
	uint32_t blocks[3] = { 5, 6, 9 };
	uint64_t t0, v;
	int count = 0;
	pdx_status_t st;

	(void)argc;
	(void)argv;
	setvbuf(stdout, NULL, _IOLBF, 0);
	pb_cleanup_install();
	h_note("engine_client: the client library against a fake agent");
	if (pb_tmpdir(dir, sizeof(dir)))
		return 1;
	snprintf(endpoint, sizeof(endpoint), "ipc://%s/fake.engine", dir);
	snprintf(peer, sizeof(peer), "/pdx-test-%d-C", (int)getpid());
	if (pb_pool_create(&pool, peer, &m, 64))
		return 1;
	memset(&x42, 0x42, sizeof(x42));
	pdx_xfer_id_random(&x);
	pdx_xfer_id_random(&xr);

	/* argument checks */
	CHECK(pdx_engine_connect(&ep, &e) == PDX_EINVAL && !e,
	      "connect without an agent address: EINVAL");
	ep.agent = endpoint;
	ep.timeout_ms = -5;
	CHECK(pdx_engine_connect(&ep, &e) == PDX_EINVAL,
	      "connect with a negative timeout: EINVAL");
	ep.timeout_ms = 0;
	ep.xfer_timeout_ms = PDX_XFER_TIMEOUT_MAX_MS + 1;
	CHECK(pdx_engine_connect(&ep, &e) == PDX_EINVAL,
	      "connect with a transfer bound over an hour: EINVAL (the agent "
	      "would fail every transfer for it)");
	ep.xfer_timeout_ms = 0;
	null_helpers(&pool.layout);

	/* no agent at all: bounded */
	ep.timeout_ms = 300;
	CHECK(pdx_engine_connect(&ep, &lonely) == PDX_OK, "connect does not wait for the agent");
	t0 = pdx_now_ns();
	st = pdx_engine_register(lonely, &pool.layout, &pool.region, 1, peer,
				 sizeof(peer));
	v = (pdx_now_ns() - t0) / 1000000;
	CHECK(st == PDX_ETIMEDOUT && v >= 250 && v < 2000,
	      "register with no agent: ETIMEDOUT after the timeout (%s, %llu ms)",
	      pdx_status_str(st), (unsigned long long)v);
	t0 = pdx_now_ns();
	st = pdx_engine_abort(lonely, &x);
	v = (pdx_now_ns() - t0) / 1000000;
	CHECK(st == PDX_ENOTREG && v < 100,
	      "a fire-and-forget call with no agent fails at once, not registered: an engine's loop never waits for a dead agent (%s, %llu ms)",
	      pdx_status_str(st), (unsigned long long)v);
	CHECK(pdx_engine_abort_at(lonely, &x, "") == PDX_EINVAL &&
		      pdx_engine_hold(lonely, &x, "") == PDX_EINVAL,
	      "abort_at and hold naming an empty peer: EINVAL (it names "
	      "nobody)");
	two_threads(lonely);
	forked_child(lonely);
	pdx_engine_free(lonely);
	pdx_engine_free(NULL);

	zctx = zmq_ctx_new();
	if (router_open())
		return 1;
	pthread_create(&th, NULL, fake_agent, NULL);

	ep.timeout_ms = 2000;
	ep.xfer_timeout_ms = 1234;
	CHECK(pdx_engine_connect(&ep, &e) == PDX_OK, "connect");
	CHECK(pdx_engine_fd(e) >= 0, "pdx_engine_fd gives a descriptor");
	CHECK(pdx_engine_fd(NULL) == -1, "pdx_engine_fd(NULL) is -1");

	CHECK(pdx_engine_register(e, &pool.layout, &cuda, 1, peer, sizeof(peer)) ==
		      PDX_EINVAL,
	      "a cuda region without a device is refused with EINVAL");
	CHECK(pdx_engine_register(e, &pool.layout, &pool.region, 0, peer,
				  sizeof(peer)) == PDX_EINVAL,
	      "register with no region: EINVAL");
	{
		struct pdx_engine_region small = pool.region;

		small.size = pool.size / 2;
		CHECK(pdx_engine_register(e, &pool.layout, &small, 1, peer,
					  sizeof(peer)) == PDX_ERANGE,
		      "a layout past its region is refused before sending: ERANGE");
	}
	CHECK_EQ(n_msgs, 0, "nothing refused went on the wire");

	reg_mode = REG_OK;
	st = pdx_engine_register(e, &pool.layout, &pool.region, 1, peer,
				 sizeof(peer));
	count++;
	CHECK(st == PDX_OK && !strcmp(peer, "tcp://fake:1"),
	      "register: ok, peer address from the answer (%s, %s)",
	      pdx_status_str(st), st == PDX_OK ? peer : "-");
	{
		char why[32] = "stale";

		CHECK(pdx_engine_link_status(e, why, sizeof(why)) == PDX_OK &&
			      why[0] == '\0',
		      "link status ok: its reason is empty, nothing stale "
		      "(\"%s\")", why);
	}
	if (last_message(count, &up, op) == 0) {
		const msgpack_object *regs = pdx_mp_get(&up.data, "regions");
		const msgpack_object *lay = pdx_mp_get(&up.data, "layout");
		uint64_t ver = 0, layers = 0, size = 0;
		char type[16] = "", name[64] = "";

		pdx_mp_get_u64(&up.data, "v", &ver);
		if (lay)
			pdx_mp_get_u64(lay, "layers", &layers);
		if (regs && regs->type == MSGPACK_OBJECT_ARRAY &&
		    regs->via.array.size == 1) {
			pdx_mp_get_str(&regs->via.array.ptr[0], "type", type,
				       sizeof(type));
			pdx_mp_get_str(&regs->via.array.ptr[0], "name", name,
				       sizeof(name));
			pdx_mp_get_u64(&regs->via.array.ptr[0], "size", &size);
		}
		CHECK(!strcmp(op, "register") && ver == 1 && layers == 4 &&
			      !strcmp(type, "shm") && !strcmp(name, pool.name) &&
			      size == pool.size,
		      "register carries v 1, the layout and the shm region");
		msgpack_unpacked_destroy(&up);
	} else {
		CHECK(false, "the fake agent got the register");
	}
	CHECK(pdx_engine_next_event(e, &ev) == PDX_EAGAIN,
	      "events for a transfer never announced here are dropped: each "
	      "announced transfer ends in exactly one event");
	/* the same again with x42 announced: its event is kept */
	CHECK(pdx_engine_recv(e, &x42, "tcp://peer:9", blocks, 3, 0) == PDX_OK,
	      "recv of x42 posts");
	count++;
	st = pdx_engine_register(e, &pool.layout, &pool.region, 1, peer,
				 sizeof(peer));
	count++;
	CHECK_EQ(st, PDX_OK);
	st = pdx_engine_next_event(e, &ev);
	CHECK(st == PDX_OK && ev.kind == PDX_EVENT_RECEIVED &&
		      !memcmp(&ev.xfer, &x42, sizeof(x42)) && ev.bytes == 4096 &&
		      ev.t_first_ns == 111 && ev.t_last_ns == 222 &&
		      ev.status == PDX_OK,
	      "the event that came during register is kept, fields intact");
	CHECK(pdx_engine_next_event(e, &ev) == PDX_EAGAIN,
	      "the malformed one (no t_last) was skipped: then EAGAIN");
	t0 = pdx_now_ns();
	st = pdx_engine_wait_event(e, 200, &ev);
	v = (pdx_now_ns() - t0) / 1000000;
	CHECK(st == PDX_ETIMEDOUT && v >= 190 && v < 1000,
	      "wait_event with nothing to read: ETIMEDOUT after 200 ms (%llu ms)",
	      (unsigned long long)v);

	reg_mode = REG_ERROR;
	st = pdx_engine_register(e, &pool.layout, &pool.region, 1, peer,
				 sizeof(peer));
	count++;
	CHECK_EQ(st, PDX_ERANGE, "an error answer gives its status (%s)",
	      pdx_status_str(st));
	reg_mode = REG_SILENT;
	ep.timeout_ms = 2000;
	t0 = pdx_now_ns();
	st = pdx_engine_register(e, &pool.layout, &pool.region, 1, peer,
				 sizeof(peer));
	count++;
	v = (pdx_now_ns() - t0) / 1000000;
	CHECK(st == PDX_ETIMEDOUT && v >= 1900 && v < 4000,
	      "no answer: ETIMEDOUT after timeout_ms (%llu ms)",
	      (unsigned long long)v);

	/* announcements */
	memset(longpeer, 'a', sizeof(longpeer) - 1);
	longpeer[sizeof(longpeer) - 1] = '\0';
	CHECK(pdx_engine_send(e, NULL, "tcp://p:1", blocks, 3) == PDX_EINVAL &&
		      pdx_engine_send(e, &x, "tcp://p:1", blocks, 0) == PDX_EINVAL &&
		      pdx_engine_send(e, &x, "tcp://p:1", NULL, 3) == PDX_EINVAL &&
		      pdx_engine_recv(e, &x, NULL, blocks, 3, 0) == PDX_EINVAL &&
		      pdx_engine_send(e, &x, "", blocks, 3) == PDX_EINVAL &&
		      pdx_engine_send(e, &x, longpeer, blocks, 3) == PDX_EINVAL &&
		      pdx_engine_recv(e, &x, longpeer, blocks, 3, 0) == PDX_EINVAL &&
		      pdx_engine_layer_done(e, 0, NULL, 1) == PDX_EINVAL &&
		      pdx_engine_layer_done(e, 0, &x, 0) == PDX_EINVAL &&
		      pdx_engine_abort(e, NULL) == PDX_EINVAL &&
		      pdx_engine_next_event(e, NULL) == PDX_EINVAL &&
		      pdx_engine_send(NULL, &x, "tcp://p:1", blocks, 3) == PDX_EINVAL,
	      "NULLs, zero counts, a recv without a peer and a peer address "
	      "too long: EINVAL");

	CHECK(pdx_engine_send(e, &x, "tcp://peer:9", blocks, 3) == PDX_OK,
	      "send posts");
	count++;
	if (last_message(count, &up, op) == 0) {
		struct pdx_xfer_id got;
		uint32_t *b = NULL;
		size_t nb = 0;
		uint64_t tmo = 0;
		char p[64] = "";

		CHECK(!strcmp(op, "send") &&
			      !pdx_mp_get_xfer(&up.data, "xfer", &got) &&
			      !memcmp(&got, &x, sizeof(x)) &&
			      !pdx_mp_get_str(&up.data, "peer", p, sizeof(p)) &&
			      !strcmp(p, "tcp://peer:9") &&
			      !pdx_mp_get_u32s(&up.data, "blocks", 16, &b, &nb) &&
			      nb == 3 && b[0] == 5 && b[2] == 9 &&
			      !pdx_mp_get_u64(&up.data, "timeout_ms", &tmo) &&
			      tmo == 1234,
		      "send carries xfer, peer, blocks and timeout_ms");
		free(b);
		msgpack_unpacked_destroy(&up);
	} else {
		CHECK(false, "the fake agent got the send");
	}
	{
		int before = n_msgs;

		CHECK(pdx_engine_recv(e, &x, "tcp://peer:9", blocks, 3, 4) ==
				  PDX_EEXIST &&
			      n_msgs == before,
		      "an id in flight announced again: EEXIST, nothing sent");
	}
	CHECK(pdx_engine_recv(e, &xr, "tcp://peer:9", blocks, 3, 4) == PDX_OK,
	      "recv posts");
	count++;
	if (last_message(count, &up, op) == 0) {
		uint64_t skip = 0;

		CHECK(!strcmp(op, "recv") &&
			      !pdx_mp_get_u64(&up.data, "skip_tokens", &skip) &&
			      skip == 4,
		      "recv carries skip_tokens");
		msgpack_unpacked_destroy(&up);
	} else {
		CHECK(false, "the fake agent got the recv");
	}
	{
		struct pdx_xfer_id two[2] = { x, x42 };

		CHECK(pdx_engine_layer_done(e, 3, two, 2) == PDX_OK,
		      "layer_done posts");
	}
	count++;
	if (last_message(count, &up, op) == 0) {
		const msgpack_object *xs = pdx_mp_get(&up.data, "xfers");
		uint64_t layer = 99;
		struct pdx_xfer_id a, b;

		CHECK(!strcmp(op, "layer_done") &&
			      !pdx_mp_get_u64(&up.data, "layer", &layer) &&
			      layer == 3 && xs && xs->type == MSGPACK_OBJECT_ARRAY &&
			      xs->via.array.size == 2 &&
			      !pdx_mp_obj_xfer(&xs->via.array.ptr[0], &a) &&
			      !pdx_mp_obj_xfer(&xs->via.array.ptr[1], &b) &&
			      !memcmp(&a, &x, sizeof(x)) &&
			      !memcmp(&b, &x42, sizeof(x)),
		      "layer_done carries the layer and both xfers");
		msgpack_unpacked_destroy(&up);
	} else {
		CHECK(false, "the fake agent got the layer_done");
	}

	CHECK(pdx_engine_abort(e, &x) == PDX_OK, "abort posts");
	st = pdx_engine_wait_event(e, 3000, &ev);
	CHECK(st == PDX_OK && ev.kind == PDX_EVENT_FAILED &&
		      !memcmp(&ev.xfer, &x, sizeof(x)) &&
		      ev.status == PDX_ECANCELED &&
		      !strcmp(ev.reason, "aborted by engine"),
	      "garbage, an unknown kind and a stray answer are skipped; the failed event arrives (%s)",
	      st == PDX_OK ? ev.reason : pdx_status_str(st));
	CHECK(pdx_engine_next_event(e, &ev) == PDX_EAGAIN, "then nothing");

	/* a recv the agent refuses with an error reply ends in one event */
	{
		struct pdx_xfer_id xe;

		memset(&xe, 0xee, sizeof(xe));
		CHECK(pdx_engine_recv(e, &xe, "tcp://peer:9", blocks, 3, 0) ==
			      PDX_OK,
		      "a recv the agent will refuse posts");
		st = pdx_engine_wait_event(e, 3000, &ev);
		CHECK(st == PDX_OK && ev.kind == PDX_EVENT_FAILED &&
			      !memcmp(&ev.xfer, &xe, sizeof(xe)) &&
			      ev.status == PDX_EEXIST &&
			      strstr(ev.reason, "already in use"),
		      "an error reply refusing it is its one failed event "
		      "(%s: %s)",
		      pdx_status_str(st == PDX_OK ? ev.status : st),
		      st == PDX_OK ? ev.reason : "-");
	}

	/* The agent goes away: what is in flight fails at once (EAGENT); an
	 * announcement racing the loss, made before anything was read,
	 * either fails or gets its one event, never both. */
	{
		struct pdx_xfer_id xa, xb, xdie;
		char why[PDX_REASON_MAX];
		int got_a = 0, got_b = 0, other = 0;
		pdx_status_t a_status = PDX_OK;

		pdx_xfer_id_random(&xa);
		pdx_xfer_id_random(&xb);
		memset(&xdie, 0xdd, sizeof(xdie));
		CHECK(pdx_engine_send(e, &xa, "tcp://peer:9", blocks, 3) ==
			      PDX_OK,
		      "a transfer in flight");
		pdx_engine_abort(e, &xdie); /* the fake agent dies on it */
		h_sleep_ms(100);	    /* its connection is gone; unread */
		st = pdx_engine_recv(e, &xb, "tcp://peer:9", blocks, 3, 0);
		while (pdx_engine_wait_event(e, 300, &ev) == PDX_OK) {
			if (!memcmp(&ev.xfer, &xa, sizeof(xa))) {
				got_a++;
				a_status = ev.status;
			} else if (!memcmp(&ev.xfer, &xb, sizeof(xb))) {
				got_b++;
			} else if (ev.status != PDX_EAGENT ||
				   memcmp(&ev.xfer, &xr, sizeof(xr))) {
				other++; /* xr, still in flight, fails too */
			}
		}
		CHECK(got_a == 1 && a_status == PDX_EAGENT,
		      "the agent gone: the transfer in flight gets one failed "
		      "event, its agent went away (%d, %s)",
		      got_a, pdx_status_str(a_status));
		CHECK((st == PDX_OK && got_b == 1) || (st != PDX_OK && got_b == 0),
		      "an announcement racing the loss: it failed (%s) or got "
		      "its one event (%d), not both",
		      pdx_status_str(st), got_b);
		CHECK(other == 0, "no other event but the failure of the "
				  "earlier recv still in flight");
		CHECK(pdx_engine_link_status(e, why, sizeof(why)) == PDX_EPEER &&
			      strstr(why, "link to the agent was lost"),
		      "the link's status says the agent is away (%s)", why);
		t0 = pdx_now_ns();
		CHECK(pdx_engine_recv(e, &xb, "tcp://peer:9", blocks, 3, 0) ==
			      PDX_EPEER,
		      "announcements fail at once while it is away");
		CHECK(pdx_engine_abort(e, &xb) == PDX_EPEER &&
			      pdx_engine_layer_done(e, 0, &xb, 1) == PDX_EPEER,
		      "so do fire-and-forget calls of a registered engine");
		v = (pdx_now_ns() - t0) / 1000000;
		CHECK(v < 100, "none of them waits for the dead agent (%llu "
			       "ms): an engine's loop never does",
		      (unsigned long long)v);
	}

	/* a fake agent again, for what needs one alive */
	pthread_join(th, NULL);
	if (router_open())
		return 1;
	pthread_create(&th, NULL, fake_agent, NULL);
	unread_pile(&pool);
	small_peer_buffer(&pool);

	pdx_engine_free(e);
	zmq_ctx_shutdown(zctx);
	pthread_join(th, NULL);
	zmq_ctx_term(zctx);
	free(last_msg);
	pb_pool_destroy(&pool);
	pb_tmpdir_remove(dir);
	CHECK_DONE();
}
