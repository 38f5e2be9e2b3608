/* stop_midway: the prefill agent is stopped (SIGTERM) while UCX operations
 * of its transfers are still in flight. The decode agent is frozen
 * (SIGSTOP) after it asked, so on the am lane over TCP, every message sent
 * by rendezvous (UCX_RNDV_THRESH=64) waits for it. The stopping agent
 * frees its transfers, and UCX calls back for their cancelled operations
 * afterwards: the agent must exit 0 all the same (under AddressSanitizer
 * or valgrind, with no finding: a callback reading a freed transfer made
 * it exit 1 under ASan before the transfers held by operations were kept
 * until UCX was gone).
 *
 *   stop_midway PATH-TO-pdx-agent
 */
#include <signal.h>
#include <stdio.h>

#include "tests/integ/harness.h"

#define N 2

int main(int argc, char **argv)
{
	struct h_opts o = { .tls = "tcp", .data_path = "am",
			    .xfer_timeout_ms = 20000 };
	struct h_env env;
	struct h_xfer x[N];
	uint32_t L;
	int st;

	h_note("stop_midway: SIGTERM the prefill agent with rendezvous sends "
	       "in flight to a frozen decode agent");
	o.env_p[0] = o.env_d[0] = "UCX_RNDV_THRESH=64";
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		return h_finish(&env);
	}
	L = env.p.pool.layout.layers;
	h_plan(&env, x, N, 8, 0, true);
	CHECK_EQ(h_run(&env, x, N), 0, "a transfer before: the agents shook "
		 "hands over TCP");
	h_plan_free(x, N);

	h_plan(&env, x, N, 8, 0, false);
	h_prepare(&env, x, N);
	h_post_recv(&env, x, N);
	h_post_send(&env, x, N);
	h_sleep_ms(300); /* the wants reach the prefill agent */
	pb_agent_kill(&env.d.agent, SIGSTOP);
	for (uint32_t l = 0; l < L; l++)
		h_layer_done(&env, l, x, N);
	h_sleep_ms(300); /* pushed: the sends wait for the frozen receiver */
	st = pb_agent_stop(&env.p.agent);
	CHECK(st == 0, "the prefill agent, stopped with its sends in flight, "
	      "exits 0 (wait status 0x%x)", st);
	pb_agent_kill(&env.d.agent, SIGCONT);
	h_plan_free(x, N);
	return h_finish(&env);
}
