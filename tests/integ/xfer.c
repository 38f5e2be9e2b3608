/* xfer_shm / xfer_tcp: many concurrent transfers between two agents, with
 * scattered and with contiguous blocks, byte-exact.
 *
 *   xfer PATH-TO-pdx-agent shm|tcp [auto|ipc|put|am]
 *
 * The optional last argument forces the agents' --data-path.
 */
#include <stdio.h>
#include <string.h>

#include "tests/integ/harness.h"

#define CONC 32

int main(int argc, char **argv)
{
	struct h_opts o = { 0 };
	struct h_env env;
	struct h_xfer x[CONC];
	const char *tls = argc > 2 ? argv[2] : "shm";
	int bad;

	o.data_path = argc > 3 ? argv[3] : NULL;
	if (!strcmp(tls, "shm")) {
		o.tls = "sm,self";
	} else if (!strcmp(tls, "tcp")) {
		o.tls = "tcp,self";
	} else {
		fprintf(stderr, "usage: %s PATH-TO-pdx-agent shm|tcp [auto|ipc|put|am]\n",
			argv[0]);
		return 1;
	}
	o.pool_blocks = 2048;
	h_note("xfer over UCX_TLS=%s, data path %s: %d concurrent transfers of the tiny model",
	       o.tls, o.data_path ? o.data_path : "auto", CONC);
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		return h_finish(&env);
	}

	/* 1: random blocks on both sides, 1..24 blocks each */
	h_plan(&env, x, CONC, 0, 24, true);
	bad = h_run(&env, x, CONC);
	CHECK_EQ(bad, 0, "%d transfers with random blocks arrive byte-exact (%d bad)",
	      CONC, bad);
	h_plan_free(x, CONC);

	/* 2: the same again over the connections now established */
	h_plan(&env, x, CONC, 0, 24, true);
	bad = h_run(&env, x, CONC);
	CHECK_EQ(bad, 0, "a second batch of %d random-block transfers is byte-exact (%d bad)",
	      CONC, bad);
	h_plan_free(x, CONC);

	/* 3: contiguous blocks (coalesced operations), some with tokens the
	 * decode side already holds */
	h_plan(&env, x, CONC, 16, 0, false);
	for (int i = 0; i < CONC; i++)
		x[i].skip_tokens = (uint32_t)(i % 4) * 9; /* 0, 9, 18, 27 tokens */
	bad = h_run(&env, x, CONC);
	CHECK_EQ(bad, 0, "%d contiguous transfers (some with skip_tokens) are byte-exact (%d bad)",
	      CONC, bad);
	h_plan_free(x, CONC);

	CHECK(h_quiet(&env.p, &x[0].id, 300) == 0 &&
		      h_quiet(&env.d, &x[0].id, 0) == 0 && env.p.n_evs == 0 &&
		      env.d.n_evs == 0,
	      "no stray events are left over");
	return h_finish(&env);
}
