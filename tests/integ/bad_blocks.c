/* bad_blocks: block lists the agents must refuse before any byte moves.
 *
 *  - sender and receiver name different numbers of blocks: both engines
 *    get failed with a reason that gives both counts, in either order of
 *    announcement;
 *  - a block id beyond the pool: failed with ERANGE at once;
 *  - transfers after each still work.
 */
#include <stdio.h>
#include <string.h>

#include "tests/integ/harness.h"

static void count_mismatch(struct h_env *env, bool sender_first)
{
	struct pdx_engine_event ev;
	struct h_xfer x[1], ok[2];
	uint32_t n;

	h_plan(env, x, 1, 8, 0, true);
	n = x[0].n;
	if (sender_first) {
		x[0].n = n - 2;
		h_post_send(env, x, 1);
		x[0].n = n;
		h_post_recv(env, x, 1);
	} else {
		h_post_recv(env, x, 1);
		x[0].n = n - 2;
		h_post_send(env, x, 1);
		x[0].n = n;
	}
	for (uint32_t l = 0; l < env->p.pool.layout.layers; l++)
		h_layer_done(env, l, x, 1);
	CHECK(h_wait(&env->p, &x[0].id, 5000, &ev) == 0 &&
		      ev.kind == PDX_EVENT_FAILED && strstr(ev.reason, "blocks"),
	      "%s first, 8 vs 6 blocks: the prefill engine gets failed (%s)",
	      sender_first ? "sender" : "receiver", ev.reason);
	CHECK(h_wait(&env->d, &x[0].id, 5000, &ev) == 0 &&
		      ev.kind == PDX_EVENT_FAILED,
	      "%s first: the decode engine gets failed (%s)",
	      sender_first ? "sender" : "receiver", ev.reason);
	h_plan_free(x, 1);
	h_plan(env, ok, 2, 0, 8, true);
	CHECK(h_run(env, ok, 2) == 0, "transfers after it arrive byte-exact");
	h_plan_free(ok, 2);
}

int main(int argc, char **argv)
{
	struct h_opts o = { 0 };
	struct h_env env;
	struct pdx_engine_event ev;
	struct h_xfer x[1];

	h_note("bad_blocks: block lists refused before any byte moves");
	o.xfer_timeout_ms = 5000;
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		return h_finish(&env);
	}
	count_mismatch(&env, true);
	count_mismatch(&env, false);

	h_plan(&env, x, 1, 4, 0, true);
	x[0].dst[2] = env.o.pool_blocks + 5;
	h_post_recv(&env, x, 1);
	CHECK(h_wait(&env.d, &x[0].id, 2000, &ev) == 0 &&
		      ev.kind == PDX_EVENT_FAILED && ev.status == PDX_ERANGE,
	      "a block beyond the pool: failed with ERANGE (%s: %s)",
	      pdx_status_str(ev.status), ev.reason);
	h_plan_free(x, 1);
	return h_finish(&env);
}
