/* curve: the peer link secured with CURVE (--curve-key, --curve-peers).
 *
 * The agents start with an empty peers file, which is filled once their
 * addresses are known (they read it again on a miss). Members' transfers
 * are byte-exact. Then, for one transfer each, a rogue sends the prefill
 * agent a forged "want" (the decode side's address, other blocks) before
 * the real one:
 *  - without CURVE: the connection never carries a message;
 *  - with a key pair not in the peers file: refused by the ZAP handler;
 *  - with a member's key (listed for the rogue's own address) claiming to
 *    be the decode agent: dropped, its key is not the decode agent's;
 *  - the same key under its own address: refused, the transfer is not for
 *    it; what it receives is an "error" and never a "done".
 * Each time the real transfer lands byte for byte in the decode agent's
 * blocks: the forged want moved nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "agent/curve.h"
#include "common/mp.h"
#include "tests/integ/harness.h"

struct keys {
	char pub[PDX_CURVE_KEY_LEN + 1], sec[PDX_CURVE_KEY_LEN + 1];
};

static char dir[64] = "/tmp/pdx-curve-XXXXXX";

static void rm_dir(void)
{
	const char *names[] = { "p.key", "d.key", "peers" };
	char path[128];

	for (size_t i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		unlink(path);
	}
	rmdir(dir);
}

static void write_key(const char *name, const struct keys *k, char *path,
		      size_t len)
{
	FILE *f;

	snprintf(path, len, "%s/%s", dir, name);
	f = fopen(path, "w");
	if (f) {
		fprintf(f, "metadata\ncurve\n    public-key = \"%s\"\n"
			   "    secret-key = \"%s\"\n", k->pub, k->sec);
		fclose(f);
	}
	chmod(path, 0600);
}

/* A DEALER to addr: plain when k is NULL, else a CURVE client with keys k
 * expecting the server key srv. */
static void *rogue_dealer(void *ctx, const char *addr, const struct keys *k,
			  const char *srv)
{
	void *s = zmq_socket(ctx, ZMQ_DEALER);
	int linger = 0;

	zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
	if (k) {
		zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, srv, PDX_CURVE_KEY_LEN);
		zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, k->pub, PDX_CURVE_KEY_LEN);
		zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, k->sec, PDX_CURVE_KEY_LEN);
	}
	zmq_connect(s, addr);
	return s;
}

/* want for x, claiming to come from `from`, for blocks that are not the
 * decode side's (the first n blocks of its pool, in reverse). */
static void forge_want(void *s, const char *from, const struct h_xfer *x)
{
	struct pdx_mp_out o;
	uint32_t blocks[64];

	for (uint32_t i = 0; i < x->n && i < 64; i++)
		blocks[i] = x->n - 1 - i;
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, 5);
	pdx_mp_kv_str(&o.pk, "op", "want");
	pdx_mp_kv_str(&o.pk, "from", from);
	pdx_mp_kv_xfer(&o.pk, "xfer", &x->id);
	pdx_mp_kv_u32s(&o.pk, "blocks", blocks, x->n < 64 ? x->n : 64);
	pdx_mp_kv_u64(&o.pk, "skip", 0);
	zmq_send(s, o.buf.data, o.buf.size, ZMQ_DONTWAIT);
	pdx_mp_out_free(&o);
}

/* One transfer with a forged want sent first; byte-exact at the end. */
static void attempt(struct h_env *env, void *rogue, const char *from,
		    const char *what)
{
	struct h_xfer x[1];

	h_plan(env, x, 1, 8, 0, true);
	h_prepare(env, x, 1);
	h_post_send(env, x, 1);
	forge_want(rogue, from, x);
	h_sleep_ms(300);
	h_post_recv(env, x, 1);
	for (uint32_t l = 0; l < env->p.pool.layout.layers; l++)
		h_layer_done(env, l, x, 1);
	CHECK(h_expect_ok(env, x, 1, 5000) == 0,
	      "%s: the transfer still lands byte for byte where the decode "
	      "side asked", what);
	h_plan_free(x, 1);
}

/* What reached the rogue's own address: only "error"s. */
static void rogue_inbox(void *router, const char *what)
{
	int errors = 0, others = 0;
	zmq_pollitem_t it = { router, 0, ZMQ_POLLIN, 0 };

	while (zmq_poll(&it, 1, 1000) > 0) {
		zmq_msg_t id, body;
		msgpack_unpacked m;
		char op[32] = "?";

		zmq_msg_init(&id);
		zmq_msg_init(&body);
		zmq_msg_recv(&id, router, 0);
		zmq_msg_recv(&body, router, 0);
		if (pdx_mp_parse(zmq_msg_data(&body), zmq_msg_size(&body), &m,
				 op, sizeof(op)) == 0 &&
		    strcmp(op, "error") == 0)
			errors++;
		else
			others++;
		msgpack_unpacked_destroy(&m);
		zmq_msg_close(&id);
		zmq_msg_close(&body);
	}
	CHECK(errors > 0 && others == 0,
	      "%s: the rogue hears only refusals (%d error, %d other)", what,
	      errors, others);
}

int main(int argc, char **argv)
{
	struct h_opts o = { 0 };
	struct h_env env;
	struct keys kp, kd, kr, ku;
	char p_key[128], d_key[128], peers[128], rogue_addr[64];
	void *ctx, *s, *router;
	int on = 1, linger = 0;
	FILE *f;

	h_note("curve: the peer link with CURVE, and rogues that reach nothing");
	if (!zmq_has("curve")) {
		h_note("SKIP: this libzmq has no CURVE");
		return H_SKIP;
	}
	if (!mkdtemp(dir))
		return 1;
	pb_cleanup_hook(rm_dir);
	zmq_curve_keypair(kp.pub, kp.sec);
	zmq_curve_keypair(kd.pub, kd.sec);
	zmq_curve_keypair(kr.pub, kr.sec);
	zmq_curve_keypair(ku.pub, ku.sec);
	write_key("p.key", &kp, p_key, sizeof(p_key));
	write_key("d.key", &kd, d_key, sizeof(d_key));
	snprintf(peers, sizeof(peers), "%s/peers", dir);
	fclose(fopen(peers, "w"));
	o.agent_args[0] = "--curve-peers";
	o.agent_args[1] = peers;
	o.args_p[0] = "--curve-key";
	o.args_p[1] = p_key;
	o.args_d[0] = "--curve-key";
	o.args_d[1] = d_key;
	o.xfer_timeout_ms = 5000;
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		return h_finish(&env);
	}
	snprintf(rogue_addr, sizeof(rogue_addr), "tcp://127.0.0.1:%d",
		 pb_free_port("127.0.0.1"));
	f = fopen(peers, "w");
	fprintf(f, "# members of this test\n%s %s\n%s %s\n%s %s\n", env.p.peer,
		kp.pub, env.d.peer, kd.pub, rogue_addr, kr.pub);
	fclose(f);
	{
		struct h_xfer x[4];

		h_plan(&env, x, 4, 0, 8, true);
		CHECK(h_run(&env, x, 4) == 0,
		      "members' transfers over CURVE are byte-exact");
		h_plan_free(x, 4);
	}

	ctx = zmq_ctx_new();
	s = rogue_dealer(ctx, env.p.peer, NULL, NULL);
	attempt(&env, s, env.d.peer, "no key");
	zmq_close(s);
	s = rogue_dealer(ctx, env.p.peer, &ku, kp.pub);
	attempt(&env, s, env.d.peer, "a key not in the peers file");
	zmq_close(s);
	s = rogue_dealer(ctx, env.p.peer, &kr, kp.pub);
	attempt(&env, s, env.d.peer, "a member's key, claiming another's address");

	router = zmq_socket(ctx, ZMQ_ROUTER);
	zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof(linger));
	zmq_setsockopt(router, ZMQ_CURVE_SERVER, &on, sizeof(on));
	zmq_setsockopt(router, ZMQ_CURVE_SECRETKEY, kr.sec, PDX_CURVE_KEY_LEN);
	CHECK(zmq_bind(router, rogue_addr) == 0, "the rogue listens at %s",
	      rogue_addr);
	attempt(&env, s, rogue_addr, "a member's key, for another's transfer");
	rogue_inbox(router, "a member's key, for another's transfer");
	zmq_close(s);
	zmq_close(router);
	zmq_ctx_term(ctx);
	return h_finish(&env);
}
