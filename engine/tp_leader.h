/* The leader's end of a tensor-parallel instance (rank 0 of --tp-size
 * N): it binds --tp-leader, lets the N - 1 followers join, sends each of
 * them every forward pass the scheduler runs and every transfer action
 * the engine gives its own agent (engine/tp_wire.h), and hears back
 * their passes written and their agents' events. The exchange is in
 * docs/engine.md, "Tensor parallelism".
 *
 * The group is whole while every rank has joined and none is gone; a
 * rank is gone when nothing came from it for liveness_ms (the ranks
 * ping each other when idle), and stays gone: a group that lost a rank
 * serves nothing until the instance is restarted. Its passes then fail
 * (PDX_EPEER), and cbs.broken says why, once.
 *
 * Callbacks run from the loop, never inside a pdx_tp_leader_* call.
 * One thread: the loop's.
 */
#ifndef PDX_ENGINE_TP_LEADER_H
#define PDX_ENGINE_TP_LEADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <pdx/engine.h>
#include <pdx/status.h>

#include "engine/kv_peers.h"
#include "engine/opts.h"
#include "engine/synth_model.h"
#include "engine/tp_wire.h"

struct pdx_tp_leader;

struct pdx_tp_leader_cbs {
	/* rank's agent ended xfer: ev->kind, status and reason */
	void (*event)(void *arg, uint32_t rank,
		      const struct pdx_engine_event *ev);
	/* every rank wrote every pass sent so far (pdx_tp_leader_caught_up
	 * turned true) */
	void (*caught_up)(void *arg);
	/* the group lost a rank: why */
	void (*broken)(void *arg, const char *why);
	void *arg;
};

struct pdx_tp_leader_params {
	struct event_base *base;
	const char *addr;     /* ipc://PATH or tcp://HOST:PORT, bound */
	uint32_t size;	      /* ranks, this one included */
	const char *model;    /* the model's name: followers must agree */
	enum pdx_engine_role role; /* followers must agree */
	uint32_t blocks;      /* the pool's blocks: followers must agree */
	uint32_t block_tokens;
	uint32_t liveness_ms; /* a rank silent this long is gone */
	struct pdx_tp_leader_cbs cbs;
};

/* Binds and starts listening for followers. On failure writes the
 * reason to err: PDX_EIO or PDX_ENOMEM. */
pdx_status_t pdx_tp_leader_new(const struct pdx_tp_leader_params *p,
			       struct pdx_tp_leader **out, char *err,
			       size_t errlen);

/* NULL-safe. The followers notice the leader gone. */
void pdx_tp_leader_free(struct pdx_tp_leader *l);

/* PDX_OK while the group is whole; else PDX_EPEER and why in reason. */
pdx_status_t pdx_tp_leader_status(const struct pdx_tp_leader *l, char *reason,
				  size_t reason_len);
/* PDX_OK while every follower's agent is there, as its pings say; else
 * the first away one's link status, and why in reason. */
pdx_status_t pdx_tp_leader_agents(const struct pdx_tp_leader *l,
				  char *reason, size_t reason_len);

/* The agent peer address of rank r's agent ("" before it joined). */
const char *pdx_tp_leader_peer(const struct pdx_tp_leader *l, uint32_t r);

/* Sends the pass runs[0..n) (what the leader just wrote in its own pool)
 * to every follower. PDX_EPEER: the group is not whole (nothing sent). */
pdx_status_t pdx_tp_leader_step(struct pdx_tp_leader *l,
				const struct pdx_synth_run *runs, size_t n);

/* True when every follower wrote every pass sent (or the group is
 * broken: nobody waits for a rank that is gone). */
bool pdx_tp_leader_caught_up(const struct pdx_tp_leader *l);

/* Sends a transfer action (PDX_TP_SEND ... PDX_TP_ABORT_AT) to every
 * follower; m->peers, the other side's agents, is the same for all (each
 * follower's link picks its own: kv_link.h). */
void pdx_tp_leader_xfer(struct pdx_tp_leader *l, const struct pdx_tp_msg *m);

#endif
