/* agent/gpu.h for an agent built without the CUDA runtime: there is no GPU
 * here, and a registration of GPU memory is refused with that reason.
 * gpu_new() is the only way to a struct gpu, so the rest is never called. */
#include <stdio.h>
#include <stdlib.h>

#include "agent/gpu.h"

struct gpu *gpu_new(struct event_base *base, int device,
		    void (*settle)(void *arg), void *arg, char *err,
		    size_t errlen)
{
	(void)base;
	(void)device;
	(void)settle;
	(void)arg;
	snprintf(err, errlen, "this pdx-agent was built without CUDA");
	return NULL;
}

void gpu_free(struct gpu *g)
{
	(void)g;
}

void gpu_drain(struct gpu *g)
{
	(void)g;
}

int gpu_device(const struct gpu *g)
{
	(void)g;
	return -1;
}

pdx_status_t gpu_mem_open(struct gpu *g, const uint8_t h[PDX_CUDA_IPC_BYTES],
			  void **ptr, char *err, size_t errlen)
{
	(void)g;
	(void)h;
	*ptr = NULL;
	snprintf(err, errlen, "built without CUDA");
	return PDX_EINVAL;
}

void gpu_mem_close(struct gpu *g, void *ptr)
{
	(void)g;
	(void)ptr;
}

pdx_status_t gpu_event_open(struct gpu *g,
			    const uint8_t h[PDX_CUDA_IPC_BYTES], void **ev)
{
	(void)g;
	(void)h;
	*ev = NULL;
	return PDX_EINVAL;
}

void gpu_event_close(struct gpu *g, void *ev)
{
	(void)g;
	(void)ev;
}

pdx_status_t gpu_wait(struct gpu *g, void *ev)
{
	(void)g;
	(void)ev;
	return PDX_EINVAL;
}

pdx_status_t gpu_then(struct gpu *g, void (*fn)(void *arg, pdx_status_t st),
		      void *arg)
{
	(void)g;
	(void)fn;
	(void)arg;
	return PDX_EINVAL;
}

void *gpu_dev_alloc(struct gpu *g, size_t len)
{
	(void)g;
	(void)len;
	return NULL;
}

void gpu_dev_free(struct gpu *g, void *p)
{
	(void)g;
	(void)p;
}

pdx_status_t gpu_host_register(struct gpu *g, void *p, size_t len)
{
	(void)g;
	(void)p;
	(void)len;
	return PDX_EINVAL;
}

void gpu_host_unregister(struct gpu *g, void *p)
{
	(void)g;
	(void)p;
}

pdx_status_t gpu_copy(struct gpu *g, void *dst, const void *src, size_t len)
{
	(void)g;
	(void)dst;
	(void)src;
	(void)len;
	return PDX_EINVAL;
}

pdx_status_t gpu_plan_new(struct gpu *g, const struct pdx_kv_region *kv,
			  const uint32_t *blocks, uint32_t n,
			  struct pdx_kv_plan **out)
{
	(void)g;
	(void)kv;
	(void)blocks;
	(void)n;
	*out = NULL;
	return PDX_EINVAL;
}

void gpu_plan_free(struct gpu *g, struct pdx_kv_plan *p)
{
	(void)g;
	(void)p;
}

pdx_status_t gpu_gather(struct gpu *g, const struct pdx_kv_plan *p,
			uint64_t first, uint64_t count, void *staging)
{
	(void)g;
	(void)p;
	(void)first;
	(void)count;
	(void)staging;
	return PDX_EINVAL;
}

pdx_status_t gpu_scatter(struct gpu *g, const struct pdx_kv_plan *p,
			 uint64_t first, uint64_t count, const void *staging)
{
	(void)g;
	(void)p;
	(void)first;
	(void)count;
	(void)staging;
	return PDX_EINVAL;
}

pdx_status_t gpu_plan_copy(struct gpu *g, const struct pdx_kv_plan *src,
			   const struct pdx_kv_plan *dst, uint64_t first,
			   uint64_t count)
{
	(void)g;
	(void)src;
	(void)dst;
	(void)first;
	(void)count;
	return PDX_EINVAL;
}

pdx_status_t gpu_plan_copy_piece(struct gpu *g, const struct pdx_kv_plan *src,
				 const struct pdx_kv_plan *dst,
				 const struct pdx_kv_piece *piece,
				 uint64_t first, uint64_t count)
{
	(void)g;
	(void)src;
	(void)dst;
	(void)piece;
	(void)first;
	(void)count;
	return PDX_EINVAL;
}
