/* notify: both agents push one xfer_event per finished transfer to a
 * collector (the proxy's role): "sent" from the prefill agent, "received"
 * from the decode agent, with the right bytes and agent addresses, and
 * "failed" with a reason for an aborted transfer. */
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "common/mp.h"
#include "tests/integ/harness.h"

#define N 4

struct seen {
	int sent, received, failed;
	uint64_t sent_bytes, received_bytes;
	char failed_reason[PDX_REASON_MAX];
	bool addrs_ok;
};

static int find(const struct h_xfer *x, size_t n, const struct pdx_xfer_id *id)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp(x[i].id.b, id->b, sizeof(id->b)) == 0)
			return (int)i;
	return -1;
}

/* Reads events until `want` arrived or 5 s passed. */
static int collect(void *pull, struct h_env *env, const struct h_xfer *x,
		   size_t n, struct seen *seen, int want)
{
	int got = 0;

	for (int waited = 0; got < want && waited < 5000;) {
		char buf[4096], kind[16], agent[PDX_ADDR_MAX], peer[PDX_ADDR_MAX];
		zmq_pollitem_t it = { .socket = pull, .events = ZMQ_POLLIN };
		msgpack_unpacked msg;
		struct pdx_xfer_id id;
		uint64_t bytes = 0;
		char op[32];
		int len, i;

		if (zmq_poll(&it, 1, 100) <= 0) {
			waited += 100;
			continue;
		}
		len = zmq_recv(pull, buf, sizeof(buf), 0);
		if (len <= 0 || len > (int)sizeof(buf))
			continue;
		if (pdx_mp_parse(buf, (size_t)len, &msg, op, sizeof(op)) ||
		    strcmp(op, "xfer_event") ||
		    pdx_mp_get_xfer(&msg.data, "xfer", &id) ||
		    pdx_mp_get_str(&msg.data, "kind", kind, sizeof(kind)) ||
		    pdx_mp_get_str(&msg.data, "agent", agent, sizeof(agent)) ||
		    pdx_mp_get_str(&msg.data, "peer", peer, sizeof(peer)) ||
		    pdx_mp_get_u64(&msg.data, "bytes", &bytes) ||
		    (i = find(x, n, &id)) < 0) {
			msgpack_unpacked_destroy(&msg);
			CHECK(false, "a well-formed xfer_event for one of our transfers");
			continue;
		}
		got++;
		if (strcmp(kind, "sent") == 0) {
			seen[i].sent++;
			seen[i].sent_bytes = bytes;
			seen[i].addrs_ok = !strcmp(agent, env->p.peer) &&
					   !strcmp(peer, env->d.peer);
		} else if (strcmp(kind, "received") == 0) {
			seen[i].received++;
			seen[i].received_bytes = bytes;
			seen[i].addrs_ok &= !strcmp(agent, env->d.peer) &&
					    !strcmp(peer, env->p.peer);
		} else if (strcmp(kind, "failed") == 0) {
			seen[i].failed++;
			pdx_mp_get_str(&msg.data, "reason", seen[i].failed_reason,
				       sizeof(seen[i].failed_reason));
		}
		msgpack_unpacked_destroy(&msg);
	}
	return got;
}

int main(int argc, char **argv)
{
	struct h_opts o = { 0 };
	struct h_env env;
	struct h_xfer x[N], y[1];
	struct seen seen[N] = { 0 }, aborted[1] = { 0 };
	char addr[64];
	void *ctx = zmq_ctx_new(), *pull = zmq_socket(ctx, ZMQ_PULL);
	int port = pb_free_port("127.0.0.1"), linger = 0, bad;

	h_note("notify: transfer events reach a collector");
	zmq_setsockopt(pull, ZMQ_LINGER, &linger, sizeof(linger));
	snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%d", port);
	if (port < 0 || zmq_bind(pull, addr) < 0) {
		printf("# cannot bind a collector: skip\n");
		return H_SKIP;
	}
	o.notify = addr;
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		goto out;
	}
	h_plan(&env, x, N, 0, 8, true);
	bad = h_run(&env, x, N);
	CHECK_EQ(bad, 0, "%d transfers arrive byte-exact", N);
	CHECK(collect(pull, &env, x, N, seen, 2 * N) == 2 * N,
	      "two events per transfer reach the collector");
	for (int i = 0; i < N; i++) {
		CHECK(seen[i].sent == 1 && seen[i].received == 1 && !seen[i].failed,
		      "transfer %d: one sent and one received (%d, %d, %d failed)",
		      i, seen[i].sent, seen[i].received, seen[i].failed);
		CHECK(seen[i].sent_bytes == h_bytes(&env, &x[i]) &&
			      seen[i].received_bytes == h_bytes(&env, &x[i]),
		      "transfer %d: bytes %llu and %llu, expected %llu", i,
		      (unsigned long long)seen[i].sent_bytes,
		      (unsigned long long)seen[i].received_bytes,
		      (unsigned long long)h_bytes(&env, &x[i]));
		CHECK(seen[i].addrs_ok, "transfer %d: agent and peer addresses", i);
	}

	/* an abort: failed events with the reason */
	h_plan(&env, y, 1, 4, 0, true);
	h_prepare(&env, y, 1);
	h_post_recv(&env, y, 1);
	h_post_send(&env, y, 1);
	pdx_engine_abort(env.d.eng, &y[0].id);
	collect(pull, &env, y, 1, aborted, 2);
	CHECK(aborted[0].failed == 2 && !aborted[0].sent && !aborted[0].received,
	      "an aborted transfer: failed from both agents (%d)", aborted[0].failed);
	CHECK(strstr(aborted[0].failed_reason, "abort") != NULL,
	      "the reason says abort (\"%s\")", aborted[0].failed_reason);
	h_plan_free(y, 1);
	h_plan_free(x, N);
out:
	zmq_close(pull);
	zmq_ctx_term(ctx);
	return h_finish(&env);
}
