/* unknown_xfer: messages about transfers the other side never announces.
 *
 *  - layer_done for a transfer never announced: no sent/received for it,
 *    nothing breaks;
 *  - recv naming a peer whose engine never announces the transfer: the
 *    recv fails with ETIMEDOUT after the per-transfer timeout (the agents
 *    run with --xfer-timeout-ms 1500) and is never reported received;
 *  - send to a peer whose engine never posts the recv: likewise on the
 *    prefill side.
 */
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "tests/integ/harness.h"

#define TMO_MS 1500
#define TMO_STR "1500"

static void expect_timeout(struct h_side *s, const struct pdx_xfer_id *id,
			   uint64_t t0, const char *what)
{
	struct pdx_engine_event ev;
	double ms;

	if (h_wait(s, id, TMO_MS + 3500, &ev)) {
		CHECK(false, "%s: the %s engine gets an event within %d ms", what,
		      s->role, TMO_MS + 3500);
		return;
	}
	ms = (double)(pdx_now_ns() - t0) / 1e6;
	CHECK_EQ(ev.kind, PDX_EVENT_FAILED,
	      "%s: the %s engine gets failed (got %s)", what, s->role,
	      h_kind(ev.kind));
	/* Both agents bound it by the same timeout: the receiver's own
	 * timer, or, when the sender's bound on the want it held ran out
	 * first (a loaded machine delays timers), the sender's "unknown
	 * transfer" */
	CHECK(ev.status == PDX_ETIMEDOUT ||
		      (ev.status == PDX_ENOENT &&
		       strstr(ev.reason, "unknown transfer")),
	      "%s: status is ETIMEDOUT, or ENOENT from the sender's own bound "
	      "(got %s: %s)", what, pdx_status_str(ev.status), ev.reason);
	CHECK(ms >= TMO_MS - 100 && ms <= TMO_MS + 3500,
	      "%s: it fails after the %d ms timeout (%.0f ms)", what, TMO_MS, ms);
	CHECK(h_quiet(s, id, 1000) == 0, "%s: no second event for it", what);
}

int main(int argc, char **argv)
{
	struct h_opts o = { 0 };
	struct h_env env;
	struct h_xfer x[1], ok[4];
	uint64_t t0;
	int bad;

	h_note("unknown_xfer: transfers the other side never announces");
	o.xfer_timeout_ms = TMO_MS;
	/* the sender's wait for a receiver that never asks is its lease */
	o.agent_args[0] = "--lease-ms";
	o.agent_args[1] = TMO_STR;
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		return h_finish(&env);
	}

	/* layer_done for a transfer nobody announced */
	h_plan(&env, x, 1, 4, 0, true);
	for (uint32_t l = 0; l < env.p.pool.layout.layers; l++)
		h_layer_done(&env, l, x, 1);
	{
		struct pdx_engine_event ev;
		bool good = true;

		/* the agent may ignore it or answer with failed; never
		 * with sent or received */
		if (h_wait(&env.p, &x[0].id, 1000, &ev) == 0 &&
		    ev.kind != PDX_EVENT_FAILED)
			good = false;
		if (h_wait(&env.d, &x[0].id, 0, &ev) == 0)
			good = false;
		CHECK(good, "layer_done for an unannounced transfer gives no sent/received");
	}
	h_plan_free(x, 1);
	h_plan(&env, ok, 4, 0, 8, true);
	bad = h_run(&env, ok, 4);
	CHECK_EQ(bad, 0, "transfers after it still work");
	h_plan_free(ok, 4);

	/* recv from a peer whose engine never sends */
	h_plan(&env, x, 1, 4, 0, true);
	t0 = pdx_now_ns();
	h_post_recv(&env, x, 1);
	expect_timeout(&env.d, &x[0].id, t0, "recv never sent");
	CHECK(h_quiet(&env.p, &x[0].id, 0) == 0,
	      "the prefill engine hears nothing about it");
	h_plan_free(x, 1);

	/* send to a peer whose engine never posts the recv */
	h_plan(&env, x, 1, 4, 0, true);
	h_prepare(&env, x, 1);
	t0 = pdx_now_ns();
	h_post_send(&env, x, 1);
	for (uint32_t l = 0; l < env.p.pool.layout.layers; l++)
		h_layer_done(&env, l, x, 1);
	expect_timeout(&env.p, &x[0].id, t0, "send never received");
	CHECK(h_quiet(&env.d, &x[0].id, 0) == 0,
	      "the decode engine hears nothing about it");
	h_plan_free(x, 1);

	h_plan(&env, ok, 4, 0, 8, true);
	bad = h_run(&env, ok, 4);
	CHECK_EQ(bad, 0, "transfers after the timeouts work");
	h_plan_free(ok, 4);
	return h_finish(&env);
}
