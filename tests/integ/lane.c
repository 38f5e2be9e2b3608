/* lane: libpdx on the engine link's direct lane (docs/protocol.md, "The
 * direct lane") against real agents, or (argv[2] "zmq") on ZeroMQ alone
 * with agents run --engine-direct off; the same checks both ways:
 *  - both engines' links switch to the lane after their register (the
 *    agents log it), or never do under --engine-direct off;
 *  - transfers move byte for byte;
 *  - a prefill engine whose agent is stopped (SIGSTOP, shorter than the
 *    link's liveness) goes on calling: 400 layer_done calls naming 256
 *    transfers each (about 2 MB, more than a socket holds) each return at
 *    once, the library keeping what the socket does not take; when the
 *    agent resumes they reach it, and the layers of a transfer announced
 *    before them and computed after them too, in order: that transfer
 *    moves byte for byte;
 *  - transfers after that still do.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "tests/integ/harness.h"

#define FLOOD_CALLS 400
#define FLOOD_IDS 256
#define STOP_MS 400

static void flood_while_stopped(struct h_env *env)
{
	static struct pdx_xfer_id ids[FLOOD_IDS];
	uint32_t layers = env->p.pool.layout.layers;
	double worst_ms = 0;
	uint64_t t0;
	struct h_xfer x[1];
	int bad_calls = 0;

	for (int i = 0; i < FLOOD_IDS; i++)
		pdx_xfer_id_random(&ids[i]); /* in flight nowhere: ignored */
	h_plan(env, x, 1, 6, 0, true);
	h_prepare(env, x, 1);
	h_post_recv(env, x, 1);
	h_post_send(env, x, 1);
	h_layer_done(env, 0, x, 1);
	h_sleep_ms(100); /* the transfer is under way */
	t0 = pdx_now_ns();
	kill(env->p.agent.pid, SIGSTOP);
	for (int i = 0; i < FLOOD_CALLS; i++) {
		uint64_t c0 = pdx_now_ns();
		pdx_status_t st =
		    pdx_engine_layer_done(env->p.eng, 0, ids, FLOOD_IDS);
		double ms = (double)(pdx_now_ns() - c0) / 1e6;

		worst_ms = ms > worst_ms ? ms : worst_ms;
		bad_calls += st != PDX_OK;
	}
	for (uint32_t l = 1; l < layers; l++)
		h_layer_done(env, l, x, 1);
	CHECK_EQ(bad_calls, 0, "the agent stopped, %d layer_done calls of %d "
		 "transfers each succeed (%d did not)", FLOOD_CALLS, FLOOD_IDS,
		 bad_calls);
	CHECK(worst_ms < 100, "none of them waits for the stopped agent "
	      "(the slowest took %.1f ms)", worst_ms);
	while ((pdx_now_ns() - t0) / 1000000 < STOP_MS)
		h_sleep_ms(10);
	kill(env->p.agent.pid, SIGCONT);
	CHECK_EQ(h_expect_ok(env, x, 1, 10000), 0,
		 "the agent resumed: what was kept reached it in order, and "
		 "the transfer whose layers came after it moves byte for byte");
	h_plan_free(x, 1);
}

int main(int argc, char **argv)
{
	bool zmq = argc > 2 && !strcmp(argv[2], "zmq");
	struct h_opts o = { .agent_logs = true,
			    .agent_args = { zmq ? "--engine-direct" : NULL,
					    "off", NULL } };
	struct h_env env;
	struct h_xfer x[4];

	h_note("the engine link %s", zmq ? "on ZeroMQ alone (--engine-direct "
		"off)" : "on its direct lane");
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		return h_finish(&env);
	}
	h_plan(&env, x, 4, 0, 24, true);
	CHECK_EQ(h_run(&env, x, 4), 0, "4 transfers arrive byte for byte");
	h_plan_free(x, 4);
	if (zmq) {
		CHECK(h_log_wait(&env.p, 0, "direct lane is up", 1, 300, NULL) < 0 &&
			      h_log_wait(&env.d, 0, "direct lane is up", 1, 0, NULL) < 0,
		      "no agent offers a lane: the links stay on ZeroMQ");
	} else {
		CHECK(h_log_wait(&env.p, 0, "direct lane is up", 1, 3000, NULL) >= 0 &&
			      h_log_wait(&env.d, 0, "direct lane is up", 1, 3000, NULL) >= 0,
		      "both engines' links switched to their lanes");
	}
	flood_while_stopped(&env);
	h_plan(&env, x, 4, 0, 24, true);
	CHECK_EQ(h_run(&env, x, 4), 0,
		 "4 more transfers after that arrive byte for byte");
	h_plan_free(x, 4);
	if (!zmq)
		CHECK(h_log_wait(&env.p, 0, "direct lane closed", 1, 0, NULL) < 0,
		      "the prefill engine's lane outlived its agent's stop");
	return h_finish(&env);
}
