/* abort: an engine aborts a transfer midway (half its layers computed);
 * both engines get exactly one "failed" event for it, and a new transfer
 * afterwards succeeds. Once from the decode side, once from the prefill
 * side, and once before any layer is done.
 */
#include <stdio.h>
#include <string.h>

#include "tests/integ/harness.h"

#define N 2

static void one_case(struct h_env *env, struct h_side *aborter,
		     uint32_t layers_before, const char *what)
{
	struct h_side *other = aborter == &env->p ? &env->d : &env->p;
	struct pdx_engine_event ev;
	struct h_xfer x[N], y[N];
	uint32_t L = env->p.pool.layout.layers;
	pdx_status_t st;
	int bad;

	h_note("%s", what);
	h_plan(env, x, N, 8, 0, true);
	h_prepare(env, x, N);
	h_post_recv(env, x, N);
	h_post_send(env, x, N);
	for (uint32_t l = 0; l < layers_before; l++) {
		h_layer_done(env, l, x, N);
		h_sleep_ms(30); /* modeled compute: the transfer is under way */
	}
	st = pdx_engine_abort(aborter->eng, &x[0].id);
	CHECK_EQ(st, PDX_OK, "%s engine: pdx_engine_abort returns ok", aborter->role);

	if (h_wait(aborter, &x[0].id, 5000, &ev) == 0) {
		CHECK_EQ(ev.kind, PDX_EVENT_FAILED,
		      "%s engine (aborter) gets failed (got %s: %s)", aborter->role,
		      h_kind(ev.kind), ev.reason);
		CHECK(ev.status == PDX_ECANCELED && strstr(ev.reason, "abort"),
		      "its status is ECANCELED and the reason mentions abort (%s, \"%s\")",
		      pdx_status_str(ev.status), ev.reason);
	} else {
		CHECK(false, "%s engine (aborter) gets an event within 5 s",
		      aborter->role);
	}
	if (h_wait(other, &x[0].id, 5000, &ev) == 0)
		CHECK_EQ(ev.kind, PDX_EVENT_FAILED,
		      "%s engine (peer) gets failed (got %s: %s, %s)", other->role,
		      h_kind(ev.kind), pdx_status_str(ev.status), ev.reason);
	else
		CHECK(false, "%s engine (peer) gets an event within 5 s",
		      other->role);

	/* the prefill engine finishes computing: must be harmless */
	for (uint32_t l = layers_before; l < L; l++)
		h_layer_done(env, l, x, N);
	bad = h_expect_ok(env, x + 1, 1, 10000);
	CHECK_EQ(bad, 0, "the other transfer of the same step still arrives byte-exact");
	CHECK(h_quiet(aborter, &x[0].id, 300) == 0 &&
		      h_quiet(other, &x[0].id, 0) == 0,
	      "no second event for the aborted transfer");
	h_plan_free(x, N);

	h_plan(env, y, N, 8, 0, true);
	bad = h_run(env, y, N);
	CHECK_EQ(bad, 0, "new transfers after the abort succeed");
	h_plan_free(y, N);
}

int main(int argc, char **argv)
{
	struct h_opts o = { 0 };
	struct h_env env;

	h_note("abort: engine aborts midway, both sides fail, the link recovers");
	o.xfer_timeout_ms = 5000;
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		return h_finish(&env);
	}
	one_case(&env, &env.d, 2, "decode aborts after 2 of 4 layers");
	one_case(&env, &env.p, 2, "prefill aborts after 2 of 4 layers");
	one_case(&env, &env.d, 0, "decode aborts before any layer is done");
	return h_finish(&env);
}
