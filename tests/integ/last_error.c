/* last_error: every failing call of libpdx says why in
 * pdx_engine_last_error(), and a GPU engine's CUDA calls fail cleanly
 * where CUDA cannot serve them (here: no driver; with argv[2], the CUDA
 * toolkit's stub libcuda.so: a driver that is there but unusable). After
 * all of it the engines still move KV. Two real agents (argv[1]).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/integ/harness.h"

#define LAST(e) pdx_engine_last_error(e)

/* st is the failure want, and last_error names it with `says` */
#define FAILS(call, want, says, what)                                          \
	do {                                                                   \
		pdx_status_t st_ = (call);                                     \
		CHECK_EQ(st_, want, what ": %s", pdx_status_str(st_));         \
		CHECK(strstr(LAST(e), says) != NULL,                           \
		      what ": the reason says \"" says "\" (\"%s\")", LAST(e)); \
	} while (0)

/* The CUDA calls without a usable driver (or, on a GPU machine, given
 * memory CUDA IPC cannot share): an error and its reason, no crash. */
static void cuda_refusals(struct pdx_engine *e, const struct pdx_kv_layout *l,
			  const char *driver_says)
{
	struct pdx_engine_region r, cr = {.type = PDX_MEM_CUDA};
	struct pdx_xfer_id x;
	char why[512] = "", peer[PDX_ADDR_MAX];
	uint64_t off = 7;
	void *host = calloc(1, 4096);
	pdx_status_t st;

	st = pdx_engine_cuda_region(host, 4096, &r, &off, why, sizeof(why));
	CHECK(st == PDX_EIO || st == PDX_EINVAL,
	      "cuda_region of host memory fails (%s: %s)", pdx_status_str(st),
	      why);
	CHECK(strstr(why, driver_says) ||
		  strstr(why, "not memory CUDA knows"),
	      "cuda_region: the reason says \"%s\" or names host memory (\"%s\")",
	      driver_says, why);
	CHECK_EQ(off, 7, "cuda_region: the offset is left as it was");
	CHECK_EQ(pdx_engine_cuda_region(host, 4096, &r, &off, NULL, 0),
		 st, "cuda_region without a why buffer: the same status");
	why[0] = '\0';
	CHECK_EQ(pdx_engine_cuda_region(NULL, 4096, &r, &off, why, sizeof(why)),
		 PDX_EINVAL, "cuda_region(NULL) is EINVAL (%s)", why);
	CHECK_STR_CONTAINS(why, "needs a device pointer");
	free(host);

	FAILS(pdx_engine_register_cuda_streams(e, l, &cr, 1, 0, peer,
					       sizeof(peer)),
	      PDX_EINVAL, "1 to 64", "register_cuda_streams with 0 slots");
	FAILS(pdx_engine_register_cuda_streams(e, NULL, &cr, 1, 4, peer,
					       sizeof(peer)),
	      PDX_EINVAL, "needs a layout", "register_cuda_streams, no layout");
	cr.type = PDX_MEM_SHM;
	FAILS(pdx_engine_register_cuda_streams(e, l, &cr, 1, 4, peer,
					       sizeof(peer)),
	      PDX_EINVAL, "no PDX_MEM_CUDA region",
	      "register_cuda_streams, host regions only");
	/* a region the agent could never open: without a driver it fails
	 * first here; with one, the agent refuses it */
	cr.type = PDX_MEM_CUDA;
	cr.size = 1ULL << 40;
	st = pdx_engine_register_cuda_streams(e, l, &cr, 1, 4, peer,
					      sizeof(peer));
	CHECK(st < 0 && LAST(e)[0],
	      "register_cuda_streams with a bogus GPU region fails, saying "
	      "why (%s: %s)",
	      pdx_status_str(st), LAST(e));
	pdx_xfer_id_random(&x);
	FAILS(pdx_engine_layer_done_stream(e, 0, NULL, &x, 1), PDX_EINVAL,
	      "not registered with pdx_engine_register_cuda_streams",
	      "layer_done_stream before register_cuda_streams");
}

/* Run with the stub driver first in the library path: it loads, and
 * cuInit fails. */
static int stub_driver(const char *self, const char *stub)
{
	char dir[] = "/tmp/pdx_stub_cuda.XXXXXX", link[64], env[4200],
	     cmd[8600];
	const char *old = getenv("LD_LIBRARY_PATH");
	int rc;

	if (!mkdtemp(dir))
		return -1;
	snprintf(link, sizeof(link), "%s/libcuda.so.1", dir);
	if (symlink(stub, link)) {
		rmdir(dir);
		return -1;
	}
	snprintf(env, sizeof(env), "LD_LIBRARY_PATH=%s%s%s", dir,
		 old ? ":" : "", old ? old : "");
	snprintf(cmd, sizeof(cmd), "%s '%s' stub-run", env, self);
	rc = system(cmd);
	unlink(link);
	rmdir(dir);
	return rc;
}

static int stub_run(void)
{
	struct pdx_engine_params p = {.agent = "ipc:///nonexistent/pdx"};
	struct pdx_kv_layer layer = {{{0, 0}, {0, 32}}, 64};
	struct pdx_kv_layout l = {1, 2, 1, 1, 1, 8, 4, PDX_KV_NHD, &layer};
	struct pdx_engine_region cr = {.type = PDX_MEM_CUDA, .size = 4096};
	struct pdx_engine *e;
	char peer[PDX_ADDR_MAX];

	h_note("stub driver: libcuda.so.1 loads, cuInit fails");
	if (pdx_engine_connect(&p, &e) != PDX_OK)
		CHECK_FAIL("connect");
	FAILS(pdx_engine_register_cuda_streams(e, &l, &cr, 1, 2, peer,
					       sizeof(peer)),
	      PDX_EIO, "no real CUDA driver",
	      "register_cuda_streams with a stub driver");
	cuda_refusals(e, &l, "cuInit: CUDA_ERROR_STUB_LIBRARY");
	pdx_engine_free(e);
	CHECK_DONE();
}

/* An engine whose agent is not there: what it says about the link. */
static void no_agent(void)
{
	struct pdx_engine_params p = {.agent = "ipc:///nonexistent/pdx",
				      .timeout_ms = 200};
	struct pdx_engine *e;
	struct pdx_xfer_id x;
	uint32_t b = 0;

	if (pdx_engine_connect(&p, &e) != PDX_OK) {
		CHECK_FAIL("connect");
		return;
	}
	pdx_xfer_id_random(&x);
	FAILS(pdx_engine_send(e, &x, "tcp://127.0.0.1:1", &b, 1), PDX_ENOTREG,
	      "pdx_engine_register first", "send before a register");
	struct pdx_kv_layer layer = {{{0, 0}, {0, 32}}, 64};
	struct pdx_kv_layout l = {1, 2, 1, 1, 1, 8, 4, PDX_KV_NHD, &layer};
	struct pdx_engine_region r = {.type = PDX_MEM_SHM, .shm_name = "/x",
				      .size = 4096};
	FAILS(pdx_engine_register(e, &l, &r, 1, NULL, 0), PDX_ETIMEDOUT,
	      "not connected after 200 ms: no connection to the agent at "
	      "ipc:///nonexistent/pdx yet (is a pdx-agent running with that "
	      "--engine?)",
	      "register with no agent there: where, and what to check");
	pdx_engine_free(e);
}

int main(int argc, char **argv)
{
	struct h_opts o = {0};
	struct pdx_engine_event ev;
	struct pdx_engine_region bad;
	struct pdx_kv_layout l;
	struct pdx_engine *e;
	struct h_env env;
	struct h_xfer x[1];
	char peer[PDX_ADDR_MAX], tiny[4];
	uint32_t b = 0;

	if (argc > 1 && strcmp(argv[1], "stub-run") == 0)
		return stub_run();
	h_note("last_error: each failing call says why; CUDA calls without "
	       "a usable driver fail cleanly");
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		return h_finish(&env);
	}
	e = env.p.eng;
	l = env.p.pool.layout;
	CHECK_STR_CONTAINS(pdx_engine_last_error(NULL), "no engine");

	/* register: refused here, and by the agent */
	l.layers = 0;
	FAILS(pdx_engine_register(e, &l, &env.p.pool.region, 1, peer,
				  sizeof(peer)),
	      PDX_EINVAL, "layout refused", "register with 0 layers");
	l = env.p.pool.layout;
	FAILS(pdx_engine_register(e, &l, &env.p.pool.region, 0, peer,
				  sizeof(peer)),
	      PDX_EINVAL, "regions", "register with no region");
	bad = env.p.pool.region;
	bad.size = 0;
	FAILS(pdx_engine_register(e, &l, &bad, 1, peer, sizeof(peer)),
	      PDX_EINVAL, "region 0: needs a size", "register, a sizeless region");
	bad = env.p.pool.region;
	bad.shm_name = "/pdx_last_error_absent";
	CHECK(pdx_engine_register(e, &l, &bad, 1, peer, sizeof(peer)) < 0,
	      "register of an shm object that is not there fails");
	CHECK(strstr(LAST(e), "register refused by the agent: ") &&
		  strlen(LAST(e)) > strlen("register refused by the agent: "),
	      "register: the agent's reason (\"%s\")", LAST(e));
	FAILS(pdx_engine_register(e, &l, &env.p.pool.region, 1, tiny,
				  sizeof(tiny)),
	      PDX_ETOOBIG, "peer address is over 3 bytes",
	      "register, peer address buffer too small");

	/* announcements and the rest */
	h_plan(&env, x, 1, 2, 0, true);
	FAILS(pdx_engine_send(e, &x[0].id, NULL, &b, 0), PDX_EINVAL,
	      "send: needs a transfer id and 1", "send with no blocks");
	FAILS(pdx_engine_recv(e, &x[0].id, NULL, &b, 1, 0), PDX_EINVAL,
	      "recv: needs a peer address", "recv with no peer");
	FAILS(pdx_engine_layer_done(e, PDX_MAX_LAYERS, &x[0].id, 1),
	      PDX_EINVAL, "a layer below", "layer_done past the last layer");
	FAILS(pdx_engine_token(e, NULL, 1), PDX_EINVAL, "token: needs",
	      "token with no transfer");
	FAILS(pdx_engine_hold(e, &x[0].id, NULL), PDX_EINVAL,
	      "hold: needs the peer", "hold with no peer");
	FAILS(pdx_engine_abort(e, NULL), PDX_EINVAL, "abort: needs",
	      "abort with no transfer");
	FAILS(pdx_engine_next_event(e, NULL), PDX_EINVAL, "no event to fill",
	      "next_event with nowhere to write");
	FAILS(pdx_engine_wait_event(e, -2, &ev), PDX_EINVAL, "timeout",
	      "wait_event with -2 ms");
	FAILS(pdx_engine_wait_event(e, 50, &ev), PDX_ETIMEDOUT,
	      "no event in 50 ms", "wait_event with nothing coming");
	CHECK_EQ(pdx_engine_send(e, &x[0].id, env.d.peer, x[0].src, x[0].n),
		 PDX_OK, "a send goes out");
	CHECK(LAST(e)[0] == '\0', "last_error is empty after a success");
	FAILS(pdx_engine_send(e, &x[0].id, env.d.peer, x[0].src, x[0].n),
	      PDX_EEXIST, "is in flight already", "the same send again");
	pdx_engine_abort(e, &x[0].id);
	h_wait(&env.p, &x[0].id, 5000, &ev);
	h_plan_free(x, 1);

	no_agent();
	cuda_refusals(e, &env.p.pool.layout, "no CUDA driver");
	if (argc > 2)
		CHECK_EQ(stub_driver(argv[0], argv[2]), 0,
			 "the same with the CUDA toolkit's stub driver");

	/* nothing above broke the engines or their registrations */
	h_plan(&env, x, 1, 4, 0, true);
	CHECK_EQ(h_run(&env, x, 1), 0, "a transfer after all of it is byte-exact");
	h_plan_free(x, 1);
	return h_finish(&env);
}
