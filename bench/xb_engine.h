/* pdx-xferbench's synthetic engine: the process that stands in for a
 * serving engine beside one pdx-agent. It keeps a KV pool shaped like the
 * model (POSIX shared memory, or GPU memory with --mem cuda), registers it
 * with its agent through libpdx, then obeys the parent's commands over a
 * pipe, reading each iteration's transfers from the shared plan
 * (bench/xb_plan.h):
 *
 *   P: FILL      write the pattern (its heads of it) into the source blocks
 *   D: RECV      post pdx_engine_recv() for every transfer
 *   D: WAIT      collect the "received" events
 *   D: VERIFY    check every byte of them
 *   P: SEND      post pdx_engine_send() for every transfer, then per layer
 *                (after --layer-ms of modeled compute) pdx_engine_layer_done()
 *                for all of them; collect the "sent" events
 *   P: YARD      the GPU's own copy rates (--mem cuda)
 *   D: PING      a ping over its agent's engine link (--one-block)
 *
 * Each command gets one ack; the first ack (ok, with the agent's peer
 * address) says the pool is registered. It runs only in a child forked for
 * it, so it may initialise CUDA, and it never returns.
 */
#ifndef PDX_BENCH_XB_ENGINE_H
#define PDX_BENCH_XB_ENGINE_H

#include <stdbool.h>
#include <sys/types.h>

#include "bench/xb_plan.h"

struct xb_engine_cfg {
	const char *role;     /* "prefill", "decode": its log prefix, xb-ROLE */
	int row;              /* its row of the plan's stamps */
	uint32_t tp_rank, tp_size; /* which heads its pool holds */
	enum pdx_kv_order order;   /* how its blocks lie */
	const char *engine;   /* its agent's engine link, ipc://PATH */
	const char *shm_name; /* its KV pool's, in shared memory */
	bool cuda;            /* the pool in GPU memory instead ... */
	int cuda_dev;         /* ... of this device */
	int cmd_fd, ack_fd;   /* commands in, acks out */
};

/* The engine's life, in the forked child; exits when parent (the pid that
 * forked it) is gone, at CMD_QUIT, or when the command pipe closes. */
void xb_engine_main(const struct xb_engine_cfg *cfg, struct xb_plan *shared,
		    pid_t parent) __attribute__((noreturn));

#endif
