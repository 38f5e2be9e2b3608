/* pdx-xferbench: KV transfer throughput and latency over the real path.
 *
 * The parent starts two pdx-agent processes and forks two synthetic engines
 * (prefill "P" and decode "D", bench/xb_nodes.h, bench/xb_engine.h), or
 * one of each per tensor-parallel rank (bench/xb_tp.h). Each engine keeps a
 * KV pool shaped like the model (its heads of it), in POSIX shared memory
 * or (--mem cuda) in GPU memory, and registers it with its agent. Per
 * iteration the parent mints the transfer ids and picks the blocks (written
 * to a shared anonymous mapping both engines see, bench/xb_plan.h), then
 * drives the engines with fixed-size commands over pipes
 * (bench/xb_measure.h, bench/xb_one_block.h) and finally reports
 * (bench/xb_report.h).
 *
 * This file is the run from start to end: the checks before anything
 * starts, the setup, the measurement, the orderly stop, the report. Times
 * are CLOCK_MONOTONIC, comparable between the processes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/pdx_bench.h"
#include "bench/xb_fail.h"
#include "bench/xb_measure.h"
#include "bench/xb_nodes.h"
#include "bench/xb_one_block.h"
#include "bench/xb_opts.h"
#include "bench/xb_plan.h"
#include "bench/xb_report.h"
#include "bench/xb_tp.h"
#include "bench/xfer_cuda.h"
#include "common/log.h"
#include "common/shm_object.h"

/* --mem cuda: whether the device is there, asked in a child that exits,
 * so that this process, which forks the engines later, never initialises
 * CUDA (it does not survive fork()). No device: exit XB_CUDA_SKIP. */
static void cuda_probe(const struct xb_opts *o)
{
	char err[512];
	pid_t pid;
	int st;

	fflush(NULL);
	pid = fork();
	if (pid < 0)
		xb_fail("fork: %s", strerror(errno));
	if (pid == 0) {
		int rc = xb_cuda_probe(o->cuda_dev, err, sizeof(err));

		if (!rc && o->decode_dev != o->cuda_dev)
			rc = xb_cuda_probe(o->decode_dev, err, sizeof(err));

		if (rc)
			fprintf(stderr, "pdx-xferbench: --mem %s: %s\n", o->mem, err);
		_exit(rc == XB_CUDA_SKIP ? XB_CUDA_SKIP : rc ? 1 : 0);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			xb_fail("waitpid: %s", strerror(errno));
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return;
	if (WIFEXITED(st) && WEXITSTATUS(st) == XB_CUDA_SKIP)
		exit(XB_CUDA_SKIP);
	xb_fail("--mem %s: the CUDA check failed (wait status 0x%x)", o->mem, st);
}

/* Whether /dev/shm holds every node's pool. */
static void shm_check(const struct xb_opts *o, const struct xb_plan *plan,
		      const struct xb_nodes *ns)
{
	const struct pdx_model *m = o->model;
	uint64_t need = 0;
	struct statvfs sv;

	for (int i = 0; i < ns->n; i++)
		need += (uint64_t)plan->pool_blocks * m->layers * m->tensors *
			m->block_tokens *
			xb_plan_rank_heads(m, ns->node[i].tp_size) *
			m->head_dim * m->dtype_bytes;
	if (!o->cuda && statvfs("/dev/shm", &sv) == 0 &&
	    (uint64_t)sv.f_bavail * sv.f_frsize < need)
		xb_fail("/dev/shm has %.2f GiB free; the %d pools need %.2f GiB",
			   (double)sv.f_bavail * sv.f_frsize / 1073741824.0,
			   ns->n, (double)need / 1073741824.0);
}

/* Pools left in /dev/shm by runs that were killed (SIGKILL: no cleanup
 * runs), before counting the room for ours. Our engines' pools are
 * locked while they live (common/shm_object.h), so another run's stay. */
static void shm_sweep(void)
{
	int n = pdx_shm_object_sweep(XB_SHM_PREFIX,
				     PDX_SHM_OBJECT_SWEEP_MIN_AGE_S);

	if (n)
		fprintf(stderr, "pdx-xferbench: removed %d KV pool(s) left in /dev/shm by runs that were killed\n",
			n);
}

/* The prefill ranks, and the decode ranks of each TP size and block
 * order the arms ask for: an arm of the first arm's shares its ranks. */
static void sides_add(struct xb_run *run, struct xb_nodes *ns)
{
	const struct xb_opts *o = run->o;
	const struct xb_shape *a0 = &run->arm[0].shape, *a1 = &run->arm[1].shape;

	xb_tp_side_add(ns, &run->pre, "prefill", 'P', o->prefill_tp, o->order,
		       o->cuda_dev);
	xb_tp_side_add(ns, &run->dec[0], "decode", 'D', a0->decode_tp,
		       a0->decode_order, o->decode_dev);
	run->arm[0].dec = &run->dec[0];
	run->arm[1].dec = &run->dec[0];
	if (run->n_arms > 1 && (a1->decode_tp != a0->decode_tp ||
				a1->decode_order != a0->decode_order)) {
		xb_tp_side_add(ns, &run->dec[1], "decode", 'D', a1->decode_tp,
			       a1->decode_order, o->decode_dev);
		run->arm[1].dec = &run->dec[1];
	}
	run->prefill = run->pre.rank[0];
	run->decode = run->dec[0].rank[0];
}

int main(int argc, char **argv)
{
	static struct xb_opts o;
	static struct xb_plan plan;
	static struct xb_nodes nodes;
	static struct xb_run run;
	static struct xb_one_block ob;
	char dir[256];
	int rc;

	xb_opts_parse(argc, argv, &o);
	pdx_log_prefix("xferbench");
	if (o.cuda)
		cuda_probe(&o);

	plan.model = o.model;
	plan.order = o.order;
	plan.conc = o.arm[0].conc;
	plan.nblocks = o.arm[0].nblocks;
	plan.pool_blocks = plan.conc * plan.nblocks + 4;
	plan.event_wait_ms = xb_opts_event_wait_ms(&o);
	fprintf(stderr, "pdx-xferbench: a transfer's events waited for %.0f s at most (--xfer-timeout-ms %u%s + %u layers x %g ms + %d s)\n",
		(double)plan.event_wait_ms / 1000,
		o.xfer_timeout_ms ? o.xfer_timeout_ms : XB_AGENT_XFER_TIMEOUT_MS,
		o.xfer_timeout_ms ? "" : ", the agents' default",
		o.model->layers, xb_opts_layer_ms(&o),
		XB_EVENT_GRACE_MS / 1000);
	run.o = &o;
	run.plan = &plan;
	run.rng = o.seed;
	run.n_arms = o.n_arms;
	for (uint32_t a = 0; a < 2; a++) {
		run.arm[a].shape = o.arm[a];
		run.arm[a].res.verified = true;
		for (uint32_t j = 0; j < XB_TP_MAX; j++)
			run.arm[a].res.rank_verified[j] = true;
	}
	sides_add(&run, &nodes);
	plan.rows = (uint32_t)nodes.n;
	shm_sweep();
	shm_check(&o, &plan, &nodes);
	for (uint32_t a = 0; a < run.n_arms; a++) {
		run.arm[a].res.lat_ms = calloc((size_t)o.iters * o.concurrency,
					       sizeof(double));
		if (!run.arm[a].res.lat_ms)
			xb_fail("out of memory");
	}

	pb_cleanup_install();
	xb_plan_alloc(&plan);
	if (pb_tmpdir(dir, sizeof(dir)))
		xb_fail("cannot make a temporary directory");

	nodes.on_trace = xb_one_block_trace;
	nodes.trace_arg = &ob;
	xb_nodes_start(&nodes, &o, &plan, dir);
	xb_tp_peers(&plan, &run.pre);
	snprintf(run.dev.gpu, sizeof(run.dev.gpu), "%s", run.prefill->gpu);

	xb_measure_run(&run);
	if (o.one_block)
		xb_one_block_run(&run, &ob);

	/* orderly stop: engines first, then agents */
	xb_nodes_stop(&nodes);
	pb_tmpdir_remove(dir);

	xb_report_print(&run, &ob);
	rc = xb_run_verified(&run) ? 0 : 1;
	for (uint32_t a = 0; a < run.n_arms; a++)
		free(run.arm[a].res.lat_ms);
	free(ob.s);
	return rc;
}
