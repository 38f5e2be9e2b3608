/* dup_engine_msgs: an engine that says things twice (docs/protocol.md,
 * section 1).
 *  - send or recv announced twice: the engine client refuses the repeat
 *    (PDX_EEXIST, nothing sent; an agent that still gets one answers it
 *    "error": tests/integ/engine_link.py) and the transfer itself goes
 *    on, byte-exact, with its one event on each side;
 *  - every layer_done twice, the repeats out of order: byte-exact, one
 *    event each;
 *  - hold twice, then recv: byte-exact;
 *  - abort twice: one "failed" on each side, then nothing;
 *  - abort after the transfer ended: nothing.
 */
#include <string.h>

#include "tests/integ/harness.h"

static void all_layers(struct h_env *env, struct h_xfer *x, size_t n)
{
	for (uint32_t l = 0; l < env->p.pool.layout.layers; l++)
		h_layer_done(env, l, x, n);
}

static void twice_announced(struct h_env *env)
{
	struct h_xfer x[1];

	h_plan(env, x, 1, 6, 0, true);
	h_prepare(env, x, 1);
	h_post_recv(env, x, 1);
	CHECK_EQ(pdx_engine_recv(env->d.eng, &x->id, env->p.peer, x->dst, x->n,
				 x->skip_tokens),
		 PDX_EEXIST, "recv of an id in flight: EEXIST, nothing sent");
	h_post_send(env, x, 1);
	CHECK_EQ(pdx_engine_send(env->p.eng, &x->id, env->d.peer, x->src, x->n),
		 PDX_EEXIST, "send of an id in flight: EEXIST, nothing sent");
	CHECK(h_quiet(&env->d, &x->id, 300) == 0 &&
		      h_quiet(&env->p, &x->id, 0) == 0,
	      "announced twice: no event for the repeat");
	all_layers(env, x, 1);
	CHECK(h_expect_ok(env, x, 1, 5000) == 0,
	      "announced twice: the transfer itself is byte-exact");
	CHECK(h_quiet(&env->p, &x->id, 300) == 0 &&
		      h_quiet(&env->d, &x->id, 0) == 0,
	      "announced twice: no second event");
	h_plan_free(x, 1);
}

static void layers_twice(struct h_env *env)
{
	struct h_xfer x[2];
	uint32_t layers = env->p.pool.layout.layers;

	h_plan(env, x, 2, 0, 8, true);
	h_prepare(env, x, 2);
	h_post_recv(env, x, 2);
	h_post_send(env, x, 2);
	for (uint32_t l = 0; l < layers; l++) {
		h_layer_done(env, l, x, 2);
		h_layer_done(env, layers - 1 - l, x, 2);
	}
	all_layers(env, x, 2);
	CHECK(h_expect_ok(env, x, 2, 5000) == 0,
	      "every layer_done twice, out of order: byte-exact");
	CHECK(h_quiet(&env->p, &x[0].id, 300) == 0 &&
		      h_quiet(&env->d, &x[1].id, 0) == 0,
	      "every layer_done twice: no second event");
	h_plan_free(x, 2);
}

static void held_twice(struct h_env *env)
{
	struct h_xfer x[1];

	h_plan(env, x, 1, 6, 0, true);
	h_prepare(env, x, 1);
	pdx_engine_hold(env->d.eng, &x->id, env->p.peer);
	pdx_engine_hold(env->d.eng, &x->id, env->p.peer);
	h_post_send(env, x, 1);
	all_layers(env, x, 1);
	h_post_recv(env, x, 1);
	CHECK(h_expect_ok(env, x, 1, 5000) == 0, "hold twice, then recv: byte-exact");
	h_plan_free(x, 1);
}

static void aborted_twice(struct h_env *env)
{
	struct pdx_engine_event ev;
	struct h_xfer x[1];

	h_plan(env, x, 1, 6, 0, true);
	h_prepare(env, x, 1);
	h_post_recv(env, x, 1);
	h_post_send(env, x, 1);
	h_layer_done(env, 0, x, 1);
	pdx_engine_abort(env->d.eng, &x->id);
	pdx_engine_abort(env->d.eng, &x->id);
	CHECK(h_wait(&env->d, &x->id, 3000, &ev) == 0 &&
		      ev.kind == PDX_EVENT_FAILED,
	      "abort twice: the decode engine gets failed");
	CHECK(h_wait(&env->p, &x->id, 3000, &ev) == 0 &&
		      ev.kind == PDX_EVENT_FAILED,
	      "abort twice: the prefill engine gets failed");
	CHECK(h_quiet(&env->d, &x->id, 500) == 0 &&
		      h_quiet(&env->p, &x->id, 0) == 0,
	      "abort twice: one event each, no more");
	h_plan_free(x, 1);
}

static void aborted_after_end(struct h_env *env)
{
	struct h_xfer x[1];

	h_plan(env, x, 1, 6, 0, true);
	CHECK(h_run(env, x, 1) == 0, "a transfer ends");
	pdx_engine_abort(env->d.eng, &x->id);
	pdx_engine_abort(env->p.eng, &x->id);
	CHECK(h_quiet(&env->d, &x->id, 500) == 0 &&
		      h_quiet(&env->p, &x->id, 0) == 0,
	      "abort after the end: no event");
	h_plan_free(x, 1);
}

int main(int argc, char **argv)
{
	struct h_opts o = { 0 };
	struct h_env env;
	struct h_xfer ok[4];

	h_note("dup_engine_msgs: an engine that says things twice");
	o.xfer_timeout_ms = 5000;
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		return h_finish(&env);
	}
	twice_announced(&env);
	layers_twice(&env);
	held_twice(&env);
	aborted_twice(&env);
	aborted_after_end(&env);
	h_plan(&env, ok, 4, 0, 8, true);
	CHECK(h_run(&env, ok, 4) == 0, "transfers after all of it work");
	h_plan_free(ok, 4);
	return h_finish(&env);
}
