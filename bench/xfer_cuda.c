/* pdx-xferbench's GPU pools, pattern and yardsticks (bench/xfer_cuda.h)
 * with the CUDA runtime. Plain C: the kernels come from kernels/. */
#include "bench/xfer_cuda.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "kernels/kv_kernels.h"

_Static_assert(sizeof(cudaIpcMemHandle_t) == PDX_CUDA_IPC_BYTES,
	       "cudaIpcMemHandle_t is not PDX_CUDA_IPC_BYTES");
_Static_assert(sizeof(cudaIpcEventHandle_t) == PDX_CUDA_IPC_BYTES,
	       "cudaIpcEventHandle_t is not PDX_CUDA_IPC_BYTES");

struct xb_cuda_pool {
	int dev;
	char name[256];
	uint8_t *base; /* the pool, one cudaMalloc */
	uint64_t size;
	uint64_t block_bytes;
	struct pdx_kv_layout layout; /* layer[] owned */
	struct pdx_engine_region region;
	cudaStream_t stream; /* "compute": fills, records, checks */
	cudaEvent_t *events; /* slots * layers, n_events made */
	uint32_t n_events;
	uint8_t (*handles)[PDX_CUDA_IPC_BYTES];
	struct pdx_engine_cuda_events ev;
	/* verification scratch, made on first use */
	uint8_t *staging; /* device: a transfer in staging order */
	uint64_t staging_blocks;
	uint8_t *expect;      /* device: one layer of a pool */
	uint64_t *got, *want; /* host: staging_blocks hashes each */
};

static int cuda_fail(cudaError_t e, const char *what, char *err, size_t errlen)
{
	snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
	return -1;
}

static int kernel_fail(pdx_status_t st, const char *what, uint32_t layer,
		       char *err, size_t errlen)
{
	snprintf(err, errlen, "%s (layer %u): %s", what, layer,
		 pdx_status_str(st));
	return -1;
}

/* Each layer gets its own seed so that one fill kernel per layer (through
 * a one-layer view, where the kernel sees layer 0) still gives every layer
 * different bytes. */
static uint64_t layer_seed(uint64_t seed, uint32_t layer)
{
	return pdx_kv_mix64(seed ^ pdx_kv_mix64(layer));
}

/* Layer `layer` of p's layout as a layout of its own. */
static void layer_view(const struct xb_cuda_pool *p, uint32_t layer,
		       struct pdx_kv_layout *v)
{
	*v = p->layout;
	v->layers = 1;
	v->layer = &p->layout.layer[layer];
}

int xb_cuda_probe(int dev, char *err, size_t errlen)
{
	cudaError_t e;
	int n = 0;

	e = cudaGetDeviceCount(&n);
	/* with an NVIDIA driver loaded, a failure here (a driver older than
	 * this runtime says cudaErrorInsufficientDriver, as no driver at all
	 * does) is an error, not "no device": the gpu tests would skip */
	if (e != cudaSuccess && e != cudaErrorNoDevice &&
	    access("/proc/driver/nvidia/version", F_OK) == 0) {
		snprintf(err, errlen, "an NVIDIA driver is loaded, but CUDA "
			 "finds no device: %s", cudaGetErrorString(e));
		return -1;
	}
	if (e != cudaSuccess || n == 0) {
		snprintf(err, errlen, "no CUDA device (%s)",
			 e != cudaSuccess ? cudaGetErrorString(e)
					  : "none found");
		return XB_CUDA_SKIP;
	}
	if (dev < 0 || dev >= n) {
		snprintf(err, errlen, "no CUDA device %d (this machine has %d)",
			 dev, n);
		return XB_CUDA_SKIP;
	}
	/* cudaFree(NULL) makes the context: fails where using it would */
	e = cudaSetDevice(dev);
	if (e == cudaSuccess)
		e = cudaFree(NULL);
	if (e != cudaSuccess) {
		snprintf(err, errlen, "CUDA device %d: %s", dev,
			 cudaGetErrorString(e));
		return -1;
	}
	return 0;
}

/* Layer-major as common/shm_pool.c lays out its pool: tensor t of layer l
 * at (tensors * l + t) * blocks * block_bytes. */
static int layout_make(struct xb_cuda_pool *p, const struct pdx_model *m,
		       uint32_t blocks, char *err, size_t errlen)
{
	uint64_t bb = (uint64_t)m->block_tokens * m->kv_heads * m->head_dim *
		      m->dtype_bytes;

	if (bb == 0 || bb % 8 || blocks == 0) {
		snprintf(err, errlen,
			 "block bytes %" PRIu64
			 " (not a multiple of 8) or %u blocks",
			 bb, blocks);
		return -1;
	}
	p->layout.layer = calloc(m->layers, sizeof(*p->layout.layer));
	if (!p->layout.layer) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	for (uint32_t l = 0; l < m->layers; l++) {
		for (uint32_t t = 0; t < m->tensors; t++)
			p->layout.layer[l].base[t].offset =
			    ((uint64_t)m->tensors * l + t) * blocks * bb;
		p->layout.layer[l].block_stride = bb;
	}
	p->layout.layers = m->layers;
	p->layout.tensors = m->tensors;
	p->layout.blocks = blocks;
	p->layout.block_tokens = m->block_tokens;
	p->layout.kv_heads = m->kv_heads;
	p->layout.head_dim = m->head_dim;
	p->layout.dtype_bytes = m->dtype_bytes;
	p->layout.order = PDX_KV_NHD;
	p->block_bytes = bb;
	p->size = bb * blocks * m->tensors * m->layers;
	return 0;
}

static int events_make(struct xb_cuda_pool *p, uint32_t slots, char *err,
		       size_t errlen)
{
	uint32_t n = slots * p->layout.layers;
	cudaError_t e;

	p->events = calloc(n, sizeof(*p->events));
	p->handles = calloc(n, sizeof(*p->handles));
	if (!p->events || !p->handles) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	for (uint32_t i = 0; i < n; i++) {
		cudaIpcEventHandle_t h;

		e = cudaEventCreateWithFlags(&p->events[i],
					     cudaEventInterprocess |
						 cudaEventDisableTiming);
		if (e != cudaSuccess)
			return cuda_fail(e, "cudaEventCreateWithFlags", err,
					 errlen);
		p->n_events++;
		e = cudaIpcGetEventHandle(&h, p->events[i]);
		if (e != cudaSuccess)
			return cuda_fail(e, "cudaIpcGetEventHandle", err,
					 errlen);
		memcpy(p->handles[i], &h, sizeof(h));
	}
	p->ev.handles = (const uint8_t(*)[PDX_CUDA_IPC_BYTES])p->handles;
	p->ev.slots = slots;
	return 0;
}

static int memory_make(struct xb_cuda_pool *p, char *err, size_t errlen)
{
	cudaIpcMemHandle_t h;
	cudaError_t e;

	e = cudaMalloc((void **)&p->base, p->size);
	if (e != cudaSuccess) {
		p->base = NULL;
		snprintf(err, errlen, "cudaMalloc of %" PRIu64 " bytes: %s",
			 p->size, cudaGetErrorString(e));
		return -1;
	}
	e = cudaMemset(p->base, 0, p->size);
	if (e != cudaSuccess)
		return cuda_fail(e, "cudaMemset", err, errlen);
	e = cudaIpcGetMemHandle(&h, p->base);
	if (e != cudaSuccess)
		return cuda_fail(e, "cudaIpcGetMemHandle", err, errlen);
	p->region.type = PDX_MEM_CUDA;
	p->region.size = p->size;
	p->region.cuda_device = p->dev;
	memcpy(p->region.cuda_ipc, &h, sizeof(h));
	return 0;
}

int xb_cuda_pool_new(int dev, const struct pdx_model *m, uint32_t blocks,
		     uint32_t event_slots, struct xb_cuda_pool **out, char *err,
		     size_t errlen)
{
	struct xb_cuda_pool *p = calloc(1, sizeof(*p));
	struct cudaDeviceProp prop;
	cudaError_t e;

	if (!p) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	p->dev = dev;
	if (layout_make(p, m, blocks, err, errlen))
		goto fail;
	e = cudaSetDevice(dev);
	if (e != cudaSuccess) {
		cuda_fail(e, "cudaSetDevice", err, errlen);
		goto fail;
	}
	if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
		snprintf(p->name, sizeof(p->name), "%s", prop.name);
	if (memory_make(p, err, errlen))
		goto fail;
	e = cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking);
	if (e != cudaSuccess) {
		p->stream = NULL;
		cuda_fail(e, "cudaStreamCreateWithFlags", err, errlen);
		goto fail;
	}
	if (event_slots && events_make(p, event_slots, err, errlen))
		goto fail;
	/* the zeroed pool is what the agent may read first */
	e = cudaDeviceSynchronize();
	if (e != cudaSuccess) {
		cuda_fail(e, "cudaDeviceSynchronize", err, errlen);
		goto fail;
	}
	*out = p;
	return 0;
fail:
	xb_cuda_pool_free(p);
	return -1;
}

void xb_cuda_pool_free(struct xb_cuda_pool *p)
{
	if (!p)
		return;
	for (uint32_t i = 0; i < p->n_events; i++)
		cudaEventDestroy(p->events[i]);
	if (p->stream)
		cudaStreamDestroy(p->stream);
	cudaFree(p->base);
	cudaFree(p->staging);
	cudaFree(p->expect);
	free(p->events);
	free(p->handles);
	free(p->got);
	free(p->want);
	free(p->layout.layer);
	free(p);
}

const struct pdx_kv_layout *xb_cuda_pool_layout(const struct xb_cuda_pool *p)
{
	return &p->layout;
}

const struct pdx_engine_region *
xb_cuda_pool_region(const struct xb_cuda_pool *p)
{
	return &p->region;
}

const struct pdx_engine_cuda_events *
xb_cuda_pool_events(const struct xb_cuda_pool *p)
{
	return p->ev.slots ? &p->ev : NULL;
}

const char *xb_cuda_pool_device(const struct xb_cuda_pool *p)
{
	return p->name;
}

int xb_cuda_fill_layer(struct xb_cuda_pool *p, uint32_t layer, uint64_t seed,
		       const uint32_t *blocks, size_t n, size_t first,
		       char *err, size_t errlen)
{
	struct pdx_kv_layout v;
	uint8_t *base = p->base;
	struct pdx_kv_region kv = {.layout = &v, .base = &base, .n_regions = 1};
	pdx_status_t st;

	if (first >= n)
		return 0;
	layer_view(p, layer, &v);
	st = pdx_kv_fill_cuda(&kv, blocks + first, (uint32_t)(n - first),
			      layer_seed(seed, layer), p->stream);
	return st == PDX_OK ? 0 : kernel_fail(st, "fill", layer, err, errlen);
}

int xb_cuda_record(struct xb_cuda_pool *p, uint32_t slot, uint32_t layer,
		   char *err, size_t errlen)
{
	uint64_t i = (uint64_t)slot * p->layout.layers + layer;
	cudaError_t e;

	if (i >= p->n_events) {
		snprintf(err, errlen, "no event for slot %u layer %u", slot,
			 layer);
		return -1;
	}
	e = cudaEventRecord(p->events[i], p->stream);
	return e == cudaSuccess ? 0
				: cuda_fail(e, "cudaEventRecord", err, errlen);
}

int xb_cuda_sync(struct xb_cuda_pool *p, char *err, size_t errlen)
{
	cudaError_t e = cudaStreamSynchronize(p->stream);

	return e == cudaSuccess
		   ? 0
		   : cuda_fail(e, "cudaStreamSynchronize", err, errlen);
}

static int whole_copy(struct xb_cuda_pool *p, void *dst, const void *src,
		      size_t size, enum cudaMemcpyKind kind, char *err,
		      size_t errlen)
{
	cudaError_t e;

	if (size != p->size) {
		snprintf(err, errlen, "a host image of %zu bytes for a pool of "
			 "%llu", size, (unsigned long long)p->size);
		return -1;
	}
	e = cudaMemcpyAsync(dst, src, size, kind, p->stream);
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(p->stream);
	return e == cudaSuccess ? 0 : cuda_fail(e, "cudaMemcpy", err, errlen);
}

int xb_cuda_upload(struct xb_cuda_pool *p, const void *host, size_t size,
		   char *err, size_t errlen)
{
	return whole_copy(p, p->base, host, size, cudaMemcpyHostToDevice, err,
			  errlen);
}

int xb_cuda_download(struct xb_cuda_pool *p, void *host, size_t size,
		     char *err, size_t errlen)
{
	return whole_copy(p, host, p->base, size, cudaMemcpyDeviceToHost, err,
			  errlen);
}

int xb_cuda_upload_layer(struct xb_cuda_pool *p, const void *host,
			 uint32_t layer, const uint32_t *blocks, size_t n,
			 size_t first, char *err, size_t errlen)
{
	const struct pdx_kv_layer *ly = &p->layout.layer[layer];

	for (size_t i = first; i < n; i++)
		for (uint32_t t = 0; t < p->layout.tensors; t++) {
			uint64_t off = ly->base[t].offset +
				       (uint64_t)blocks[i] * ly->block_stride;
			cudaError_t e;

			if (off + p->block_bytes > p->size) {
				snprintf(err, errlen, "block %u of layer %u "
					 "past the pool", blocks[i], layer);
				return -1;
			}
			e = cudaMemcpyAsync(p->base + off,
					    (const uint8_t *)host + off,
					    p->block_bytes,
					    cudaMemcpyHostToDevice, p->stream);
			if (e != cudaSuccess)
				return cuda_fail(e, "cudaMemcpyAsync (layer)",
						 err, errlen);
		}
	return 0;
}

/* Room for a transfer of `segs` staging blocks, and one layer of a pool to
 * build the expected bytes in. */
static int scratch_make(struct xb_cuda_pool *p, uint64_t segs, char *err,
			size_t errlen)
{
	uint64_t bb = p->block_bytes;
	cudaError_t e;

	if (!p->expect) {
		e = cudaMalloc((void **)&p->expect,
			       bb * p->layout.tensors * p->layout.blocks);
		if (e != cudaSuccess) {
			p->expect = NULL;
			return cuda_fail(e, "cudaMalloc (expected layer)", err,
					 errlen);
		}
	}
	if (segs <= p->staging_blocks)
		return 0;
	cudaFree(p->staging);
	free(p->got);
	free(p->want);
	p->staging_blocks = 0;
	p->got = malloc(segs * sizeof(*p->got));
	p->want = malloc(segs * sizeof(*p->want));
	e = cudaMalloc((void **)&p->staging, segs * bb);
	if (e != cudaSuccess)
		p->staging = NULL;
	if (!p->got || !p->want || !p->staging) {
		snprintf(err, errlen,
			 "no memory for %" PRIu64 " staging blocks%s%s", segs,
			 e != cudaSuccess ? ": " : "",
			 e != cudaSuccess ? cudaGetErrorString(e) : "");
		return -1;
	}
	p->staging_blocks = segs;
	return 0;
}

/* Staging block s differs: find its first differing word, as pb_verify()
 * reports one. */
static int describe(struct xb_cuda_pool *p, uint64_t s, const uint32_t *dst,
		    uint32_t m, size_t first, char *err, size_t errlen)
{
	uint64_t bb = p->block_bytes, lt = s / m;
	uint32_t l = (uint32_t)(lt / p->layout.tensors);
	uint32_t t = (uint32_t)(lt % p->layout.tensors);
	size_t i = first + s % m;
	const struct pdx_kv_layer *ly = &p->layout.layer[l];
	const uint8_t *got_dev =
	    p->base + ly->base[t].offset + (uint64_t)dst[i] * ly->block_stride;
	uint64_t *got = malloc(bb), *want = malloc(bb);
	cudaError_t e = cudaErrorMemoryAllocation;
	int rc = -1;

	if (got && want)
		e = cudaMemcpy(got, got_dev, bb, cudaMemcpyDeviceToHost);
	if (e == cudaSuccess)
		e = cudaMemcpy(want, p->staging + s * bb, bb,
			       cudaMemcpyDeviceToHost);
	if (e != cudaSuccess) {
		cuda_fail(e, "reading a differing block", err, errlen);
		goto out;
	}
	rc = 1;
	for (uint64_t k = 0; k < bb / 8; k++) {
		if (got[k] == want[k])
			continue;
		snprintf(err, errlen,
			 "layer %u tensor %u token-block %zu (pool block %u) "
			 "byte offset %" PRIu64 ": got 0x%016" PRIx64
			 " want 0x%016" PRIx64,
			 l, t, i, dst[i], k * 8, got[k], want[k]);
		goto out;
	}
	snprintf(err, errlen,
		 "layer %u tensor %u token-block %zu (pool block %u): hash "
		 "differs, bytes now match (written while checked?)",
		 l, t, i, dst[i]);
out:
	free(got);
	free(want);
	return rc;
}

/* Hashes of what arrived (dst gathered) against hashes of what the sender
 * wrote (its pattern filled, layer by layer, into a one-layer pool at the
 * sender's block ids and gathered with them): every byte counts in a
 * block's hash, and both run on the GPU. */
int xb_cuda_verify(struct xb_cuda_pool *p, uint64_t seed, const uint32_t *src,
		   const uint32_t *dst, size_t n, size_t first, char *err,
		   size_t errlen)
{
	uint8_t *base = p->base, *ebase;
	struct pdx_kv_region kv = {
	    .layout = &p->layout, .base = &base, .n_regions = 1};
	struct pdx_kv_layout ev;
	struct pdx_kv_region ekv = {
	    .layout = &ev, .base = &ebase, .n_regions = 1};
	uint32_t m = (uint32_t)(n - first);
	uint64_t per_layer, segs, bb = p->block_bytes;
	pdx_status_t st;

	if (first >= n)
		return 0;
	per_layer = (uint64_t)p->layout.tensors * m;
	segs = per_layer * p->layout.layers;
	if (scratch_make(p, segs, err, errlen))
		return -1;
	st = pdx_kv_gather_cuda(&kv, dst + first, m, p->staging, p->stream);
	if (st == PDX_OK)
		st = pdx_kv_buf_hashes_cuda(p->staging, bb, segs, p->got,
					    p->stream);
	if (st != PDX_OK)
		return kernel_fail(st, "gather and hash what arrived", 0, err,
				   errlen);
	/* the expected layer pool has layer 0's shape at its own base */
	layer_view(p, 0, &ev);
	ebase = p->expect;
	for (uint32_t l = 0; l < p->layout.layers; l++) {
		st = pdx_kv_fill_cuda(&ekv, src + first, m, layer_seed(seed, l),
				      p->stream);
		if (st == PDX_OK)
			st = pdx_kv_gather_cuda(&ekv, src + first, m,
						p->staging + l * per_layer * bb,
						p->stream);
		if (st != PDX_OK)
			return kernel_fail(st, "expected bytes", l, err,
					   errlen);
	}
	st = pdx_kv_buf_hashes_cuda(p->staging, bb, segs, p->want, p->stream);
	if (st != PDX_OK)
		return kernel_fail(st, "hash the expected bytes", 0, err,
				   errlen);
	for (uint64_t s = 0; s < segs; s++)
		if (p->got[s] != p->want[s])
			return describe(p, s, dst, m, first, err, errlen);
	return 0;
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return x < y ? -1 : x > y;
}

/* reps timed copies after two untimed ones, on the compute stream; the
 * median rate. */
static int time_copies(struct xb_cuda_pool *p, void *dst, const void *src,
		       uint64_t bytes, enum cudaMemcpyKind kind, uint32_t reps,
		       cudaEvent_t a, cudaEvent_t b, double *gbps, char *err,
		       size_t errlen)
{
	float *ms = calloc(reps, sizeof(*ms)), med;
	cudaError_t e = cudaSuccess;

	if (!ms) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	for (uint32_t i = 0; i < reps + 2 && e == cudaSuccess; i++) {
		float t = 0;

		e = cudaEventRecord(a, p->stream);
		if (e == cudaSuccess)
			e = cudaMemcpyAsync(dst, src, bytes, kind, p->stream);
		if (e == cudaSuccess)
			e = cudaEventRecord(b, p->stream);
		if (e == cudaSuccess)
			e = cudaEventSynchronize(b);
		if (e == cudaSuccess)
			e = cudaEventElapsedTime(&t, a, b);
		if (i >= 2)
			ms[i - 2] = t;
	}
	if (e != cudaSuccess) {
		free(ms);
		return cuda_fail(e,
				 kind == cudaMemcpyDeviceToDevice
				     ? "device-to-device copy"
				     : "device-to-host copy",
				 err, errlen);
	}
	qsort(ms, reps, sizeof(*ms), cmp_float);
	med = reps % 2 ? ms[reps / 2] : (ms[reps / 2 - 1] + ms[reps / 2]) / 2;
	*gbps = med > 0 ? (double)bytes / (med * 1e-3) / 1e9 : 0;
	free(ms);
	return 0;
}

int xb_cuda_yardsticks(struct xb_cuda_pool *p, uint64_t bytes, uint32_t reps,
		       double *d2d_gbps, double *d2h_gbps, char *err,
		       size_t errlen)
{
	cudaEvent_t a = NULL, b = NULL;
	void *dev = NULL, *host = NULL;
	cudaError_t e;
	int rc = -1;

	if (bytes > p->size)
		bytes = p->size;
	if (!bytes || !reps) {
		snprintf(err, errlen,
			 "yardsticks of %" PRIu64 " bytes, %u reps", bytes,
			 reps);
		return -1;
	}
	e = cudaMalloc(&dev, bytes);
	if (e != cudaSuccess) {
		dev = NULL;
		cuda_fail(e, "cudaMalloc (d2d yardstick)", err, errlen);
		goto out;
	}
	e = cudaMallocHost(&host, bytes);
	if (e != cudaSuccess) {
		host = NULL;
		cuda_fail(e, "cudaMallocHost (d2h yardstick)", err, errlen);
		goto out;
	}
	e = cudaEventCreate(&a);
	if (e == cudaSuccess)
		e = cudaEventCreate(&b);
	if (e != cudaSuccess) {
		cuda_fail(e, "cudaEventCreate", err, errlen);
		goto out;
	}
	if (time_copies(p, dev, p->base, bytes, cudaMemcpyDeviceToDevice, reps,
			a, b, d2d_gbps, err, errlen) ||
	    time_copies(p, host, p->base, bytes, cudaMemcpyDeviceToHost, reps,
			a, b, d2h_gbps, err, errlen))
		goto out;
	rc = 0;
out:
	if (a)
		cudaEventDestroy(a);
	if (b)
		cudaEventDestroy(b);
	cudaFreeHost(host);
	cudaFree(dev);
	return rc;
}
