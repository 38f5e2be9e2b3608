/* layer_orders: the order of recv, send and layer_done does not matter.
 *
 * Each case moves a few transfers of the tiny model and checks every byte:
 * the receiver late (all layers done before recv is posted), the receiver
 * early (recv long before send), layers in reverse order, layers in a
 * shuffled order with the receiver arriving midway, and layer_done posted
 * one layer at a time with pauses.
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

int main(int argc, char **argv)
{
	struct h_opts o = { 0 };
	struct h_env env;
	struct h_xfer x[N];
	int bad;

	h_note("layer_orders: recv/send/layer_done in any order, byte-exact");
	if (h_setup(&env, argc, argv, &o)) {
		h_failures++;
		return h_finish(&env);
	}

	/* receiver late: everything computed before the decode side asks */
	h_plan(&env, x, N, 0, 12, true);
	h_prepare(&env, x, N);
	h_post_send(&env, x, N);
	all_layers(&env, x, false);
	h_sleep_ms(300);
	h_post_recv(&env, x, N);
	bad = h_expect_ok(&env, x, N, 10000);
	CHECK(bad == 0, "layer_done for all layers before the recv (receiver late)");
	h_plan_free(x, N);

	/* receiver early: recv posted well before send */
	h_plan(&env, x, N, 0, 12, true);
	h_prepare(&env, x, N);
	h_post_recv(&env, x, N);
	h_sleep_ms(300);
	h_post_send(&env, x, N);
	all_layers(&env, x, false);
	bad = h_expect_ok(&env, x, N, 10000);
	CHECK(bad == 0, "recv long before send, layers after");
	h_plan_free(x, N);

	/* layers in reverse order */
	h_plan(&env, x, N, 0, 12, true);
	h_prepare(&env, x, N);
	h_post_recv(&env, x, N);
	h_post_send(&env, x, N);
	all_layers(&env, x, true);
	bad = h_expect_ok(&env, x, N, 10000);
	CHECK(bad == 0, "layers reported in reverse order");
	h_plan_free(x, N);

	/* reverse order with the receiver arriving midway */
	h_plan(&env, x, N, 0, 12, false);
	h_prepare(&env, x, N);
	h_post_send(&env, x, N);
	h_layer_done(&env, 3, x, N);
	h_layer_done(&env, 1, x, N);
	h_sleep_ms(100);
	h_post_recv(&env, x, N);
	h_sleep_ms(100);
	h_layer_done(&env, 2, x, N);
	h_layer_done(&env, 0, x, N);
	bad = h_expect_ok(&env, x, N, 10000);
	CHECK(bad == 0, "layers 3, 1, then recv, then layers 2, 0");
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
	CHECK(bad == 0, "layers one at a time with 50 ms pauses");
	h_plan_free(x, N);

	return h_finish(&env);
}
