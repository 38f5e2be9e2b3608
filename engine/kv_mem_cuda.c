/* A KV pool in one GPU's memory: one cudaMalloc allocation with the shm
 * pool's layout, exported for CUDA IPC; a compute stream the synthetic
 * model's kernels (synth_cuda.h) run on; and the ring of interprocess
 * "layer computed" events the agent waits on (include/pdx/engine.h).
 *
 * Nothing here synchronises the device: a pass only queues work and
 * records events, and only reading tokens or checking waits, for the
 * stream. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "engine/kv_mem.h"
#include "engine/synth_cuda.h"

/* Forward passes the agent may lag behind before a recording it has not
 * yet waited on is replaced (engine.h: 4 is plenty). */
#define EVENT_SLOTS 4

_Static_assert(sizeof(cudaIpcMemHandle_t) == PDX_CUDA_IPC_BYTES,
	       "CUDA IPC memory handle size");
_Static_assert(sizeof(cudaIpcEventHandle_t) == PDX_CUDA_IPC_BYTES,
	       "CUDA IPC event handle size");

struct kv_mem_cuda {
	struct pdx__kv_mem m; /* first */
	struct pdx_kv_layout layout;
	struct pdx_engine_region region;
	int device;
	uint8_t *base;
	cudaStream_t stream;
	bool has_stream;
	cudaEvent_t *ev; /* EVENT_SLOTS * layers */
	uint32_t n_ev;	 /* created */
	uint8_t (*handles)[PDX_CUDA_IPC_BYTES];
	struct pdx_engine_cuda_events events;
	uint32_t next_slot;
	struct pdx_synth_cuda *synth;
};

static struct kv_mem_cuda *cuda_of(struct pdx__kv_mem *m)
{
	return (struct kv_mem_cuda *)m;
}

static pdx_status_t cuda_pass(struct pdx__kv_mem *m, struct pdx_synth_run *runs,
			      size_t n, uint32_t vocab, uint32_t *slot)
{
	struct kv_mem_cuda *g = cuda_of(m);
	uint32_t layers = g->layout.layers, s;
	bool writes = false, tokens = false;
	pdx_status_t st;

	*slot = PDX_KV_POOL_NO_SLOT;
	for (size_t i = 0; i < n; i++) {
		writes |= runs[i].b > runs[i].a;
		tokens |= runs[i].want_token;
	}
	if (!writes && !tokens)
		return PDX_OK;
	st = pdx_synth_cuda_stage(g->synth, runs, n);
	if (st != PDX_OK)
		return st;
	if (writes) {
		s = g->next_slot;
		g->next_slot = (s + 1) % EVENT_SLOTS;
		for (uint32_t l = 0; l < layers; l++) {
			st = pdx_synth_cuda_fill(g->synth, l);
			if (st != PDX_OK)
				return st;
			if (cudaEventRecord(g->ev[s * layers + l], g->stream) !=
			    cudaSuccess)
				return PDX_EIO;
		}
		*slot = s;
	}
	if (tokens)
		return pdx_synth_cuda_tokens(g->synth, runs, n, vocab);
	return PDX_OK;
}

static pdx_status_t cuda_verify(struct pdx__kv_mem *m,
				const struct pdx_synth_run *r,
				uint64_t *mismatches, uint32_t *bad)
{
	struct kv_mem_cuda *g = cuda_of(m);
	pdx_status_t st = pdx_synth_cuda_stage(g->synth, r, 1);

	if (st != PDX_OK)
		return st;
	return pdx_synth_cuda_check(g->synth, mismatches, bad);
}

/* Frees what cuda_new made, in reverse; safe on a half-made one. */
static void cuda_free(struct pdx__kv_mem *m)
{
	struct kv_mem_cuda *g = cuda_of(m);

	pdx_synth_cuda_free(g->synth);
	if (g->has_stream) {
		cudaStreamSynchronize(g->stream);
		cudaStreamDestroy(g->stream);
	}
	for (uint32_t i = 0; i < g->n_ev; i++)
		cudaEventDestroy(g->ev[i]);
	free(g->ev);
	free(g->handles);
	if (g->base)
		cudaFree(g->base);
	free(g->layout.layer);
	free(g);
}

static const struct pdx__kv_mem_ops cuda_ops = {
    .pass = cuda_pass,
    .verify = cuda_verify,
    .free = cuda_free,
};

/* The device asked for exists: PDX_ENOENT with the reason when there is
 * no driver, no device or not that one; PDX_EIO when CUDA fails
 * otherwise (under AddressSanitizer the driver's mappings fail unless
 * ASAN_OPTIONS=protect_shadow_gap=0: "out of memory"). */
static pdx_status_t find_device(int device, char *err, size_t errlen)
{
	cudaError_t ce;
	int n = 0;

	ce = cudaGetDeviceCount(&n);
	/* the runtime says "insufficient driver" both without any driver
	 * and with one older than itself: only the first has no device */
	if (ce == cudaErrorNoDevice ||
	    (ce == cudaErrorInsufficientDriver &&
	     access("/proc/driver/nvidia/version", F_OK) != 0) ||
	    (ce == cudaSuccess && n == 0)) {
		snprintf(err, errlen, "no CUDA device (%s)",
			 ce != cudaSuccess ? cudaGetErrorString(ce)
					   : "none found");
		return PDX_ENOENT;
	}
	if (ce != cudaSuccess) {
		snprintf(err, errlen, "initialising CUDA: %s",
			 cudaGetErrorString(ce));
		return PDX_EIO;
	}
	if (device < 0 || device >= n) {
		snprintf(err, errlen, "no CUDA device %d (%d found)", device,
			 n);
		return PDX_ENOENT;
	}
	ce = cudaSetDevice(device);
	if (ce != cudaSuccess) {
		snprintf(err, errlen, "cudaSetDevice(%d): %s", device,
			 cudaGetErrorString(ce));
		return PDX_EIO;
	}
	return PDX_OK;
}

#define CUDA_OR_FAIL(call, what)                                               \
	do {                                                                   \
		cudaError_t ce_ = (call);                                      \
		if (ce_ != cudaSuccess) {                                      \
			snprintf(err, errlen, "%s: %s", what,                  \
				 cudaGetErrorString(ce_));                     \
			st = PDX_EIO;                                          \
			goto fail;                                             \
		}                                                              \
	} while (0)

/* The events of every slot and layer, and their IPC handles. */
static pdx_status_t make_events(struct kv_mem_cuda *g, char *err, size_t errlen)
{
	uint32_t n = EVENT_SLOTS * g->layout.layers;
	pdx_status_t st = PDX_OK;

	g->ev = calloc(n, sizeof(*g->ev));
	g->handles = calloc(n, sizeof(*g->handles));
	if (!g->ev || !g->handles) {
		snprintf(err, errlen, "out of memory");
		return PDX_ENOMEM;
	}
	for (; g->n_ev < n; g->n_ev++) {
		cudaIpcEventHandle_t h;

		CUDA_OR_FAIL(cudaEventCreateWithFlags(
				 &g->ev[g->n_ev], cudaEventInterprocess |
						      cudaEventDisableTiming),
			     "cudaEventCreateWithFlags");
		if (cudaIpcGetEventHandle(&h, g->ev[g->n_ev]) != cudaSuccess) {
			cudaEventDestroy(g->ev[g->n_ev]);
			snprintf(err, errlen, "cudaIpcGetEventHandle failed");
			return PDX_EIO;
		}
		memcpy(g->handles[g->n_ev], &h, sizeof(h));
	}
	g->events = (struct pdx_engine_cuda_events){
	    .handles = (const uint8_t(*)[PDX_CUDA_IPC_BYTES])g->handles,
	    .slots = EVENT_SLOTS,
	};
fail:
	return st;
}

pdx_status_t pdx__kv_mem_cuda_new(const struct pdx_kv_pool_params *p,
				  struct pdx__kv_mem **out, char *err,
				  size_t errlen)
{
	struct kv_mem_cuda *g;
	cudaIpcMemHandle_t mh;
	uint64_t size;
	pdx_status_t st;

	st = find_device(p->cuda_device, err, errlen);
	if (st != PDX_OK)
		return st;
	g = calloc(1, sizeof(*g));
	if (!g) {
		snprintf(err, errlen, "out of memory");
		return PDX_ENOMEM;
	}
	g->device = p->cuda_device;
	st = pdx_shm_pool_layout(p->model, p->blocks, &g->layout, &size, err,
				 errlen);
	if (st != PDX_OK)
		goto fail;
	if (pdx_synth_layout_check(&g->layout) != PDX_OK) {
		snprintf(err, errlen,
			 "model %s: a shape the synthetic model cannot fill",
			 p->model->name);
		st = PDX_EINVAL;
		goto fail;
	}
	CUDA_OR_FAIL(cudaMalloc((void **)&g->base, size), "cudaMalloc");
	CUDA_OR_FAIL(
	    cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking),
	    "cudaStreamCreate");
	g->has_stream = true;
	/* zeroes, as the shm pool starts: unwritten KV never matches */
	CUDA_OR_FAIL(cudaMemsetAsync(g->base, 0, size, g->stream),
		     "cudaMemsetAsync");
	CUDA_OR_FAIL(cudaIpcGetMemHandle(&mh, g->base), "cudaIpcGetMemHandle");
	st = make_events(g, err, errlen);
	if (st != PDX_OK)
		goto fail;
	st = pdx_synth_cuda_new(&g->layout, g->base, g->stream, &g->synth);
	if (st != PDX_OK) {
		snprintf(err, errlen, "synthetic model on the GPU: %s",
			 pdx_status_str(st));
		goto fail;
	}
	CUDA_OR_FAIL(cudaStreamSynchronize(g->stream), "zeroing the pool");
	g->region = (struct pdx_engine_region){
	    .type = PDX_MEM_CUDA,
	    .size = size,
	    .cuda_device = g->device,
	};
	memcpy(g->region.cuda_ipc, &mh, sizeof(mh));
	g->m = (struct pdx__kv_mem){
	    .ops = &cuda_ops,
	    .layout = &g->layout,
	    .region = &g->region,
	    .events = &g->events,
	    .size = size,
	};
	snprintf(g->m.where, sizeof(g->m.where), "cuda:%d", g->device);
	*out = &g->m;
	return PDX_OK;
fail:
	cuda_free(&g->m);
	return st;
}
