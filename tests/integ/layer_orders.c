/* layer_orders: the order of recv, send and layer_done does not matter.
 *
 * Each case moves a few transfers of the tiny model and checks every byte:
 * the receiver late (all layers done before recv is posted), the receiver
 * early (recv long before send), layers in reverse order, layers in a
 * shuffled order with the receiver arriving midway, and layer_done posted
 * one layer at a time with pauses.
 *
 * An order between the two agents is made, not hoped for: the test holds
 * one side's next message until the other agent's debug log shows it
 * took what came before ("layer L done" on the prefill side, "want to"
 * when the decode side asks its peer), then checks the order in the
 * logs' timestamps.
 */
#include <stdio.h>

#include "tests/integ/harness.h"

#define N 4

static uint32_t layers(struct h_env *env)
{
	return env->p.pool.layout.layers;
}

static int all_layers(struct h_env *env, struct h_xfer *x, bool reverse)
{
	uint32_t L = layers(env);

	for (uint32_t i = 0; i < L; i++)
		if (h_layer_done(env, reverse ? L - 1 - i : i, x, N))
			return -1;
	return 0;
}

/* Waits for the prefill agent's log line about layer l after mark; its
 * line index, and its time in *ts. */
static long layer_taken(struct h_env *env, long mark, uint32_t l, double *ts)
{
	char needle[32];

	snprintf(needle, sizeof(needle), ": layer %u done", l);
	return h_log_wait(&env->p, mark, needle, 1, 10000, ts);
}

/* Waits for the decode agent to have asked its peer for all N
 * transfers after mark (the N-th "want"); its time in *ts. */
static long asked(struct h_env *env, long mark, double *ts)
{
	return h_log_wait(&env->d, mark, ": want to ", N, 10000, ts);
}

int main(int argc, char **argv)
{
	struct h_opts o = { .agent_logs = true };
	struct h_env env;
	struct h_xfer x[N];
	long mp, md, taken, want, push, after;
	double t_taken = 0, t_want = 0, t_after = 0;
	int bad;

	h_note("layer_orders: recv/send/layer_done in any order, byte-exact");
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		return h_finish(&env);
	}

	/* receiver late: everything computed before the decode side asks;
	 * the recv is held until the prefill agent took the last layer */
	mp = h_log_mark(&env.p);
	md = h_log_mark(&env.d);
	h_plan(&env, x, N, 0, 12, true);
	h_prepare(&env, x, N);
	h_post_send(&env, x, N);
	all_layers(&env, x, false);
	taken = layer_taken(&env, mp, layers(&env) - 1, &t_taken);
	CHECK(taken >= 0, "receiver late: the prefill agent took every layer_done before the recv");
	h_post_recv(&env, x, N);
	bad = h_expect_ok(&env, x, N, 10000);
	CHECK_EQ(bad, 0, "layer_done for all layers before the recv (receiver late)");
	want = asked(&env, md, NULL);
	h_log_wait(&env.d, md, ": want to ", 1, 0, &t_want);
	push = h_log_wait(&env.p, mp, ": push layer", 1, 0, NULL);
	CHECK(want >= 0 && t_want > t_taken && push > taken,
	      "receiver late: the decode agent asked %.1f ms after the prefill agent had every layer, which pushed nothing before",
	      (t_want - t_taken) * 1e3);
	h_plan_free(x, N);

	/* receiver early: the send is held until the decode agent has
	 * asked for every transfer */
	md = h_log_mark(&env.d);
	h_plan(&env, x, N, 0, 12, true);
	h_prepare(&env, x, N);
	h_post_recv(&env, x, N);
	want = asked(&env, md, &t_want);
	mp = h_log_mark(&env.p);
	h_post_send(&env, x, N);
	all_layers(&env, x, false);
	bad = h_expect_ok(&env, x, N, 10000);
	CHECK_EQ(bad, 0, "recv long before send, layers after");
	after = layer_taken(&env, mp, 0, &t_after);
	CHECK(want >= 0 && after >= 0 && t_want < t_after,
	      "receiver early: the decode agent asked for all %d transfers %.1f ms before the prefill agent took layer 0",
	      N, (t_after - t_want) * 1e3);
	h_plan_free(x, N);

	/* layers in reverse order */
	h_plan(&env, x, N, 0, 12, true);
	h_prepare(&env, x, N);
	h_post_recv(&env, x, N);
	h_post_send(&env, x, N);
	all_layers(&env, x, true);
	bad = h_expect_ok(&env, x, N, 10000);
	CHECK_EQ(bad, 0, "layers reported in reverse order");
	h_plan_free(x, N);

	/* reverse order with the receiver arriving midway: the recv held
	 * until the prefill agent took layer 1, layers 2 and 0 until the
	 * decode agent asked */
	mp = h_log_mark(&env.p);
	md = h_log_mark(&env.d);
	h_plan(&env, x, N, 0, 12, false);
	h_prepare(&env, x, N);
	h_post_send(&env, x, N);
	h_layer_done(&env, 3, x, N);
	h_layer_done(&env, 1, x, N);
	taken = layer_taken(&env, mp, 1, &t_taken);
	h_post_recv(&env, x, N);
	want = asked(&env, md, &t_want);
	h_layer_done(&env, 2, x, N);
	h_layer_done(&env, 0, x, N);
	bad = h_expect_ok(&env, x, N, 10000);
	CHECK_EQ(bad, 0, "layers 3, 1, then recv, then layers 2, 0");
	after = layer_taken(&env, mp, 2, &t_after);
	CHECK(taken >= 0 && want >= 0 && after > taken && t_taken < t_want &&
		      t_want < t_after,
	      "receiver midway: the decode agent asked after the prefill agent took layers 3 and 1 (%.1f ms), before it took 2 (%.1f ms)",
	      (t_want - t_taken) * 1e3, (t_after - t_want) * 1e3);
	h_plan_free(x, N);

	/* one layer at a time with pauses, the usual prefill rhythm; the
	 * transfer must not complete before the last layer */
	h_plan(&env, x, N, 0, 12, true);
	h_prepare(&env, x, N);
	h_post_recv(&env, x, N);
	h_post_send(&env, x, N);
	for (uint32_t l = 0; l + 1 < layers(&env); l++) {
		h_layer_done(&env, l, x, N);
		h_sleep_ms(50);
	}
	CHECK(h_quiet(&env.d, &x[0].id, 200) == 0 &&
		      h_quiet(&env.p, &x[0].id, 0) == 0,
	      "no event before the last layer is done");
	h_layer_done(&env, layers(&env) - 1, x, N);
	bad = h_expect_ok(&env, x, N, 10000);
	CHECK_EQ(bad, 0, "layers one at a time with 50 ms pauses");
	h_plan_free(x, N);

	return h_finish(&env);
}
