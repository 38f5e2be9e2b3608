/* Integration test harness: two real pdx-agent processes, a prefill and a
 * decode engine (both in the test process, each with its own KV pool in
 * shared memory), transfers that are checked byte for byte.
 *
 * Every test is `prog PATH-TO-pdx-agent [args]`, prints what it checks,
 * and exits 0 (pass), 1 (fail) or 77 (skip).
 */
#ifndef PDX_TEST_HARNESS_H
#define PDX_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/engine.h>

#include "bench/pdx_bench.h"
#include "tests/check.h"

#define H_SKIP 77

/* "# ..." lines: what the test does, beside its checks */
void h_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

struct h_kept;

struct h_side {
	const char *role;        /* "prefill" or "decode" */
	struct pb_agent agent;
	struct pdx_shm_pool pool;
	struct pdx_engine *eng;
	char engine_addr[4200];  /* ipc://... */
	char listen[128];        /* tcp://HOST:PORT */
	char peer[PDX_ADDR_MAX]; /* what register answered */
	char log[4200];          /* the agent's output (h_opts.agent_logs) */
	int log_fd;
	/* events read but not yet taken by h_wait() */
	struct h_kept *evs;
	size_t n_evs, cap_evs;
	/* the meta of the event h_wait() returned last: length, FNV-1a */
	size_t meta_len;
	uint64_t meta_hash;
};

struct h_opts {
	const char *tls;         /* UCX_TLS; default "sm,self" */
	const char *model;       /* default "tiny" */
	uint32_t pool_blocks;    /* default 1024 */
	uint32_t xfer_timeout_ms;/* --xfer-timeout-ms for both agents; 0: none */
	const char *data_path;   /* NULL: not passed */
	const char *notify;      /* --notify for both agents; NULL: none */
	const char *host_p, *host_d;   /* listen host; default 127.0.0.1 */
	const char *netns_p, *netns_d; /* run the agents there; NULL: here */
	const char *env_p[4], *env_d[4]; /* extra agent environment */
	const char *agent_args[12]; /* more options for both agents; NULL-ended */
	const char *args_p[4], *args_d[4]; /* and for one of them */
	uint32_t d_head_dim;     /* decode pool head_dim; 0: the model's */
	bool agent_logs;         /* each agent at --log-level debug, its
				  * output in a file for h_log_wait() (and
				  * its tail printed when a check failed) */
};

struct h_env {
	char dir[256];
	const char *agent_bin;
	struct h_opts o;
	struct h_side p, d;
	uint64_t rng;
	uint32_t next_block_p, next_block_d; /* contiguous block allocation */
};

/* One transfer: blocks on both sides, a pattern seed, skip_tokens. */
struct h_xfer {
	struct pdx_xfer_id id;
	uint64_t seed;
	uint32_t n;              /* blocks, skipped ones included */
	uint32_t skip_tokens;
	uint32_t *src, *dst;
	int64_t token; /* sent with pdx_engine_token() when >= 0 (h_run) */
	uint32_t meta_len; /* h_run: h_meta()'s bytes sent with pdx_engine_meta() */
};

/* The meta h_run() sends with x: len bytes of a pattern of its seed
 * (out: PDX_META_MAX bytes); its FNV-1a hash. */
uint64_t h_meta(const struct h_xfer *x, uint8_t *out);

/* Starts both agents (argv[1] is the agent binary), creates both pools,
 * connects and registers both engines. Returns 0, or -1 after printing why.
 * Installs the cleanup registry, so a failing test leaves nothing behind. */
int h_setup(struct h_env *env, int argc, char **argv, const struct h_opts *o);
/* Stops the engines and agents, removes pools and the temp dir; prints the
 * summary and returns the exit code (0 or 1). */
int h_finish(struct h_env *env);

/* Connects the side's engine (if needed) and registers it, retrying for up
 * to 10 s while its agent starts. */
int h_register(struct h_env *env, struct h_side *s);

/* Plans `count` transfers of n blocks each (n == 0: random 1..max_n),
 * with block ids random (distinct across the batch) or contiguous. */
void h_plan(struct h_env *env, struct h_xfer *x, size_t count, uint32_t n,
	    uint32_t max_n, bool random);
void h_plan_free(struct h_xfer *x, size_t count);

/* Writes the source pattern, and poisons the destination blocks. */
void h_prepare(struct h_env *env, const struct h_xfer *x, size_t count);
/* Posts recv on the decode side / send on the prefill side for each. */
int h_post_recv(struct h_env *env, const struct h_xfer *x, size_t count);
int h_post_send(struct h_env *env, const struct h_xfer *x, size_t count);
/* layer_done(layer) for all of them. */
int h_layer_done(struct h_env *env, uint32_t layer, const struct h_xfer *x,
		 size_t count);

/* Until s's engine link is up and registered (after its agent stalled or
 * restarted), reading events meanwhile (kept for h_wait); -1 after
 * timeout_ms. */
int h_link_up(struct h_side *s, int timeout_ms);

/* Waits up to timeout_ms for the event about id on side s; 0 and *ev when
 * it came, -1 on timeout. Events about other transfers are kept. */
int h_wait(struct h_side *s, const struct pdx_xfer_id *id, int timeout_ms,
	   struct pdx_engine_event *ev);
/* 0 when no event about id arrives within ms (reads and keeps others). */
int h_quiet(struct h_side *s, const struct pdx_xfer_id *id, int ms);
/* Drops the kept events. */
void h_forget(struct h_side *s);

/* Waits for "sent" on the prefill and "received" on the decode side of
 * every transfer (timeout_ms for all), checks the byte counts and then
 * every byte. Returns the number of transfers that did not pass. */
int h_expect_ok(struct h_env *env, const struct h_xfer *x, size_t count,
		int timeout_ms);
/* The whole usual flow: prepare, recv, send, all layers in order, expect. */
int h_run(struct h_env *env, struct h_xfer *x, size_t count);

/* Payload bytes of the transfer (skipped blocks excluded). */
uint64_t h_bytes(const struct h_env *env, const struct h_xfer *x);

/* With h_opts.agent_logs: where side s's agent log ends now, the start
 * for h_log_wait(). */
long h_log_mark(const struct h_side *s);
/* Waits up to timeout_ms for the count-th line of side s's agent log
 * after from that contains needle. Returns that line's index (0: the
 * first line after from), its log timestamp in *ts when ts is not NULL;
 * -1 on timeout. */
long h_log_wait(const struct h_side *s, long from, const char *needle,
		int count, int timeout_ms, double *ts);

void h_sleep_ms(long ms);
const char *h_kind(enum pdx_event_kind k);

#endif
