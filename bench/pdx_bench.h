/* pdx_bench_util: what pdx-xferbench and the integration tests share.
 *
 * KV pools in POSIX shared memory (common/shm_pool.h, in the model shapes
 * of common/models.h) tracked for cleanup, the deterministic data pattern
 * written by the prefill side and checked by the decode side, spawning and
 * stopping pdx-agent processes, and a cleanup registry that kills what was
 * spawned and unlinks what was created when the process exits or is
 * signalled.
 */
#ifndef PDX_BENCH_H
#define PDX_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <pdx/engine.h>
#include <pdx/layout.h>

#include "common/mix64.h"
#include "common/models.h"
#include "common/shm_pool.h"

/* ---- KV pools ---- */

/* pdx_shm_pool_create() (common/shm_pool.h) with the name in the cleanup
 * registry from before the object exists until pb_pool_destroy(). Returns
 * 0, or -1 with a message on stderr. */
int pb_pool_create(struct pdx_shm_pool *p, const char *shm_name,
		   const struct pdx_model *m, uint32_t blocks);
/* Unmaps and unlinks; safe on a zeroed or destroyed pool. */
void pb_pool_destroy(struct pdx_shm_pool *p);

/* Writes the pattern of transfer `seed` into blocks[first..n) (the index in
 * the list is the token-block index), every layer and tensor. */
void pb_fill(const struct pdx_shm_pool *p, uint64_t seed,
	     const uint32_t *blocks, size_t n, size_t first);
/* The same for rank `rank` of a tensor-parallel instance of tp ranks, whose
 * pool holds kv_heads = all / tp of the heads (MLA: the whole latent):
 * each of its words is the one pb_fill() would write at the same global
 * head and token, so the slices of any two TP sizes and block orders
 * agree head for head. The pool's head_dim * dtype_bytes must be a
 * multiple of 8. */
void pb_fill_rank(const struct pdx_shm_pool *p, uint64_t seed,
		  const uint32_t *blocks, size_t n, size_t first, uint32_t rank,
		  uint32_t tp);
/* Sets blocks[first..n) to a byte that never passes pb_verify(). */
void pb_poison(const struct pdx_shm_pool *p, const uint32_t *blocks, size_t n,
	       size_t first);
/* Checks blocks[first..n) against the pattern of `seed`. Returns 0 when all
 * bytes match; else -1 and the first mismatch, described, in err. */
int pb_verify(const struct pdx_shm_pool *p, uint64_t seed,
	      const uint32_t *blocks, size_t n, size_t first, char *err,
	      size_t errlen);
/* ... against rank's slice (pb_fill_rank()) */
int pb_verify_rank(const struct pdx_shm_pool *p, uint64_t seed,
		   const uint32_t *blocks, size_t n, size_t first,
		   uint32_t rank, uint32_t tp, char *err, size_t errlen);

/* UCX operations one layer-tensor of a transfer needs: runs of blocks whose
 * ids are consecutive on both sides. */
uint64_t pb_runs(const uint32_t *src, const uint32_t *dst, size_t n);

/* n distinct block ids out of pool_blocks: 0..n-1 or a random subset in
 * random order. */
void pb_pick_blocks(uint32_t *out, size_t n, uint32_t pool_blocks, bool random,
		    uint64_t *rng);

/* ---- agents ---- */

struct pb_agent_opts {
	const char *bin;       /* pdx-agent */
	const char *engine;    /* ipc://... */
	const char *listen;    /* tcp://HOST:PORT */
	const char *tls;       /* UCX_TLS value, e.g. "sm,self"; NULL: unset */
	const char *data_path; /* --data-path VALUE; NULL: not passed */
	uint32_t xfer_timeout_ms; /* 0: not passed */
	int log_fd;            /* > 0: the agent's stdout and stderr go to
				* this fd (kept open by the caller while the
				* agent may be restarted); 0: to our stderr */
	const char *notify;    /* --notify ADDR; NULL: not passed */
	const char *netns;     /* run under `ip netns exec NETNS`; NULL: no */
	const char *env[8];    /* more "KEY=VALUE" for the agent; NULL-ended */
	const char *args[12];  /* more arguments, e.g. "--lease-ms", "500";
				* NULL-ended */
};

struct pb_agent {
	pid_t pid;             /* 0 when not running */
	int status;            /* wait status once it ended */
	struct pb_agent_opts o;
	/* copies the opts point into */
	char bin[4096], engine[4200], listen[256], tls[64], data_path[16],
		notify[256], netns[64], env[8][256], args[12][256];
};

/* Starts an agent (its stdout goes to stderr); o is copied. */
int pb_agent_start(struct pb_agent *a, const struct pb_agent_opts *o);
/* Starts it again with the same options (after it ended). */
int pb_agent_restart(struct pb_agent *a);
/* SIGTERM, then SIGKILL after 2 s; reaps. Returns the wait status or -1. */
int pb_agent_stop(struct pb_agent *a);
/* Sends sig and, for SIGKILL, reaps. */
void pb_agent_kill(struct pb_agent *a, int sig);
/* Reaps it if it ended; false then. */
bool pb_agent_alive(struct pb_agent *a);

/* A TCP port on host that could be bound just now: random in 20000..32767,
 * or from the kernel, never one this process was given among its last 64
 * (one thread). -1 on failure. */
int pb_free_port(const char *host);

/* dirname(/proc/self/exe)/../agent/pdx-agent (the build tree), else
 * dirname(/proc/self/exe)/pdx-agent when that exists (an install). */
int pb_default_agent_bin(char *out, size_t len);

/* Registers, retrying while the agent is not up yet, for up to total_ms.
 * If agent is given (our child), gives up as soon as it has ended. */
pdx_status_t pb_register_retry(struct pdx_engine *e,
			       const struct pdx_shm_pool *p,
			       char *peer, size_t peer_len, int total_ms,
			       struct pb_agent *agent);
/* The same for any regions (pdx_engine_register_cuda(); events may be
 * NULL). */
pdx_status_t pb_register_regions_retry(struct pdx_engine *e,
				       const struct pdx_kv_layout *layout,
				       const struct pdx_engine_region *regions,
				       size_t n_regions,
				       const struct pdx_engine_cuda_events *events,
				       char *peer, size_t peer_len,
				       int total_ms, struct pb_agent *agent);

/* Runs argv (argv[0] found in PATH) and returns its exit code, -1 when it
 * could not run. Output goes to stderr unless quiet. */
int pb_run(const char *const argv[], bool quiet);

/* ---- cleanup registry ----
 * pb_cleanup_install() arranges for pb_cleanup_run() to be called at exit
 * and on SIGINT, SIGTERM and SIGHUP (then exiting 1). Only the process that
 * installed it cleans up: forked children that exit do not. The run
 * unlinks the shm objects and files first (a SIGKILL while the processes
 * wind down then leaves none), SIGTERMs the pids (SIGKILL after 2 s),
 * unlinks again (what a child made meanwhile), then runs the hook and
 * removes the dir; those three signals wait until it is done. */
void pb_cleanup_install(void);
void pb_cleanup_run(void);
void pb_track_pid(pid_t pid);
void pb_untrack_pid(pid_t pid);
void pb_track_shm(const char *name);
void pb_untrack_shm(const char *name);
void pb_track_path(const char *path); /* a file to unlink */
void pb_track_dir(const char *path);  /* an empty dir to rmdir, last */
void pb_cleanup_hook(void (*fn)(void)); /* run after everything else */

/* mkdtemp("/tmp/pdx-PID-XXXXXX") into out, tracked; PID ours, so that
 * what killed us by SIGKILL (no cleanup runs) can find it. */
int pb_tmpdir(char *out, size_t len);
/* Removes dir and the files in it; untracks it. */
void pb_tmpdir_remove(const char *dir);

#endif
