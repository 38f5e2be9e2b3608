/* The TP leader's liveness against a follower played by hand over real
 * ZeroMQ: one that answers pings but never writes the pass it was sent
 * breaks the group within the liveness bound (it used to hang the step
 * for ever), and one whose connection is gone breaks it at the next send
 * (the ROUTER used to drop those sends unseen), long before the bound. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "engine/tp_leader.h"
#include "tests/check.h"

struct seen {
	bool broken;
	char why[PDX_REASON_MAX];
};

static void on_event(void *arg, uint32_t rank, const struct pdx_engine_event *ev)
{
}

static void on_caught_up(void *arg)
{
}

static void on_broken(void *arg, const char *why)
{
	struct seen *s = arg;

	s->broken = true;
	snprintf(s->why, sizeof(s->why), "%s", why);
}

static int send_msg(void *sock, const struct pdx_tp_msg *m)
{
	uint8_t *buf;
	size_t len;
	int rc;

	if (pdx_tp_msg_encode(m, &buf, &len) != PDX_OK)
		return -1;
	rc = zmq_send(sock, buf, len, 0) < 0 ? -1 : 0;
	free(buf);
	return rc;
}

/* Runs the loop for up to ms, the follower pinging every 20 ms when it
 * is there, until the group broke. Returns the ms it took. */
static uint64_t run_until_broken(struct event_base *base, void *follower,
				 const struct seen *s, uint32_t ms)
{
	uint64_t t0 = pdx_now_ns(), ping_ns = 0;
	struct pdx_tp_msg ping = {.kind = PDX_TP_PING};

	while (!s->broken && pdx_now_ns() - t0 < (uint64_t)ms * 1000000) {
		struct timeval tv = {0, 5000};

		if (follower && pdx_now_ns() - ping_ns > 20000000) {
			send_msg(follower, &ping);
			ping_ns = pdx_now_ns();
		}
		event_base_loopexit(base, &tv);
		event_base_dispatch(base);
	}
	return (pdx_now_ns() - t0) / 1000000;
}

/* A leader of TP 2 at addr and a joined follower (its DEALER). */
static struct pdx_tp_leader *group(struct event_base *base, const char *addr,
				   uint32_t liveness_ms, struct seen *s,
				   void *zctx, void **follower)
{
	struct pdx_tp_leader_params p = {
		.base = base, .addr = addr, .size = 2, .model = "tiny",
		.blocks = 64, .block_tokens = 16, .liveness_ms = liveness_ms,
		.cbs = {on_event, on_caught_up, on_broken, s},
	};
	struct pdx_tp_msg hello = {.kind = PDX_TP_HELLO, .rank = 1, .size = 2,
				   .blocks = 64};
	struct pdx_tp_leader *l = NULL;
	char err[256] = "";
	int zero = 0;
	pdx_status_t st = pdx_tp_leader_new(&p, &l, err, sizeof(err));

	CHECK(st == PDX_OK, "a leader binds %s %s", addr, err);
	if (st)
		return NULL;
	*follower = zmq_socket(zctx, ZMQ_DEALER);
	zmq_setsockopt(*follower, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_connect(*follower, addr);
	snprintf(hello.text, sizeof(hello.text), "tiny");
	snprintf(hello.peer, sizeof(hello.peer), "tcp://127.0.0.1:1");
	send_msg(*follower, &hello);
	for (int i = 0; i < 200 && pdx_tp_leader_status(l, NULL, 0); i++)
		run_until_broken(base, NULL, s, 10);
	CHECK(pdx_tp_leader_status(l, NULL, 0) == PDX_OK, "rank 1 joins");
	return l;
}

static void pass_never_written(struct event_base *base, void *zctx)
{
	char addr[64];
	struct seen s = {0};
	void *follower = NULL;
	struct pdx_tp_leader *l;
	uint64_t ms;

	snprintf(addr, sizeof(addr), "ipc:///tmp/pdx_tp_leader_%d_a", getpid());
	l = group(base, addr, 400, &s, zctx, &follower);
	if (!l)
		return;
	CHECK(pdx_tp_leader_step(l, NULL, 0) == PDX_OK, "a pass goes out");
	ms = run_until_broken(base, follower, &s, 5000);
	CHECK(s.broken, "a rank that pings but never writes its pass breaks "
	      "the group (after %llu ms)", (unsigned long long)ms);
	CHECK(strstr(s.why, "rank 1") && strstr(s.why, "pass 1 not written"),
	      "the reason names the rank and the pass (\"%s\")", s.why);
	CHECK(pdx_tp_leader_caught_up(l), "nobody waits for it any more");
	pdx_tp_leader_free(l);
	zmq_close(follower);
	unlink(addr + strlen("ipc://"));
}

static void connection_gone(struct event_base *base, void *zctx)
{
	char addr[64];
	struct seen s = {0};
	void *follower = NULL;
	struct pdx_tp_leader *l;
	uint64_t ms;

	snprintf(addr, sizeof(addr), "ipc:///tmp/pdx_tp_leader_%d_b", getpid());
	l = group(base, addr, 20000, &s, zctx, &follower);
	if (!l)
		return;
	zmq_close(follower);
	/* the ROUTER learns the connection closed on its I/O thread */
	run_until_broken(base, NULL, &s, 300);
	pdx_tp_leader_step(l, NULL, 0);
	ms = run_until_broken(base, NULL, &s, 5000);
	CHECK(s.broken && ms < 5000,
	      "a send to a rank whose connection is gone breaks the group "
	      "at once (%llu ms; liveness is 20 s)", (unsigned long long)ms);
	CHECK(strstr(s.why, "rank 1") && strstr(s.why, "cannot send"),
	      "the reason names the rank and the send (\"%s\")", s.why);
	pdx_tp_leader_free(l);
	unlink(addr + strlen("ipc://"));
}

/* A follower whose hello says no role (a pdx-engine from before the hello
 * carried one: 0, which reads as "both") is refused by a prefill leader
 * with a reason that says it may be an older pdx-engine, not only that it
 * has --role both (it was started with --role prefill). */
static void role_unsaid(struct event_base *base, void *zctx)
{
	char addr[64], err[256] = "";
	struct seen s = {0};
	struct pdx_tp_leader_params p = {
		.base = base, .size = 2, .model = "tiny", .blocks = 64,
		.block_tokens = 16, .liveness_ms = 1000,
		.role = PDX_ROLE_PREFILL,
		.cbs = {on_event, on_caught_up, on_broken, &s},
	};
	struct pdx_tp_msg hello = {.kind = PDX_TP_HELLO, .rank = 1, .size = 2,
				   .blocks = 64};
	struct pdx_tp_msg m;
	struct pdx_tp_leader *l = NULL;
	void *follower;
	int zero = 0;
	bool refused = false;

	snprintf(addr, sizeof(addr), "ipc:///tmp/pdx_tp_leader_%d_r", getpid());
	p.addr = addr;
	if (pdx_tp_leader_new(&p, &l, err, sizeof(err)) != PDX_OK) {
		CHECK(false, "a leader binds %s %s", addr, err);
		return;
	}
	follower = zmq_socket(zctx, ZMQ_DEALER);
	zmq_setsockopt(follower, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_connect(follower, addr);
	snprintf(hello.text, sizeof(hello.text), "tiny");
	send_msg(follower, &hello);
	for (int i = 0; i < 200 && !refused; i++) {
		zmq_msg_t body;

		run_until_broken(base, NULL, &s, 10);
		zmq_msg_init(&body);
		if (zmq_msg_recv(&body, follower, ZMQ_DONTWAIT) >= 0 &&
		    pdx_tp_msg_decode(zmq_msg_data(&body), zmq_msg_size(&body),
				      &m) == PDX_OK) {
			refused = m.kind == PDX_TP_REFUSE;
			if (refused)
				snprintf(err, sizeof(err), "%s", m.text);
			pdx_tp_msg_clear(&m);
		}
		zmq_msg_close(&body);
	}
	CHECK(refused && strstr(err, "--role both, the leader prefill") &&
	      strstr(err, "older pdx-engine"),
	      "a hello without a role: refused, saying it may be an older "
	      "pdx-engine (\"%s\")", err);
	pdx_tp_leader_free(l);
	zmq_close(follower);
	unlink(addr + strlen("ipc://"));
}

int main(void)
{
	struct event_base *base = event_base_new();
	void *zctx = zmq_ctx_new();

	pass_never_written(base, zctx);
	connection_gone(base, zctx);
	role_unsaid(base, zctx);
	zmq_ctx_term(zctx);
	event_base_free(base);
	CHECK_DONE();
}
