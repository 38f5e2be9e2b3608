/* Where a KV pool's bytes live, behind the pool (kv_pool.h): POSIX shared
 * memory (kv_mem_host.c) or one GPU's memory (kv_mem_cuda.c; its twin
 * kv_mem_cuda_nocuda.c where the build has no CUDA). The pool calls a
 * backend only through its ops, so nothing above it asks where the
 * memory is.
 *
 * A backend embeds struct pdx__kv_mem first and fills in every field
 * before its constructor returns; the fields stay valid until ops->free.
 * One thread: the engine's loop.
 */
#ifndef PDX_ENGINE_KV_MEM_H
#define PDX_ENGINE_KV_MEM_H

#include <stddef.h>
#include <stdint.h>

#include <pdx/engine.h>
#include <pdx/layout.h>
#include <pdx/status.h>

#include "common/shm_pool.h"
#include "engine/kv_pool.h"
#include "engine/synth_model.h"

struct pdx__kv_mem;

struct pdx__kv_mem_ops {
	/* pdx_kv_pool_pass() */
	pdx_status_t (*pass)(struct pdx__kv_mem *m, struct pdx_synth_run *runs,
			     size_t n, uint32_t vocab, uint32_t *slot);
	/* pdx_kv_pool_verify() of one run's [a, b) */
	pdx_status_t (*verify)(struct pdx__kv_mem *m,
			       const struct pdx_synth_run *run,
			       uint64_t *mismatches, uint32_t *bad);
	void (*free)(struct pdx__kv_mem *m);
};

struct pdx__kv_mem {
	const struct pdx__kv_mem_ops *ops;
	const struct pdx_kv_layout *layout;
	const struct pdx_engine_region *region;	     /* one: the whole pool */
	const struct pdx_engine_cuda_events *events; /* NULL: none */
	const struct pdx_shm_pool *shm; /* host memory only, else NULL */
	uint64_t size;
	uint32_t head0; /* the first KV head it holds (tp_slice.h): set by
			   the pool after the constructor */
	char where[80]; /* for the logs: "/dev/shm/NAME", "cuda:N" */
};

/* The constructors; on failure the reason is in err (kv_pool.h's
 * statuses). */
pdx_status_t pdx__kv_mem_host_new(const struct pdx_kv_pool_params *p,
				  struct pdx__kv_mem **out, char *err,
				  size_t errlen);
pdx_status_t pdx__kv_mem_cuda_new(const struct pdx_kv_pool_params *p,
				  struct pdx__kv_mem **out, char *err,
				  size_t errlen);

#endif
