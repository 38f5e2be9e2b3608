/* A GPU engine's CUDA side (include/pdx/engine.h): the region that holds
 * a device pointer, and "layer computed" events that libpdx makes and
 * records on the engine's own streams. This file knows the driver, not
 * the agent: cuda_streams.c registers the events and says layer_done.
 *
 * The driver API is loaded with dlopen at the first call that needs it,
 * resolving only the functions used here: libpdx has no link-time CUDA
 * dependency, and an engine that never calls these never loads CUDA. The
 * driver, once loaded, stays (events made here live in its contexts).
 *
 * Regions are shared by legacy CUDA IPC, which the agent opens
 * (agent/gpu_cuda.c): one handle per allocation, so a tensor inside a
 * larger allocation is named by the allocation's handle and its offset.
 * What legacy IPC cannot share is refused here, naming what it is,
 * rather than failing later in the agent with a bare CUDA error.
 */
#define PDX_LOG_TOPIC "engine"

#include "lib/client.h"
#include "lib/cuda_drv.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
	pdx_cu_result (*init)(unsigned int flags);
	pdx_cu_result (*get_error_name)(pdx_cu_result r, const char **s);
	pdx_cu_result (*get_error_string)(pdx_cu_result r, const char **s);
	pdx_cu_result (*pointer_get_attribute)(void *data, int attr,
					       pdx_cu_ptr p);
	pdx_cu_result (*mem_retain_allocation_handle)(pdx_cu_mem_handle *h,
						      void *p);
	pdx_cu_result (*mem_release)(pdx_cu_mem_handle h);
	pdx_cu_result (*ipc_get_mem_handle)(struct pdx_cu_ipc *h, pdx_cu_ptr p);
	pdx_cu_result (*device_get)(pdx_cu_device *d, int ordinal);
	pdx_cu_result (*primary_ctx_retain)(pdx_cu_context *c, pdx_cu_device d);
	pdx_cu_result (*primary_ctx_release)(pdx_cu_device d);
	pdx_cu_result (*ctx_push)(pdx_cu_context c);
	pdx_cu_result (*ctx_pop)(pdx_cu_context *c);
	pdx_cu_result (*event_create)(pdx_cu_event *ev, unsigned int flags);
	pdx_cu_result (*event_destroy)(pdx_cu_event ev);
	pdx_cu_result (*ipc_get_event_handle)(struct pdx_cu_ipc *h,
					      pdx_cu_event ev);
	pdx_cu_result (*event_record)(pdx_cu_event ev, pdx_cu_stream s);
} cu;

/* The versioned names are the ones cuda.h's macros pick (CUDA 11+). */
static const struct {
	void **fn;
	const char *name;
} cu_syms[] = {
	{(void **)&cu.init, "cuInit"},
	{(void **)&cu.get_error_name, "cuGetErrorName"},
	{(void **)&cu.get_error_string, "cuGetErrorString"},
	{(void **)&cu.pointer_get_attribute, "cuPointerGetAttribute"},
	{(void **)&cu.mem_retain_allocation_handle,
	 "cuMemRetainAllocationHandle"},
	{(void **)&cu.mem_release, "cuMemRelease"},
	{(void **)&cu.ipc_get_mem_handle, "cuIpcGetMemHandle"},
	{(void **)&cu.device_get, "cuDeviceGet"},
	{(void **)&cu.primary_ctx_retain, "cuDevicePrimaryCtxRetain"},
	{(void **)&cu.primary_ctx_release, "cuDevicePrimaryCtxRelease_v2"},
	{(void **)&cu.ctx_push, "cuCtxPushCurrent_v2"},
	{(void **)&cu.ctx_pop, "cuCtxPopCurrent_v2"},
	{(void **)&cu.event_create, "cuEventCreate"},
	{(void **)&cu.event_destroy, "cuEventDestroy_v2"},
	{(void **)&cu.ipc_get_event_handle, "cuIpcGetEventHandle"},
	{(void **)&cu.event_record, "cuEventRecord"},
};

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static char cu_unusable[384]; /* why the driver cannot be used; "" if it can */

/* The events of pdx_engine_register_cuda_streams(). */
struct pdx__cuda {
	pdx_cu_device dev;
	pdx_cu_context ctx; /* the device's primary context, retained */
	pdx_cu_event *ev;   /* slots x layers, slot-major */
	uint8_t (*handles)[PDX_CUDA_IPC_BYTES];
	uint32_t slots;
	uint32_t layers;
	uint32_t slot;      /* the current forward pass's */
	int64_t last;       /* the last layer recorded; -1: none yet */
};

/* Writes the reason to why (why_len bytes; NULL: nowhere), returns st. */
static pdx_status_t say(char *why, size_t why_len, pdx_status_t st,
			const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static pdx_status_t say(char *why, size_t why_len, pdx_status_t st,
			const char *fmt, ...)
{
	va_list ap;

	if (!why || !why_len)
		return st;
	va_start(ap, fmt);
	vsnprintf(why, why_len, fmt, ap);
	va_end(ap);
	return st;
}

/* "what: CUDA_ERROR_NAME (its description)"; PDX_EIO. */
static pdx_status_t cu_fail(char *why, size_t why_len, const char *what,
			    pdx_cu_result r)
{
	const char *name = NULL, *str = NULL;

	/* a stub or broken driver may answer neither */
	if (cu.get_error_name(r, &name) != PDX_CUDA_SUCCESS)
		name = NULL;
	if (cu.get_error_string(r, &str) != PDX_CUDA_SUCCESS)
		str = NULL;
	if (name)
		return say(why, why_len, PDX_EIO, "%s: %s (%s)", what, name,
			   str ? str : "no description");
	if (r == PDX_CUDA_ERROR_STUB_LIBRARY)
		return say(why, why_len, PDX_EIO,
			   "%s: CUDA_ERROR_STUB_LIBRARY (libcuda.so.1 is the "
			   "toolkit's stub: no real CUDA driver is installed)",
			   what);
	return say(why, why_len, PDX_EIO, "%s: CUDA error %d", what, r);
}

static void cu_load(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	pdx_cu_result r;

	if (!h) {
		snprintf(cu_unusable, sizeof(cu_unusable),
			 "no CUDA driver: %s", dlerror());
		return;
	}
	for (size_t i = 0; i < sizeof(cu_syms) / sizeof(cu_syms[0]); i++) {
		*cu_syms[i].fn = dlsym(h, cu_syms[i].name);
		if (!*cu_syms[i].fn) {
			snprintf(cu_unusable, sizeof(cu_unusable),
				 "the CUDA driver (libcuda.so.1) has no %s: "
				 "older than CUDA 11?",
				 cu_syms[i].name);
			return;
		}
	}
	r = cu.init(0);
	if (r != PDX_CUDA_SUCCESS)
		cu_fail(cu_unusable, sizeof(cu_unusable), "cuInit", r);
}

/* Loads and initializes the driver once; false (why said) when unusable. */
static bool cu_ready(char *why, size_t why_len)
{
	pthread_once(&cu_once, cu_load);
	if (!cu_unusable[0])
		return true;
	say(why, why_len, PDX_EIO, "%s", cu_unusable);
	return false;
}

/* Reads a pointer attribute into a zeroed u64: each one this file reads
 * is an int, a bool, a pointer or a size, which sit in its low bytes on
 * the little-endian machines CUDA runs on. */
static pdx_cu_result attr(int which, pdx_cu_ptr p, uint64_t *v)
{
	*v = 0;
	return cu.pointer_get_attribute(v, which, p);
}

pdx_status_t pdx_engine_cuda_region(const void *ptr, uint64_t size,
				    struct pdx_engine_region *out,
				    uint64_t *offset, char *why, size_t why_len)
{
	pdx_cu_ptr p = (pdx_cu_ptr)(uintptr_t)ptr;
	uint64_t type, managed, legacy, ordinal, ctx, start, range;
	pdx_cu_mem_handle mh;
	pdx_cu_context popped;
	struct pdx_cu_ipc ipc;
	pdx_cu_result r;

	if (!ptr || !size || !out || !offset)
		return say(why, why_len, PDX_EINVAL,
			   "cuda_region: needs a device pointer, a size, and "
			   "where to write the region and offset");
	if (!cu_ready(why, why_len))
		return PDX_EIO;
	r = attr(PDX_CU_POINTER_MEMORY_TYPE, p, &type);
	if (r == PDX_CUDA_ERROR_INVALID_VALUE)
		return say(why, why_len, PDX_EINVAL,
			   "%p: not memory CUDA knows (plain host memory?)",
			   ptr);
	if (r != PDX_CUDA_SUCCESS)
		return cu_fail(why, why_len, "cuPointerGetAttribute", r);
	if (attr(PDX_CU_POINTER_IS_MANAGED, p, &managed) == PDX_CUDA_SUCCESS &&
	    managed)
		return say(why, why_len, PDX_EINVAL,
			   "%p: managed memory (cudaMallocManaged), which "
			   "CUDA IPC cannot share",
			   ptr);
	if (type == PDX_CU_MEMORYTYPE_HOST)
		return say(why, why_len, PDX_EINVAL,
			   "%p: pinned host memory (cudaMallocHost, "
			   "cudaHostRegister), not device memory: host KV is "
			   "registered as POSIX shared memory (PDX_MEM_SHM)",
			   ptr);
	if (type != PDX_CU_MEMORYTYPE_DEVICE)
		return say(why, why_len, PDX_EINVAL,
			   "%p: CUDA memory of type %llu, not device memory",
			   ptr, (unsigned long long)type);
	/* only memory mapped through the virtual memory management API has
	 * an allocation handle to retain */
	if (cu.mem_retain_allocation_handle(&mh, (void *)(uintptr_t)p) ==
	    PDX_CUDA_SUCCESS) {
		cu.mem_release(mh);
		return say(why, why_len, PDX_EINVAL,
			   "%p: virtual-memory-managed memory (cuMemCreate + "
			   "cuMemMap: vLLM's sleep mode, PyTorch's "
			   "expandable_segments), which legacy CUDA IPC "
			   "cannot share; it would take a POSIX "
			   "file-descriptor shareable handle, which pdx does "
			   "not support yet",
			   ptr);
	}
	if (attr(PDX_CU_POINTER_IS_LEGACY_CUDA_IPC_CAPABLE, p, &legacy) ==
		PDX_CUDA_SUCCESS &&
	    !legacy)
		return say(why, why_len, PDX_EINVAL,
			   "%p: device memory legacy CUDA IPC cannot share "
			   "(a stream-ordered pool's, cudaMallocAsync?)",
			   ptr);
	if ((r = attr(PDX_CU_POINTER_DEVICE_ORDINAL, p, &ordinal)) ||
	    (r = attr(PDX_CU_POINTER_CONTEXT, p, &ctx)) ||
	    (r = attr(PDX_CU_POINTER_RANGE_START_ADDR, p, &start)) ||
	    (r = attr(PDX_CU_POINTER_RANGE_SIZE, p, &range)))
		return cu_fail(why, why_len, "cuPointerGetAttribute", r);
	if (p < start || p - start > range || size > range - (p - start))
		return say(why, why_len, PDX_ERANGE,
			   "%p + %llu bytes runs past its allocation (%#llx, "
			   "%llu bytes)",
			   ptr, (unsigned long long)size,
			   (unsigned long long)start,
			   (unsigned long long)range);
	/* the handle is asked in the allocation's own context */
	if (ctx && (r = cu.ctx_push((pdx_cu_context)(uintptr_t)ctx)))
		return cu_fail(why, why_len, "cuCtxPushCurrent", r);
	r = cu.ipc_get_mem_handle(&ipc, start);
	if (ctx)
		cu.ctx_pop(&popped);
	if (r != PDX_CUDA_SUCCESS)
		return cu_fail(why, why_len, "cuIpcGetMemHandle", r);
	memset(out, 0, sizeof(*out));
	out->type = PDX_MEM_CUDA;
	out->size = range;
	out->cuda_device = (int)ordinal;
	memcpy(out->cuda_ipc, ipc.reserved, PDX_CUDA_IPC_BYTES);
	*offset = p - start;
	return PDX_OK;
}

void pdx__cuda_free(struct pdx__cuda *c)
{
	pdx_cu_context popped;

	if (!c)
		return;
	if (c->ctx) {
		if (cu.ctx_push(c->ctx) == PDX_CUDA_SUCCESS) {
			for (uint64_t i = 0;
			     c->ev && i < (uint64_t)c->slots * c->layers; i++)
				if (c->ev[i])
					cu.event_destroy(c->ev[i]);
			cu.ctx_pop(&popped);
		}
		cu.primary_ctx_release(c->dev);
	}
	free(c->ev);
	free(c->handles);
	free(c);
}

/* slots x layers interprocess events in the primary context of device
 * ordinal, with their handles (the driver loaded first, when it is not). */
pdx_status_t pdx__cuda_events_new(struct pdx_engine *e, int ordinal,
				  uint32_t slots, uint32_t layers,
				  struct pdx__cuda **out)
{
	uint64_t n = (uint64_t)slots * layers;
	pdx_cu_context popped;
	struct pdx__cuda *c;
	pdx_cu_result r;
	pdx_status_t st = PDX_OK;

	if (!cu_ready(e->why, sizeof(e->why)))
		return PDX_EIO;
	c = calloc(1, sizeof(*c));
	if (c) {
		c->ev = calloc(n, sizeof(*c->ev));
		c->handles = calloc(n, sizeof(*c->handles));
	}
	if (!c || !c->ev || !c->handles) {
		pdx__cuda_free(c);
		return pdx__fail(e, PDX_ENOMEM, "no memory for %llu events",
				 (unsigned long long)n);
	}
	c->slots = slots;
	c->layers = layers;
	c->last = -1;
	if ((r = cu.device_get(&c->dev, ordinal))) {
		st = cu_fail(e->why, sizeof(e->why), "cuDeviceGet", r);
	} else if ((r = cu.primary_ctx_retain(&c->ctx, c->dev))) {
		c->ctx = NULL;
		st = cu_fail(e->why, sizeof(e->why), "cuDevicePrimaryCtxRetain",
			     r);
	} else if ((r = cu.ctx_push(c->ctx))) {
		st = cu_fail(e->why, sizeof(e->why), "cuCtxPushCurrent", r);
	} else {
		for (uint64_t i = 0; i < n && st == PDX_OK; i++) {
			if ((r = cu.event_create(
				 &c->ev[i], PDX_CU_EVENT_INTERPROCESS |
						PDX_CU_EVENT_DISABLE_TIMING))) {
				c->ev[i] = NULL;
				st = cu_fail(e->why, sizeof(e->why),
					     "cuEventCreate", r);
			} else if ((r = cu.ipc_get_event_handle(
					(struct pdx_cu_ipc *)c->handles[i],
					c->ev[i]))) {
				st = cu_fail(e->why, sizeof(e->why),
					     "cuIpcGetEventHandle", r);
			}
		}
		cu.ctx_pop(&popped);
	}
	if (st != PDX_OK) {
		pdx__cuda_free(c);
		return st;
	}
	*out = c;
	return PDX_OK;
}

/* The events' handles, as register sends them to the agent. */
void pdx__cuda_events_of(const struct pdx__cuda *c,
			 struct pdx_engine_cuda_events *out)
{
	out->handles = (const uint8_t (*)[PDX_CUDA_IPC_BYTES])c->handles;
	out->slots = c->slots;
}

/* Records layer's event of the engine's events (e->cuda) on stream, in
 * the slot of its forward pass: a layer at or below the last one recorded
 * starts the next pass, in the next slot (*slot). */
pdx_status_t pdx__cuda_record(struct pdx_engine *e, uint32_t layer,
			      void *stream, uint32_t *slot_out)
{
	struct pdx__cuda *c = e->cuda;
	pdx_cu_context popped;
	pdx_cu_result r;
	uint32_t slot;

	if (layer >= c->layers)
		return pdx__fail(e, PDX_ERANGE,
				 "layer_done_stream: layer %u, the layout has %u",
				 layer, c->layers);
	slot = c->slot;
	if (c->last >= 0 && layer <= c->last)
		slot = (slot + 1) % c->slots; /* a new forward pass */
	if ((r = cu.ctx_push(c->ctx)))
		return cu_fail(e->why, sizeof(e->why), "cuCtxPushCurrent", r);
	r = cu.event_record(c->ev[(uint64_t)slot * c->layers + layer], stream);
	cu.ctx_pop(&popped);
	if (r != PDX_CUDA_SUCCESS)
		return cu_fail(e->why, sizeof(e->why), "cuEventRecord", r);
	c->slot = slot;
	c->last = layer;
	*slot_out = slot;
	return PDX_OK;
}
