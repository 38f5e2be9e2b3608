/* cuda_region: a GPU engine's side of libpdx against two real pdx-agents
 * (argv[1]), with the CUDA runtime and no torch.
 *
 * The prefill engine's KV is one cudaMalloc with each layer's K and V
 * tensors carved at offsets inside it (as PyTorch's caching allocator
 * does): pdx_engine_cuda_region gives every tensor the same region and
 * its offset. The decode engine's KV is one cudaMalloc per tensor (as
 * vLLM allocates them): one region each. The prefill engine registers
 * with pdx_engine_register_cuda_streams and, per layer, queues the
 * layer's bytes on its own non-default stream behind a stream-ordered
 * delay and calls pdx_engine_layer_done_stream: the agent must wait for
 * the recorded event, or it would read the layer before its bytes are
 * there. Three transfers over two event slots (the slots wrap); every
 * byte is checked. Then the memory legacy CUDA IPC cannot share is
 * refused, naming it: cuMemCreate (virtual memory management), managed,
 * pinned host, plain host memory, a range past its allocation.
 * Exits 77 (skipped) without a CUDA device.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/pdx_bench.h"
#include "tests/check.h"
#include "tests/gpu/gpu_skip.h"

#define LAYERS 4
#define TENSORS (2 * LAYERS)
#define BLOCKS 64
#define BLOCK_BYTES 4096 /* 16 tokens x 2 heads x 64 x 2 bytes */
#define TENSOR_BYTES ((uint64_t)BLOCKS * BLOCK_BYTES)
#define SLOTS 2
#define XFERS 3
#define N 8 /* blocks per transfer */

static struct pdx_kv_layer lay_p[LAYERS], lay_d[LAYERS];

static struct pdx_kv_layout layout(struct pdx_kv_layer *l)
{
	return (struct pdx_kv_layout){.layers = LAYERS, .tensors = 2,
				      .blocks = BLOCKS, .block_tokens = 16,
				      .kv_heads = 2, .head_dim = 64,
				      .dtype_bytes = 2, .order = PDX_KV_NHD,
				      .layer = l};
}

static int cuda_ok(cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 1;
	CHECK_FAIL("%s: %s", what, cudaGetErrorString(e));
	return 0;
}

/* The byte at (transfer x, block i, tensor t, k): a pattern per byte. */
static uint8_t pattern(int x, int i, int t, uint64_t k)
{
	return (uint8_t)(x * 131 + i * 31 + t * 7 + k * 13 + (k >> 8));
}

/* A stream-ordered delay: the layer's bytes land well after the
 * layer_done call returned, so an agent that did not wait on the event
 * would read them too early. */
static void CUDART_CB nap(void *arg)
{
	(void)arg;
	usleep(20000);
}

static struct pb_agent agents[2];

static int agent(int i, const char *bin, const char *dir, char *engine,
		 size_t len)
{
	struct pb_agent_opts o = {0};
	char listen[64];

	snprintf(engine, len, "ipc://%s/%c.engine", dir, "pd"[i]);
	snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d",
		 pb_free_port("127.0.0.1"));
	o.bin = bin;
	o.engine = engine;
	o.listen = listen;
	return pb_agent_start(&agents[i], &o);
}

/* Registers with stream events once the link to the agent is up (a
 * register that timed out could still be answered later: not retried). */
static pdx_status_t register_streams(struct pdx_engine *e,
				     const struct pdx_kv_layout *l,
				     const struct pdx_engine_region *r,
				     size_t n, char *peer)
{
	struct pdx_engine_event ev;

	for (int i = 0; i < 500 && pb_agent_alive(&agents[0]); i++) {
		pdx_engine_next_event(e, &ev); /* reads the link's state */
		if (pdx_engine_link_status(e, NULL, 0) == PDX_OK)
			return pdx_engine_register_cuda_streams(
			    e, l, r, n, SLOTS, peer, PDX_ADDR_MAX);
		usleep(20000);
	}
	return PDX_ETIMEDOUT;
}

static int wait_ok(struct pdx_engine *e, const char *side)
{
	struct pdx_engine_event ev;
	pdx_status_t st = pdx_engine_wait_event(e, 20000, &ev);

	CHECK(st == PDX_OK && ev.kind != PDX_EVENT_FAILED,
	      "%s: the transfer's event is a success (%s; %s)", side,
	      pdx_status_str(st), st == PDX_OK ? ev.reason : "");
	return st == PDX_OK && ev.kind != PDX_EVENT_FAILED ? 0 : -1;
}

static void transfers(const char *agent_bin, const char *dir)
{
	struct pdx_engine_region rp, rd[TENSORS], r;
	struct pdx_kv_layout lp = layout(lay_p), ld = layout(lay_d);
	struct pdx_engine_params pp = {.timeout_ms = 30000}, pd = {0};
	struct pdx_engine *ep = NULL, *ed = NULL;
	char eng_p[4300], eng_d[4300], peer_p[PDX_ADDR_MAX], peer_d[PDX_ADDR_MAX];
	char why[512];
	uint8_t *big = NULL, *t_d[TENSORS] = {0}, *host = NULL;
	uint64_t off, off_t[TENSORS];
	cudaStream_t s = NULL;

	if (agent(0, agent_bin, dir, eng_p, sizeof(eng_p)) ||
	    agent(1, agent_bin, dir, eng_d, sizeof(eng_d))) {
		CHECK_FAIL("start the agents");
		return;
	}
	/* one allocation, the tensors at odd offsets inside it */
	if (!cuda_ok(cudaMalloc((void **)&big, 3 * 4096 + TENSORS *
					       (TENSOR_BYTES + 8192)),
		     "cudaMalloc") ||
	    !cuda_ok(cudaMallocHost((void **)&host, TENSOR_BYTES * TENSORS),
		     "cudaMallocHost") ||
	    !cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
		     "cudaStreamCreate"))
		goto out;
	for (int t = 0; t < TENSORS; t++) {
		off_t[t] = 3 * 4096 + (uint64_t)t * (TENSOR_BYTES + 8192);
		why[0] = '\0';
		CHECK_EQ(pdx_engine_cuda_region(big + off_t[t], TENSOR_BYTES,
						t ? &r : &rp, &off, why,
						sizeof(why)),
			 PDX_OK, "prefill tensor %d: its region (%s)", t, why);
		CHECK_EQ(off, off_t[t], "prefill tensor %d: its offset", t);
		if (t)
			CHECK(!memcmp(&r, &rp, sizeof(r)),
			      "prefill tensor %d: the same region as tensor 0",
			      t);
		lay_p[t / 2].base[t % 2] = (struct pdx_kv_ref){0, off};
		lay_p[t / 2].block_stride = BLOCK_BYTES;
	}
	CHECK_EQ(rp.size, 3 * 4096 + TENSORS * (TENSOR_BYTES + 8192),
		 "the region is the whole allocation");
	/* one allocation per tensor */
	for (int t = 0; t < TENSORS; t++) {
		if (!cuda_ok(cudaMalloc((void **)&t_d[t], TENSOR_BYTES),
			     "cudaMalloc") ||
		    !cuda_ok(cudaMemset(t_d[t], 0xab, TENSOR_BYTES),
			     "cudaMemset"))
			goto out;
		CHECK_EQ(pdx_engine_cuda_region(t_d[t], TENSOR_BYTES, &rd[t],
						&off, why, sizeof(why)),
			 PDX_OK, "decode tensor %d: its region (%s)", t, why);
		CHECK_EQ(off, 0, "decode tensor %d: at its allocation's start", t);
		lay_d[t / 2].base[t % 2] = (struct pdx_kv_ref){(uint32_t)t, 0};
		lay_d[t / 2].block_stride = BLOCK_BYTES;
	}
	pp.agent = eng_p;
	pd.agent = eng_d;
	if (pdx_engine_connect(&pp, &ep) || pdx_engine_connect(&pd, &ed))
		goto out;
	CHECK_EQ(register_streams(ep, &lp, &rp, 1, peer_p), PDX_OK,
		 "prefill: registered with stream events (%s)",
		 pdx_engine_last_error(ep));
	CHECK_EQ(pb_register_regions_retry(ed, &ld, rd, TENSORS, NULL, peer_d,
					   sizeof(peer_d), 10000, &agents[1]),
		 PDX_OK, "decode: registered %d regions (%s)", TENSORS,
		 pdx_engine_last_error(ed));
	if (check_failures)
		goto out;

	for (int x = 0; x < XFERS; x++) {
		struct pdx_xfer_id id;
		uint32_t src[N], dst[N];
		int bad = 0;

		pdx_xfer_id_random(&id);
		for (int i = 0; i < N; i++) {
			src[i] = (uint32_t)(x * N + i * 3) % BLOCKS;
			dst[i] = (uint32_t)(BLOCKS - 1 - x * N - i);
		}
		CHECK_EQ(pdx_engine_recv(ed, &id, peer_p, dst, N, 0), PDX_OK,
			 "transfer %d: recv", x);
		CHECK_EQ(pdx_engine_send(ep, &id, peer_d, src, N), PDX_OK,
			 "transfer %d: send", x);
		for (int l = 0; l < LAYERS; l++) {
			/* the layer's K and V land after a nap on the stream */
			cuda_ok(cudaLaunchHostFunc(s, nap, NULL), "host func");
			for (int t = 2 * l; t < 2 * l + 2; t++)
				for (int i = 0; i < N; i++) {
					uint8_t *h = host + (uint64_t)t *
						TENSOR_BYTES + (uint64_t)i *
						BLOCK_BYTES;

					for (uint64_t k = 0; k < BLOCK_BYTES; k++)
						h[k] = pattern(x, i, t, k);
					cuda_ok(cudaMemcpyAsync(
						    big + off_t[t] +
							(uint64_t)src[i] *
							    BLOCK_BYTES,
						    h, BLOCK_BYTES,
						    cudaMemcpyHostToDevice, s),
						"cudaMemcpyAsync");
				}
			CHECK_EQ(pdx_engine_layer_done_stream(ep, l, s, &id, 1),
				 PDX_OK, "transfer %d layer %d: layer_done_stream (%s)",
				 x, l, pdx_engine_last_error(ep));
		}
		wait_ok(ep, "prefill");
		wait_ok(ed, "decode");
		/* the host buffer is reused by the next pass */
		cuda_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
		for (int t = 0; t < TENSORS; t++)
			for (int i = 0; i < N; i++) {
				uint8_t got[BLOCK_BYTES];

				cuda_ok(cudaMemcpy(got, t_d[t] + (uint64_t)dst[i] *
							  BLOCK_BYTES,
						   BLOCK_BYTES,
						   cudaMemcpyDeviceToHost),
					"cudaMemcpy");
				for (uint64_t k = 0; k < BLOCK_BYTES; k++)
					bad += got[k] != pattern(x, i, t, k);
			}
		CHECK_EQ(bad, 0, "transfer %d: every byte on the decode GPU", x);
	}
out:
	pdx_engine_free(ep);
	pdx_engine_free(ed);
	pb_agent_stop(&agents[0]);
	pb_agent_stop(&agents[1]);
	if (s)
		cudaStreamDestroy(s);
	cudaFreeHost(host);
	cudaFree(big);
	for (int t = 0; t < TENSORS; t++)
		cudaFree(t_d[t]);
}

/* The region call on p refuses, its reason naming says. */
static void refused(const void *p, uint64_t size, pdx_status_t want,
		    const char *says, const char *what)
{
	struct pdx_engine_region r;
	char why[512] = "";
	uint64_t off;
	pdx_status_t st = pdx_engine_cuda_region(p, size, &r, &off, why,
						 sizeof(why));

	CHECK(st == want && strstr(why, says),
	      "%s: refused (%s), saying \"%s\" (\"%s\")", what,
	      pdx_status_str(st), says, why);
}

/* Memory mapped with the virtual memory management API, as vLLM's sleep
 * mode allocates its KV: the driver's own functions (no link to libcuda:
 * a machine without a driver builds this test too). */
static void vmm_refused(void)
{
	CUresult (*create)(CUmemGenericAllocationHandle *, size_t,
			   const CUmemAllocationProp *, unsigned long long);
	CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
			    unsigned long long);
	CUresult (*map)(CUdeviceptr, size_t, size_t,
			CUmemGenericAllocationHandle, unsigned long long);
	CUresult (*access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*gran)(size_t *, const CUmemAllocationProp *,
			 CUmemAllocationGranularity_flags);
	CUresult (*unmap)(CUdeviceptr, size_t), (*afree)(CUdeviceptr, size_t);
	CUresult (*release)(CUmemGenericAllocationHandle);
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	CUmemAllocationProp prop = {0};
	CUmemAccessDesc desc = {0};
	CUmemGenericAllocationHandle mh;
	CUdeviceptr p;
	size_t size;

	if (!h) {
		CHECK_FAIL("dlopen libcuda.so.1: %s", dlerror());
		return;
	}
	*(void **)&create = dlsym(h, "cuMemCreate");
	*(void **)&reserve = dlsym(h, "cuMemAddressReserve");
	*(void **)&map = dlsym(h, "cuMemMap");
	*(void **)&access = dlsym(h, "cuMemSetAccess");
	*(void **)&gran = dlsym(h, "cuMemGetAllocationGranularity");
	*(void **)&unmap = dlsym(h, "cuMemUnmap");
	*(void **)&afree = dlsym(h, "cuMemAddressFree");
	*(void **)&release = dlsym(h, "cuMemRelease");
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	desc.location = prop.location;
	desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	if (gran(&size, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ||
	    create(&mh, size, &prop, 0)) {
		CHECK_FAIL("cuMemCreate");
		return;
	}
	if (reserve(&p, size, 0, 0, 0) || map(p, size, 0, mh, 0) ||
	    access(p, size, &desc, 1)) {
		CHECK_FAIL("cuMemAddressReserve, cuMemMap, cuMemSetAccess");
	} else {
		refused((void *)(uintptr_t)(p + 4096), 4096, PDX_EINVAL,
			"virtual-memory-managed memory (cuMemCreate",
			"cuMemCreate memory");
		unmap(p, size);
	}
	afree(p, size);
	release(mh);
}

int main(int argc, char **argv)
{
	char dir[256];
	void *managed = NULL, *pinned = NULL, *dev = NULL;
	int n = 0, gate;

	setvbuf(stdout, NULL, _IOLBF, 0);
	gate = gpu_test_gate(cudaGetDeviceCount(&n), n);
	if (gate) {
		printf("# no CUDA device: %s\n", gate == 77 ? "skipped" : "FAIL");
		return gate;
	}
	if (argc < 2 || cudaSetDevice(0) != cudaSuccess)
		return 1;
	pb_cleanup_install();
	if (pb_tmpdir(dir, sizeof(dir)))
		return 1;
	transfers(argv[1], dir);

	vmm_refused();
	if (cuda_ok(cudaMallocManaged(&managed, 1 << 20, cudaMemAttachGlobal),
		    "cudaMallocManaged"))
		refused(managed, 4096, PDX_EINVAL, "managed memory",
			"cudaMallocManaged memory");
	if (cuda_ok(cudaMallocHost(&pinned, 1 << 20), "cudaMallocHost"))
		refused(pinned, 4096, PDX_EINVAL, "pinned host memory",
			"cudaMallocHost memory");
	refused(dir, 16, PDX_EINVAL, "not memory CUDA knows",
		"plain host memory");
	if (cuda_ok(cudaMalloc(&dev, 1 << 20), "cudaMalloc"))
		refused((uint8_t *)dev + 4096, 1 << 20, PDX_ERANGE,
			"runs past its allocation", "a range past its allocation");
	cudaFree(managed);
	cudaFreeHost(pinned);
	cudaFree(dev);
	pb_tmpdir_remove(dir);
	CHECK_DONE();
}
