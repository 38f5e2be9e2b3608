/* pull: the decode agent reads the prefill agent's blocks once all layers
 * are computed (docs/protocol.md, "Pull"), byte-exact.
 *
 *   pull PATH-TO-pdx-agent ipc|put|am
 *
 * ipc and put: the decode agent runs with --pull; batches of transfers
 * (random and contiguous blocks, some with skip_tokens, one with every
 * block held) arrive byte-exact, no byte before the last layer is
 * computed; a transfer the engine asks to be pushed (pdx_engine_recv_opts)
 * is pushed layer by layer; aborts while the receiver may be reading end
 * both sides alike, never "received" beside a failed sender. am: the lane
 * cannot pull: a pull is refused on both sides with why, a push works.
 */
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "tests/integ/harness.h"

#define CONC 16

/* Any byte of block `idx` of x's destination, layer 0, tensor 0, written. */
static bool block_written(struct h_env *env, const struct h_xfer *x,
			  uint32_t idx)
{
	const struct pdx_shm_pool *p = &env->d.pool;
	const uint8_t *b = pdx_shm_pool_block(p, 0, 0, x->dst[idx]);

	for (uint64_t i = 0; i < p->block_bytes; i++)
		if (b[i])
			return true;
	return false;
}

static int recv_mode(struct h_env *env, const struct h_xfer *x,
		     enum pdx_xfer_mode mode)
{
	struct pdx_recv_opts ro = { .skip_tokens = x->skip_tokens,
				    .mode = mode };

	return pdx_engine_recv_opts(env->d.eng, &x->id, env->p.peer, x->dst,
				    x->n, &ro) == PDX_OK ? 0 : -1;
}

/* All but the last layer computed: a pull moves nothing yet, a push moves
 * layer 0 (polled for up to 5 s). Then the last layer, and the bytes. */
static void layer_by_layer(struct h_env *env, enum pdx_xfer_mode mode)
{
	uint32_t L = env->p.pool.layout.layers;
	struct h_xfer x[1];
	bool early = false;
	uint64_t until;

	h_plan(env, x, 1, 6, 0, true);
	h_prepare(env, x, 1);
	CHECK(recv_mode(env, x, mode) == 0 && h_post_send(env, x, 1) == 0,
	      "recv (%s) and send posted",
	      mode == PDX_XFER_PUSH ? "push" : "the agent's default: pull");
	for (uint32_t l = 0; l + 1 < L; l++)
		h_layer_done(env, l, x, 1);
	until = pdx_now_ns() + (mode == PDX_XFER_PUSH ? 5000 : 300) * 1000000ULL;
	while (!early && pdx_now_ns() < until) {
		early = block_written(env, x, 0);
		h_sleep_ms(10);
	}
	if (mode == PDX_XFER_PUSH)
		CHECK(early, "pushed: layer 0 arrives before the last layer is computed");
	else
		CHECK(!early, "pulled: nothing arrives while a layer is missing");
	h_layer_done(env, L - 1, x, 1);
	CHECK_EQ(h_expect_ok(env, x, 1, 10000), 0,
		 "then the transfer completes byte-exact");
	h_plan_free(x, 1);
}

/* One side aborts right after the last layer: the receiver may be reading
 * or done. The receiver never succeeds where the sender failed (the sender
 * may reuse its blocks), and a success has the bytes in place. A receiver
 * whose engine gave up after the sender's "done" left fails while the
 * sender says sent, as with push: harmless, the decode side drops them. */
static void abort_after_last_layer(struct h_env *env, struct h_side *aborter,
				   int delay_ms)
{
	struct h_side *other = aborter == &env->p ? &env->d : &env->p;
	uint32_t L = env->p.pool.layout.layers;
	struct pdx_engine_event ea, eo;
	struct h_xfer x[1];
	bool got;

	h_plan(env, x, 1, 200, 0, false);
	h_prepare(env, x, 1);
	h_post_recv(env, x, 1);
	h_post_send(env, x, 1);
	for (uint32_t l = 0; l < L; l++)
		h_layer_done(env, l, x, 1);
	h_sleep_ms(delay_ms);
	pdx_engine_abort(aborter->eng, &x[0].id);
	got = h_wait(aborter, &x[0].id, 10000, &ea) == 0 &&
	      h_wait(other, &x[0].id, 10000, &eo) == 0;
	CHECK(got, "%s aborts %d ms after the last layer: both engines get an event",
	      aborter->role, delay_ms);
	if (got) {
		bool aborter_ok = ea.kind != PDX_EVENT_FAILED;
		bool other_ok = eo.kind != PDX_EVENT_FAILED;
		bool recv_ok = aborter == &env->d ? aborter_ok : other_ok;
		bool send_ok = aborter == &env->d ? other_ok : aborter_ok;
		char err[512] = "";

		h_note("aborter %s (%s), other %s (%s)", h_kind(ea.kind),
		       ea.reason, h_kind(eo.kind), eo.reason);
		CHECK(!recv_ok || send_ok,
		      "the receiver did not succeed where the sender failed "
		      "(aborter %s, other %s)",
		      h_kind(ea.kind), h_kind(eo.kind));
		if (recv_ok && send_ok)
			CHECK(pb_verify(&env->d.pool, x[0].seed, x[0].dst,
					x[0].n, 0, err, sizeof(err)) == 0,
			      "an abort that came too late: the bytes are in "
			      "place (%s)", err);
	}
	CHECK(h_quiet(aborter, &x[0].id, 200) == 0 &&
		      h_quiet(other, &x[0].id, 0) == 0,
	      "no second event for it");
	h_plan_free(x, 1);
}

static int refused_lane(struct h_env *env)
{
	struct pdx_engine_event ev;
	struct h_xfer x[1];

	h_plan(env, x, 1, 4, 0, true);
	h_prepare(env, x, 1);
	h_post_recv(env, x, 1);
	h_post_send(env, x, 1);
	if (h_wait(&env->d, &x[0].id, 10000, &ev) == 0) {
		CHECK(ev.kind == PDX_EVENT_FAILED && ev.status == PDX_EINCOMPAT,
		      "a pull over the am lane fails EINCOMPAT (%s: %s)",
		      h_kind(ev.kind), pdx_status_str(ev.status));
		CHECK(strstr(ev.reason, "pull") && strstr(ev.reason, "am"),
		      "saying why: \"%s\"", ev.reason);
	} else {
		CHECK(false, "the decode engine hears of the refused pull");
	}
	if (h_wait(&env->p, &x[0].id, 10000, &ev) == 0)
		CHECK(ev.kind == PDX_EVENT_FAILED && strstr(ev.reason, "pull"),
		      "the prefill engine too, told why (%s: %s)",
		      h_kind(ev.kind), ev.reason);
	else
		CHECK(false, "the prefill engine hears of the refused pull");
	h_plan_free(x, 1);

	/* the same lane pushes */
	h_plan(env, x, 1, 4, 0, true);
	h_prepare(env, x, 1);
	CHECK(recv_mode(env, x, PDX_XFER_PUSH) == 0 && h_post_send(env, x, 1) == 0,
	      "a push asked for by the engine is posted");
	for (uint32_t l = 0; l < env->p.pool.layout.layers; l++)
		h_layer_done(env, l, x, 1);
	CHECK_EQ(h_expect_ok(env, x, 1, 10000), 0,
		 "and arrives byte-exact over am");
	h_plan_free(x, 1);
	return h_finish(env);
}

int main(int argc, char **argv)
{
	struct h_opts o = { 0 };
	struct h_env env;
	struct h_xfer x[CONC];
	const char *lane = argc > 2 ? argv[2] : "";
	int bad;

	if (strcmp(lane, "ipc") && strcmp(lane, "put") && strcmp(lane, "am")) {
		fprintf(stderr, "usage: %s PATH-TO-pdx-agent ipc|put|am\n",
			argv[0]);
		return 1;
	}
	o.tls = strcmp(lane, "am") ? "sm,self" : "tcp,self";
	o.data_path = lane;
	o.pool_blocks = 2048;
	o.args_d[0] = "--pull";
	h_note("pull over the %s lane: the decode agent runs with --pull", lane);
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		return h_finish(&env);
	}
	if (!strcmp(lane, "am"))
		return refused_lane(&env);

	h_plan(&env, x, CONC, 0, 24, true);
	bad = h_run(&env, x, CONC);
	CHECK_EQ(bad, 0, "%d pulls with random blocks arrive byte-exact (%d bad)",
		 CONC, bad);
	h_plan_free(x, CONC);

	/* contiguous (coalesced reads); 0, 9, 18, 27 tokens held already,
	 * and one transfer with every block held (nothing to read: the
	 * sender's first token still comes) */
	h_plan(&env, x, CONC, 16, 0, false);
	for (int i = 0; i < CONC; i++)
		x[i].skip_tokens = (uint32_t)(i % 4) * 9;
	x[1].skip_tokens = 16 * env.d.pool.layout.block_tokens;
	bad = h_run(&env, x, CONC);
	CHECK_EQ(bad, 0, "%d contiguous pulls, with skip_tokens (one all held), are byte-exact (%d bad)",
		 CONC, bad);
	h_plan_free(x, CONC);

	layer_by_layer(&env, PDX_XFER_DEFAULT);
	layer_by_layer(&env, PDX_XFER_PUSH);

	for (int d = 0; d <= 4; d += 2) {
		abort_after_last_layer(&env, &env.d, d);
		abort_after_last_layer(&env, &env.p, d);
	}
	h_plan(&env, x, 4, 8, 0, true);
	bad = h_run(&env, x, 4);
	CHECK_EQ(bad, 0, "pulls after the aborts succeed (%d bad)", bad);
	h_plan_free(x, 4);
	return h_finish(&env);
}
