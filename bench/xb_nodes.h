/* pdx-xferbench's processes, seen from the parent: each node is one
 * pdx-agent and the synthetic engine (bench/xb_engine.h) forked to drive
 * it. This file starts them, commands them, waits for their acks while
 * watching that none has died, copies the agents' logs to stderr, and
 * stops them in order (engines first, then agents).
 *
 * A side of a transfer is one node per tensor-parallel rank
 * (bench/xb_tp.h): the prefill ranks, and the decode ranks of each decode
 * TP size the run measures. Every failure ends the run through xb_fail();
 * the cleanup registry (bench/pdx_bench.h) then kills what was started.
 */
#ifndef PDX_BENCH_XB_NODES_H
#define PDX_BENCH_XB_NODES_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "bench/pdx_bench.h"
#include "bench/xb_opts.h"
#include "bench/xb_plan.h"

/* the prefill ranks and two decode instances' */
#define ACK_TIMEOUT_MS 300000    /* a command, verification included */

#define XB_NODES_MAX (3 * XB_TP_MAX)

/* The engines' KV pools are /dev/shm/pdx-xb-PID-RANDOM-TAGROW (PID the
 * parent's, RANDOM the run's); a run sweeps those of killed runs at
 * start. */
#define XB_SHM_PREFIX "pdx-xb-"

struct xb_node {
	const char *role; /* "prefill", "decode" */
	char tag;         /* 'P', 'D': in its file names */
	char name[32];    /* in messages: the role, and its rank under TP */
	int row;          /* its index: its row of the plan's stamps */
	uint32_t tp_rank, tp_size;
	enum pdx_kv_order order; /* of its pool's blocks */
	int cuda_dev;     /* --mem cuda: its engine's device */
	pid_t pid;        /* its engine process; 0 once reaped */
	int cmd_fd;
	int ack_fd;
	char peer[PDX_ADDR_MAX]; /* its agent's address, once registered */
	char gpu[128];    /* --mem cuda: its engine's device name */
	char shm_name[64];
	char engine[4200];
	struct pb_agent agent;
	int log_fd;           /* the agent's log, read back; 0: none */
	char logline[1024];   /* the line being read */
	size_t loglen;
	char data_by[128];    /* its "data by" for the other agent */
};

/* A trace line of an agent's log (PDX_AGENT_TRACE=1), given to whoever
 * measures with it instead of being copied to stderr. */
typedef void (*xb_trace_fn)(void *arg, const char *line);

struct xb_nodes {
	struct xb_node node[XB_NODES_MAX];
	int n;
	xb_trace_fn on_trace; /* NULL: trace lines dropped */
	void *trace_arg;
};

/* Adds a node of that role (not started): rank tp_rank of a TP instance
 * of tp_size ranks. */
struct xb_node *xb_nodes_add(struct xb_nodes *ns, const char *role, char tag,
			     uint32_t tp_rank, uint32_t tp_size, int cuda_dev);

/* Starts every node's agent, then forks its engine, and waits until each
 * engine has registered its pool (noting its peer address). Files go in
 * dir; the plan is what the engines will read. The agents' logs are
 * drained at exit too, so a failed run still shows their last words: only
 * one xb_nodes may be started per process. */
void xb_nodes_start(struct xb_nodes *ns, const struct xb_opts *o,
		    struct xb_plan *plan, const char *dir);

/* One command to n's engine. */
void xb_node_cmd(struct xb_node *n, uint32_t op, int iter, double layer_ms,
		 const char *peer);

/* Waits for one ack from each of the n nodes in ns (into acks[i]); a
 * refusal, a dead process or timeout_ms without an answer ends the run,
 * `what` saying which step. */
void xb_nodes_wait(struct xb_node **ns, int n, struct xb_ack *acks,
		   int timeout_ms, const char *what);

/* Ends the engines (CMD_QUIT, SIGKILL after a while), then the agents,
 * and copies the agents' last log lines. */
void xb_nodes_stop(struct xb_nodes *ns);

#endif
