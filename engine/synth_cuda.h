/* The synthetic model (synth_model.h) on a GPU: the same KV bytes, the
 * same check and the same next token as the CPU functions, which are the
 * reference (tests/gpu/test_synth_cuda.c compares them byte for byte),
 * for a pool in device memory.
 *
 * A context knows one pool: its layout (copied to the device), its base
 * and the stream its work goes on. The work of a forward pass is staged
 * once (pdx_synth_cuda_stage(): the runs' positions, hashes and block
 * tables, uploaded in one copy); then fill() writes one layer of every
 * staged position, tokens() reads the runs' next tokens and check()
 * compares every layer of the staged positions, all in stream order.
 *
 * Asynchronous with respect to the host, except tokens() and check(),
 * whose answers are host memory: they synchronise the stream (never the
 * device). Host arrays (runs, block tables, hashes) may be reused once
 * the call returns. One thread at a time per context.
 *
 * Requirements beyond pdx_synth_layout_check(): NHD (the kernels write a
 * slot as one run), every offset and stride a multiple of 8 (they write
 * 64-bit words). Block ids are
 * checked against the layout on the host: a bad one is PDX_ERANGE, and
 * nothing is written.
 */
#ifndef PDX_ENGINE_SYNTH_CUDA_H
#define PDX_ENGINE_SYNTH_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <pdx/layout.h>
#include <pdx/status.h>

#include "engine/synth_model.h"

#ifdef __cplusplus
extern "C" {
#endif

struct pdx_synth_cuda;

/* A context for the pool at device address base with layout l (copied;
 * it must pass pdx_synth_layout_check()), whose work goes on stream (a
 * cudaStream_t; the caller's, used by this thread's current device).
 * PDX_EINVAL: a layout it cannot handle; PDX_ENOMEM; PDX_EIO: a CUDA
 * error. */
pdx_status_t pdx_synth_cuda_new(const struct pdx_kv_layout *l, void *base,
				void *stream, struct pdx_synth_cuda **out);

/* Waits for the context's work on the stream, then frees; NULL-safe. */
void pdx_synth_cuda_free(struct pdx_synth_cuda *c);

/* Stages runs[0..n): positions [a, b) of each (with hash[a..b) and the
 * blocks they lie in) for fill() and check(), and for each run with
 * want_token its block table [0, ceil(b / block_tokens)) for tokens().
 * Replaces what was staged before. PDX_ERANGE: a block id outside the
 * layout; PDX_EINVAL: a run without blocks or hashes, or want_token with
 * b == 0; PDX_EIO: a CUDA error. */
pdx_status_t pdx_synth_cuda_stage(struct pdx_synth_cuda *c,
				  const struct pdx_synth_run *runs, size_t n);

/* Writes layer `layer` of every staged position, as pdx_synth_fill(). */
pdx_status_t pdx_synth_cuda_fill(struct pdx_synth_cuda *c, uint32_t layer);

/* For each staged run with want_token, in the order staged, writes
 * pdx_synth_next_token(b, vocab) to runs[i].token (runs: the array
 * staged, n its length). Synchronises the stream when there is one. */
pdx_status_t pdx_synth_cuda_tokens(struct pdx_synth_cuda *c,
				   struct pdx_synth_run *runs, size_t n,
				   uint32_t vocab);

/* Compares every word of every layer and tensor of the staged positions
 * with what pdx_synth_fill() writes: *mismatches is how many positions
 * differ somewhere (pdx_synth_check() false for [p, p + 1)) and *lowest
 * the lowest of them (UINT32_MAX when none). Synchronises the stream. */
pdx_status_t pdx_synth_cuda_check(struct pdx_synth_cuda *c,
				  uint64_t *mismatches, uint32_t *lowest);

#ifdef __cplusplus
}
#endif
#endif
