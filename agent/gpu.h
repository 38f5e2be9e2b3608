/* The agent's GPU side (docs/gpu.md): engine memory and "layer computed"
 * events opened with CUDA IPC, one non-blocking stream of our own on which
 * every copy is queued behind the events it needs, and completions handed
 * back to the event loop. Never a device-wide synchronize: the engine keeps
 * computing while we copy.
 *
 * Built from gpu_cuda.c where the CUDA runtime is found, else from
 * gpu_nocuda.c, whose gpu_new() says why there is no GPU here; nothing else
 * in agent/ depends on CUDA. One thread (the loop's).
 */
#ifndef PDX_AGENT_GPU_H
#define PDX_AGENT_GPU_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/engine.h>
#include <pdx/layout.h>
#include <pdx/status.h>

struct gpu;
struct pdx_kv_plan;
struct pdx_kv_region;
struct pdx_kv_piece;

/* Uses CUDA device `device` (the engine's). After the loop delivered
 * completions it calls settle(arg) (the agent's: UCX progress, reaping).
 * NULL with the reason in err when this agent was built without CUDA or
 * the device cannot be used. */
struct gpu *gpu_new(struct event_base *base, int device,
		    void (*settle)(void *arg), void *arg, char *err,
		    size_t errlen);
/* Waits for our stream to drain, then closes everything. NULL-safe. */
void gpu_free(struct gpu *g);
/* Waits for our stream to drain and runs the callbacks due. NULL-safe. */
void gpu_drain(struct gpu *g);
int gpu_device(const struct gpu *g);

/* Another process's allocation, from its cudaIpcMemHandle_t. */
pdx_status_t gpu_mem_open(struct gpu *g, const uint8_t h[PDX_CUDA_IPC_BYTES],
			  void **ptr, char *err, size_t errlen);
void gpu_mem_close(struct gpu *g, void *ptr);

/* Another process's interprocess event. */
pdx_status_t gpu_event_open(struct gpu *g,
			    const uint8_t h[PDX_CUDA_IPC_BYTES], void **ev);
void gpu_event_close(struct gpu *g, void *ev);

/* Everything queued on our stream from now on runs after ev's last
 * recording (as of this call) completed. */
pdx_status_t gpu_wait(struct gpu *g, void *ev);

/* fn(arg, status) runs on the loop once everything queued on our stream
 * before this call has run; status is PDX_EIO when CUDA reported an
 * error. Exactly once, also at gpu_free(). On failure fn never runs, and
 * everything queued before has run when it returns (it waits). */
pdx_status_t gpu_then(struct gpu *g, void (*fn)(void *arg, pdx_status_t st),
		      void *arg);

/* Device memory, and host memory pinned for copies (any mapping: shared
 * memory too), for staging. */
void *gpu_dev_alloc(struct gpu *g, size_t len);
void gpu_dev_free(struct gpu *g, void *p);
pdx_status_t gpu_host_register(struct gpu *g, void *p, size_t len);
void gpu_host_unregister(struct gpu *g, void *p);

/* Queued on our stream: a copy of len bytes (any direction; host memory
 * must be pinned), and the plan kernels of kernels/kv_kernels.h. */
pdx_status_t gpu_copy(struct gpu *g, void *dst, const void *src, size_t len);
pdx_status_t gpu_plan_new(struct gpu *g, const struct pdx_kv_region *kv,
			  const uint32_t *blocks, uint32_t n,
			  struct pdx_kv_plan **out);
/* After the work using it: queued behind it on our stream. */
void gpu_plan_free(struct gpu *g, struct pdx_kv_plan *p);
pdx_status_t gpu_gather(struct gpu *g, const struct pdx_kv_plan *p,
			uint64_t first, uint64_t count, void *staging);
pdx_status_t gpu_scatter(struct gpu *g, const struct pdx_kv_plan *p,
			 uint64_t first, uint64_t count, const void *staging);
pdx_status_t gpu_plan_copy(struct gpu *g, const struct pdx_kv_plan *src,
			   const struct pdx_kv_plan *dst, uint64_t first,
			   uint64_t count);
pdx_status_t gpu_plan_copy_piece(struct gpu *g, const struct pdx_kv_plan *src,
				 const struct pdx_kv_plan *dst,
				 const struct pdx_kv_piece *piece,
				 uint64_t first, uint64_t count);

#endif
