/* stop_midway: the prefill agent is stopped (SIGTERM) while UCX operations
 * of its transfers are still in flight, to a decode agent frozen (SIGSTOP)
 * after it asked. The stopping agent ends its transfers, UCX calls back
 * for some cancelled operations afterwards and never for others: the agent
 * must exit 0 all the same, under AddressSanitizer or valgrind with no
 * finding. Two ways to leave operations in flight:
 *
 *   am:   the am lane over TCP, every message by rendezvous
 *         (UCX_RNDV_THRESH=64), each waiting for the frozen receiver. A
 *         callback reading a freed transfer made the agent exit 1 under
 *         ASan before the transfers held by operations were kept until
 *         UCX was gone.
 *   done: the ipc lane over shared memory: the copies land without the
 *         receiver, but each transfer's "done", sent by UCX with 64 KiB of
 *         meta, fills the frozen receiver's FIFO until the later ones stay
 *         pending. UCX polls for room there and cannot arm its event fd
 *         meanwhile; the agent used to keep polling, deaf to its engine
 *         and to signals, until the receiver woke. Now, before the stop,
 *         an abort from the prefill engine must still be answered.
 *
 *   stop_midway PATH-TO-pdx-agent am|done
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "tests/integ/harness.h"

#define N_AM 2
#define N_DONE 32

/* Every transfer of x gets as much meta as the engine API allows. */
static void meta_all(struct h_env *env, struct h_xfer *x, size_t n)
{
	static uint8_t meta[PDX_META_MAX];

	for (size_t i = 0; i < n; i++) {
		x[i].meta_len = PDX_META_MAX;
		h_meta(&x[i], meta);
		CHECK_EQ(pdx_engine_meta(env->p.eng, &x[i].id, meta,
					 x[i].meta_len), PDX_OK,
			 "pdx_engine_meta");
	}
}

int main(int argc, char **argv)
{
	const char *how = argc > 2 ? argv[2] : "";
	bool done = !strcmp(how, "done");
	struct h_opts o = { .tls = done ? "sm,self" : "tcp",
			    .data_path = done ? "ipc" : "am",
			    .xfer_timeout_ms = 20000 };
	size_t n = done ? N_DONE : N_AM;
	struct h_env env;
	struct h_xfer x[N_DONE + 1];
	struct pdx_engine_event ev;
	uint32_t L;
	int st;

	if (!done && strcmp(how, "am")) {
		fprintf(stderr, "usage: %s PATH-TO-pdx-agent am|done\n",
			argv[0]);
		return 2;
	}
	h_note("stop_midway %s: SIGTERM the prefill agent with %s in flight "
	       "to a frozen decode agent", how,
	       done ? "dones carrying meta" : "rendezvous sends");
	if (!done)
		o.env_p[0] = o.env_d[0] = "UCX_RNDV_THRESH=64";
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		return h_finish(&env);
	}
	L = env.p.pool.layout.layers;
	h_plan(&env, x, 2, 8, 0, true);
	CHECK_EQ(h_run(&env, x, 2), 0, "a transfer before: the agents shook "
		 "hands");
	h_plan_free(x, 2);

	/* done: one more transfer, never computed, to abort */
	h_plan(&env, x, n + done, done ? 1 : 8, 0, false);
	h_prepare(&env, x, n + done);
	h_post_recv(&env, x, n + done);
	h_post_send(&env, x, n + done);
	h_sleep_ms(300); /* the wants reach the prefill agent */
	pb_agent_kill(&env.d.agent, SIGSTOP);
	if (done)
		meta_all(&env, x, n);
	for (uint32_t l = 0; l < L; l++)
		h_layer_done(&env, l, x, n);
	h_sleep_ms(300); /* pushed: the sends wait for the frozen receiver */
	if (done) {
		CHECK_EQ(pdx_engine_abort(env.p.eng, &x[n].id), PDX_OK,
			 "pdx_engine_abort");
		CHECK(h_wait(&env.p, &x[n].id, 3000, &ev) == 0 &&
		      ev.kind == PDX_EVENT_FAILED,
		      "the prefill agent, its dones stuck behind a frozen "
		      "receiver, still answers an abort within 3 s");
	}
	st = pb_agent_stop(&env.p.agent);
	CHECK(st == 0, "the prefill agent, stopped with its sends in flight, "
	      "exits 0 (wait status 0x%x)", st);
	pb_agent_kill(&env.d.agent, SIGCONT);
	h_plan_free(x, n + done);
	return h_finish(&env);
}
