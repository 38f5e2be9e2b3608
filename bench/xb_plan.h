/* What pdx-xferbench's parent and its synthetic engines share: the plan of
 * each iteration (transfer ids, seeds, blocks, and the engines' time
 * stamps) in a MAP_SHARED anonymous mapping made before the fork, so the
 * pointers are the same in every process; and the fixed-size commands and
 * acks that travel over the pipes between them.
 *
 * The parent writes the plan, then commands; an engine reads it when a
 * command comes and writes its stamps before it acks. Nothing else orders
 * the two sides, so nothing here locks.
 */
#ifndef PDX_BENCH_XB_PLAN_H
#define PDX_BENCH_XB_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/engine.h>

#include "common/models.h"

/* pool creation + agent start + register, on both sides */
#define READY_TIMEOUT_MS 60000

/* Ranks of one side at most (--prefill-tp, --decode-tp). */
#define XB_TP_MAX 8

/* What a transfer asks of the engines beyond its blocks, set by the parent
 * before each iteration: the part of the run --versus varies. The TP sizes
 * say which ranks take part (bench/xb_tp.h: an arm of another decode TP
 * size has decode ranks of its own); the rest changes what they post. */
struct xb_shape {
	/* transfers at once and blocks of each, skipped ones included: the
	 * run's, or 1 and 1 for --one-block's */
	uint32_t conc, nblocks;
	uint32_t skip_tokens;
	uint32_t skip_blocks; /* leading blocks D already holds */
	bool pull;            /* the decode agent reads (pdx_engine_recv_opts) */
	uint32_t prefill_tp, decode_tp; /* ranks of each side, 1 or more */
	enum pdx_kv_order decode_order; /* the decode ranks' blocks' */
};

/* What the parent and all engines share (a MAP_SHARED anonymous mapping
 * made before the fork, so the pointers are the same everywhere). Every
 * engine has a row of its own (its node's index, bench/xb_nodes.h) in the
 * arrays of time stamps; all ranks of a side use the same blocks. */
struct xb_plan {
	const struct pdx_model *model;
	enum pdx_kv_order order; /* of the prefill pools (--order) */
	uint32_t conc, nblocks; /* the run's: the arrays' dimensions */
	uint32_t rows;          /* engines: the stamps' rows */
	struct xb_shape *shape; /* this iteration's */
	uint32_t pool_blocks;
	/* how long an engine waits for an iteration's events, and the parent
	 * for the engines' acks of them: xb_opts_event_wait_ms() */
	uint64_t event_wait_ms;
	struct pdx_xfer_id *ids; /* [conc] */
	uint64_t *seeds;         /* [conc] */
	uint32_t *src;           /* [conc][nblocks], P's blocks */
	uint32_t *dst;           /* [conc][nblocks], D's blocks */
	/* the prefill ranks' agents, rank order: a decode rank's recv
	 * names them all when the TP sizes differ */
	char (*peers)[PDX_ADDR_MAX]; /* [XB_TP_MAX] */
	uint64_t *t_send;        /* [rows][conc] P: send posted */
	uint64_t *t_sent;        /* [rows][conc] P: "sent" read */
	uint64_t *t_recv;        /* [rows][conc] D: "received" read by the engine */
	uint64_t *t_recv_agent;  /* [rows][conc] D: "received" emitted by its agent */
	uint64_t *t_first_ld;    /* [rows] P: first layer_done posted */
	uint64_t *t_last_ld;     /* [rows] P: last layer_done posted */
	uint64_t *ev_bytes;      /* [rows][conc] D: bytes of the received event */
};

enum xb_cmd_op {
	CMD_FILL = 1, CMD_RECV, CMD_WAIT, CMD_SEND, CMD_YARD, CMD_PING, CMD_QUIT,
	CMD_VERIFY
};

/* peer: RECV's sender and SEND's receiver; empty: RECV names every
 * prefill rank (plan->peers, shape->prefill_tp of them), SEND is open. */
struct xb_cmd {
	uint32_t op;
	int32_t iter;
	double layer_ms;
	char peer[PDX_ADDR_MAX];
};

struct xb_ack {
	int32_t ok;
	uint32_t verified;
	char peer[PDX_ADDR_MAX];
	char reason[1024];
	char gpu[128];        /* --mem cuda: the device's name */
	double d2d_gbps;      /* YARD */
	double d2h_gbps;
	uint64_t rtt_ns;      /* PING */
};

/* Maps the shared area for p->conc transfers of p->nblocks blocks and
 * p->rows engines and points p's arrays into it; the rest of p is the
 * caller's. Fails the run when it cannot. */
void xb_plan_alloc(struct xb_plan *p);

/* Row `row` (an engine's) of one of p's [rows][conc] arrays. */
static inline uint64_t *xb_plan_row(const struct xb_plan *p, uint64_t *a,
				    int row)
{
	return a + (size_t)row * p->conc;
}

/* x's index among this iteration's transfers, -1 when it is none of
 * them. */
int xb_plan_xfer_index(const struct xb_plan *p, const struct pdx_xfer_id *x);

/* The KV heads a rank of a TP instance of tp ranks holds of the model's:
 * its share, or (MLA: one latent tensor) all. */
uint32_t xb_plan_rank_heads(const struct pdx_model *m, uint32_t tp);

/* The payload one decode rank of shape sh receives of one transfer (the
 * blocks D does not hold, counted from this iteration's nblocks). */
uint64_t xb_plan_rank_bytes(const struct xb_plan *p,
			    const struct xb_shape *sh);
/* ... all decode ranks together: the model's KV once, MLA's once a rank */
uint64_t xb_plan_shape_bytes(const struct xb_plan *p,
			     const struct xb_shape *sh);
/* ... of this iteration's */
uint64_t xb_plan_xfer_bytes(const struct xb_plan *p);

/* A whole record over a pipe, through EINTR and short counts: 0, or -1
 * when the other end is gone. */
int xb_write_all(int fd, const void *buf, size_t len);
int xb_read_all(int fd, void *buf, size_t len);

#endif
