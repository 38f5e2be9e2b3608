/* handshake: the first transfer between two fresh agents completes when
 * only one side starts the handshake and the other engine announces its
 * side much later — receiver first, then sender first, each with new
 * agents so the handshake is not cached yet. */
#include <stdio.h>

#include "tests/integ/harness.h"

#define LATE_MS 1500

static void one_side_first(int argc, char **argv, bool receiver_first)
{
	struct h_opts o = { 0 };
	struct h_env env;
	struct h_xfer x[1];
	uint32_t layers;

	h_note("%s announces, the other side %d ms later",
	       receiver_first ? "the receiver" : "the sender", LATE_MS);
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		h_finish(&env);
		return;
	}
	layers = env.p.pool.layout.layers;
	h_plan(&env, x, 1, 6, 0, true);
	h_prepare(&env, x, 1);
	if (receiver_first) {
		h_post_recv(&env, x, 1);
		h_sleep_ms(LATE_MS);
		h_post_send(&env, x, 1);
	} else {
		h_post_send(&env, x, 1);
		h_sleep_ms(LATE_MS);
		h_post_recv(&env, x, 1);
	}
	for (uint32_t l = 0; l < layers; l++)
		h_layer_done(&env, l, x, 1);
	CHECK(h_expect_ok(&env, x, 1, 5000) == 0,
	      "%s first: the transfer arrives byte-exact",
	      receiver_first ? "receiver" : "sender");
	h_plan_free(x, 1);
	h_finish(&env);
}

int main(int argc, char **argv)
{
	one_side_first(argc, argv, true);
	one_side_first(argc, argv, false);
	return check_failures ? 1 : 0;
}
