/* peer_kill: the prefill agent is SIGKILLed midway through a transfer.
 * The decode engine gets "failed" once the decode agent gave up (the
 * per-transfer timeout) and knows the sender writes nothing more: here
 * the sender's loss, its --peer-timeout-ms of silence (a sender alive
 * would have said "stopped"); the prefill agent is restarted on the same
 * addresses, the prefill engine registers again (same engine handle: the
 * link reconnects), and a new transfer succeeds. Killed and restarted
 * once more, a send retried meanwhile, no events read, is taken: the
 * library's own register again is answered, and that call takes it.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "tests/integ/harness.h"

#define TMO_MS 3000
#define PEER_TMO_MS "2000" /* the heartbeat: 1000 ms */
#define N 2

/* An engine that, its agent restarted, retries its send (PDX_EPEER) and
 * reads no events meanwhile, nothing being in flight: the register the
 * library sent again is answered, and some call must take that answer. */
static void retried_send(struct h_env *env)
{
	struct pdx_engine_event ev;
	struct pdx_xfer_id id;
	uint32_t block = 0;
	pdx_status_t st = PDX_EPEER;
	uint64_t t0;

	pb_agent_kill(&env->p.agent, SIGKILL);
	CHECK(pb_agent_restart(&env->p.agent) == 0,
	      "the prefill agent restarts again");
	pdx_xfer_id_random(&id);
	t0 = pdx_now_ns();
	while (st != PDX_OK && pdx_now_ns() - t0 < 5000000000ull) {
		st = pdx_engine_send(env->p.eng, &id, env->d.peer, &block, 1);
		if (st != PDX_OK)
			h_sleep_ms(10);
	}
	CHECK(st == PDX_OK,
	      "a send retried after the restart, no events read, is taken "
	      "within 5 s (%s: %s)",
	      pdx_status_str(st), pdx_engine_last_error(env->p.eng));
	if (st == PDX_OK) {
		pdx_engine_abort(env->p.eng, &id);
		h_wait(&env->p, &id, 5000, &ev);
	}
}

int main(int argc, char **argv)
{
	struct h_opts o = { 0 };
	struct pdx_engine_event ev;
	struct h_env env;
	struct h_xfer x[N];
	char old_peer[PDX_ADDR_MAX];
	uint64_t t0;
	double ms;
	int bad;

	h_note("peer_kill: SIGKILL the prefill agent mid-transfer, restart it");
	o.xfer_timeout_ms = TMO_MS;
	o.agent_args[0] = "--peer-timeout-ms";
	o.agent_args[1] = PEER_TMO_MS;
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		return h_finish(&env);
	}
	h_plan(&env, x, N, 0, 8, true);
	bad = h_run(&env, x, N);
	CHECK_EQ(bad, 0, "a transfer before the kill succeeds");
	h_plan_free(x, N);

	h_plan(&env, x, N, 8, 0, true);
	h_prepare(&env, x, N);
	h_post_recv(&env, x, N);
	h_post_send(&env, x, N);
	h_layer_done(&env, 0, x, N);
	h_layer_done(&env, 1, x, N);
	h_sleep_ms(100);
	t0 = pdx_now_ns();
	pb_agent_kill(&env.p.agent, SIGKILL);
	h_note("killed the prefill agent");
	for (int i = 0; i < N; i++) {
		if (h_wait(&env.d, &x[i].id, TMO_MS + 3000, &ev)) {
			CHECK(false, "decode engine: an event for transfer %d within %d ms",
			      i, TMO_MS + 3000);
			continue;
		}
		ms = (double)(pdx_now_ns() - t0) / 1e6;
		CHECK_EQ(ev.kind, PDX_EVENT_FAILED,
		      "decode engine: transfer %d failed after %.0f ms (%s: %s)", i,
		      ms, pdx_status_str(ev.status), ev.reason);
	}
	h_plan_free(x, N);
	h_forget(&env.p);

	snprintf(old_peer, sizeof(old_peer), "%s", env.p.peer);
	CHECK(pb_agent_restart(&env.p.agent) == 0, "the prefill agent restarts");
	CHECK(h_register(&env, &env.p) == 0,
	      "the prefill engine registers again on the same handle");
	CHECK(strcmp(old_peer, env.p.peer) == 0,
	      "the prefill agent has the same peer address (%s)", env.p.peer);

	h_plan(&env, x, N, 0, 8, true);
	bad = h_run(&env, x, N);
	CHECK_EQ(bad, 0, "a transfer after the restart succeeds");
	h_plan_free(x, N);
	retried_send(&env);
	return h_finish(&env);
}
