/* The GPU side of pdx-xferbench's synthetic engines (--mem cuda).
 *
 * A pool is one cudaMalloc allocation laid out exactly as the shm pool
 * (common/shm_pool.h: layer-major, one region), exported with
 * cudaIpcGetMemHandle, a compute stream, and a ring of slots x layers
 * interprocess events for pdx_engine_register_cuda(). The pattern is
 * written and checked on the GPU with the kernels of kernels/kv_kernels.h.
 *
 * The pattern. Layer l of a transfer with seed s is what pdx_kv_fill_cuda()
 * writes through a one-layer view of the pool (that layer alone, as layer
 * 0) with seed mix64(s ^ mix64(l)): one fill per layer, so the prefill side
 * can "compute" its layers one at a time. It is not the shm pattern
 * (bench/pool.c): both ends of a --mem cuda run use this one.
 *
 * bench/xfer_cuda.c implements it with the CUDA runtime (plain C against
 * cuda_runtime_api.h); bench/xfer_nocuda.c, built where CUDA is not, has
 * the same functions failing with "built without CUDA". Unless said
 * otherwise they return 0, or -1 with the reason in err. Call them from
 * one thread of a process that had not used CUDA before it was forked
 * (CUDA does not survive fork()).
 */
#ifndef PDX_BENCH_XFER_CUDA_H
#define PDX_BENCH_XFER_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <pdx/engine.h>
#include <pdx/layout.h>

#include "common/models.h"

/* The exit code of a run that cannot use a GPU here (meson: skipped). */
#define XB_CUDA_SKIP 77

struct xb_cuda_pool;

/* Checks that device dev can be used. Returns 0; XB_CUDA_SKIP when the
 * process sees no such CUDA device or was built without CUDA; -1 on
 * another error. The reason goes to err either way. It initialises CUDA:
 * run it in a child that exits afterwards, not in a process that forks
 * engines later. */
int xb_cuda_probe(int dev, char *err, size_t errlen);

/* Creates a pool of `blocks` blocks of model m on device dev, zeroed, and
 * event_slots * m->layers interprocess events (none when 0). */
int xb_cuda_pool_new(int dev, const struct pdx_model *m, uint32_t blocks,
		     uint32_t event_slots, struct xb_cuda_pool **out, char *err,
		     size_t errlen);

/* Frees everything; NULL-safe. */
void xb_cuda_pool_free(struct xb_cuda_pool *p);

/* What pdx_engine_register_cuda() takes, valid while the pool lives: its
 * layout, its one PDX_MEM_CUDA region, its events (NULL without). */
const struct pdx_kv_layout *xb_cuda_pool_layout(const struct xb_cuda_pool *p);
const struct pdx_engine_region *
xb_cuda_pool_region(const struct xb_cuda_pool *p);
const struct pdx_engine_cuda_events *
xb_cuda_pool_events(const struct xb_cuda_pool *p);

/* The device's name, e.g. "NVIDIA H100 80GB HBM3". */
const char *xb_cuda_pool_device(const struct xb_cuda_pool *p);

/* Queues on the compute stream the pattern of layer `layer` (every tensor)
 * of transfer `seed` into blocks[first..n) (the index in the list is the
 * token-block index). Does not wait for the kernel, but the kernels
 * library waits for the stream's earlier work before it launches (its
 * block-id table is uploaded synchronously). */
int xb_cuda_fill_layer(struct xb_cuda_pool *p, uint32_t layer, uint64_t seed,
		       const uint32_t *blocks, size_t n, size_t first,
		       char *err, size_t errlen);

/* Records event [slot * layers + layer] on the compute stream: it fires
 * once everything queued before it there is done. Does not wait. */
int xb_cuda_record(struct xb_cuda_pool *p, uint32_t slot, uint32_t layer,
		   char *err, size_t errlen);

/* Waits until the compute stream's work is done. */
int xb_cuda_sync(struct xb_cuda_pool *p, char *err, size_t errlen);

/* The whole pool from, or to, a host image of `size` bytes laid out alike
 * (an shm pool of the same model and blocks: a run with TP writes and
 * checks the shm pattern, a head at a time, through it). Synchronises. */
int xb_cuda_upload(struct xb_cuda_pool *p, const void *host, size_t size,
		   char *err, size_t errlen);
int xb_cuda_download(struct xb_cuda_pool *p, void *host, size_t size,
		     char *err, size_t errlen);
/* Queues on the compute stream the copy of layer `layer` (every tensor) of
 * blocks[first..n) from such a host image into the pool: with TP, the
 * "compute" that writes a layer's real bytes. Does not wait. */
int xb_cuda_upload_layer(struct xb_cuda_pool *p, const void *host,
			 uint32_t layer, const uint32_t *blocks, size_t n,
			 size_t first, char *err, size_t errlen);

/* Checks that blocks dst[first..n) of this pool hold, byte for byte, what
 * xb_cuda_fill_layer() wrote for every layer of `seed` into blocks
 * src[first..n) of the sender's pool (which has as many blocks as this
 * one). Returns 0 when they do; 1 with the first difference, described,
 * in err; -1 on a CUDA error. Synchronises. */
int xb_cuda_verify(struct xb_cuda_pool *p, uint64_t seed, const uint32_t *src,
		   const uint32_t *dst, size_t n, size_t first, char *err,
		   size_t errlen);

/* The copy yardsticks on the pool's device: `bytes` (at most the pool's
 * size) device to device, and device to pinned host memory, each timed
 * with CUDA events over `reps` copies after two unmeasured ones; the
 * median, in GB/s (1e9 bytes/s). */
int xb_cuda_yardsticks(struct xb_cuda_pool *p, uint64_t bytes, uint32_t reps,
		       double *d2d_gbps, double *d2h_gbps, char *err,
		       size_t errlen);

#endif
