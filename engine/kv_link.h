/* The engine's link to its pdx-agent (include/pdx/engine.h) on the
 * engine's libevent loop: the KV pool registered once, transfers announced
 * with a waiter each, and every event handed to its waiter.
 *
 * Events are read from the link's fd in the loop, never from inside a
 * pdx_kv_link_* call, so a waiter's callback never runs on its caller's
 * stack. A waiter gets at most one callback, after which it is off the
 * link; pdx_kv_link_cancel() takes it off earlier (and aborts the
 * transfer at both agents).
 *
 * One thread: the loop's.
 */
#ifndef PDX_ENGINE_KV_LINK_H
#define PDX_ENGINE_KV_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include <event2/event.h>
#include <pdx/engine.h>
#include <pdx/status.h>

#include "engine/kv_peers.h"
#include "engine/kv_pool.h"
#include "engine/tp_leader.h"

struct pdx_kv_link;

/* One announced transfer, owned (embedded) by the caller. */
struct pdx_kv_waiter {
	LIST_ENTRY(pdx_kv_waiter) link;
	struct pdx_xfer_id xfer;
	bool active; /* on the link: its event is still to come */
	void (*cb)(void *arg, const struct pdx_engine_event *ev);
	void *arg;
	/* Set by the caller before recv, for the follower ranks of a TP
	 * instance (pdx_kv_link_set_tp()): the prompt (each rank checks
	 * what it receives). Borrowed until the event. */
	const uint32_t *tokens;
	uint32_t n_tokens;
	/* the link's: ranks whose event is still to come, rank 0's */
	uint32_t pending;
	bool local_done;
	bool failing; /* a rank failed: the others' events are awaited */
	/* failed for this instance's own cause: a rank gone, an agent of
	 * ours away or displaced (not the other side, nor between them) */
	bool failed_here;
	struct pdx_engine_event ev;
};

/* Connects to the agent at addr (ipc://PATH) and registers the pool
 * (its memory, and its events when it lives on a GPU) as rank `rank` of a
 * TP instance of `ranks` (0 of 1 without); waits for the agent's answer
 * (bounded). A hung agent is noticed within liveness_ms (engine.h). On
 * failure writes the reason to err.
 *
 * The transfer calls below take the other side's agents, one per rank of
 * its instance in rank order (`other`). At equal TP sizes this rank's
 * agent deals with its own rank's pair alone; at different sizes with
 * every one of them, and the agents move each rank's heads between the
 * ranks that hold them (docs/protocol.md, "TP legs"). This file is the
 * one place that rule lives. */
pdx_status_t pdx_kv_link_new(struct event_base *base, const char *addr,
			     uint32_t liveness_ms, struct pdx_kv_pool *pool,
			     uint32_t rank, uint32_t ranks,
			     struct pdx_kv_link **out, char *err,
			     size_t errlen);

/* Closes the link; the waiters left get no callback. NULL-safe. */
void pdx_kv_link_free(struct pdx_kv_link *l);

/* Rank 0 of a TP instance: every transfer action goes to the follower
 * ranks too (their agents pair with the other side's ranks), and a
 * waiter gets its callback once every rank's event came, or at the
 * first failure (the other ranks' transfers then aborted), its reason
 * naming the rank. tp is borrowed and outlives the link. */
void pdx_kv_link_set_tp(struct pdx_kv_link *l, struct pdx_tp_leader *tp,
			uint32_t size);

/* A follower rank's event for xfer (tp_leader.h's cbs.event). */
void pdx_kv_link_rank_event(struct pdx_kv_link *l, uint32_t rank,
			    const struct pdx_engine_event *ev);

/* Every waiter fails now with why (PDX_EPEER): the TP group lost a
 * rank. */
void pdx_kv_link_fail_all(struct pdx_kv_link *l, const char *why);

/* PDX_OK while the agent is there with our pool registered (and, in a
 * TP instance, the group is whole and every rank's agent is there, as
 * far as their pings said: tp_leader.h); PDX_EPEER while one is away (its
 * death or hang is noticed within the link's liveness bound, every
 * transfer in flight then fails), with why in reason. The link registers
 * again by itself when the agent is back. */
pdx_status_t pdx_kv_link_status(const struct pdx_kv_link *l, char *reason,
				size_t reason_len);
/* In a TP instance, whether the group is whole (a forward pass needs
 * every rank, not their agents); PDX_OK elsewhere. */
pdx_status_t pdx_kv_link_ranks_status(const struct pdx_kv_link *l,
				      char *reason, size_t reason_len);

/* The agent's peer address: the one the other side of a transfer needs. */
const char *pdx_kv_link_peer(const struct pdx_kv_link *l);

/* The instance's TP size: 1 but on rank 0 of a TP instance. */
uint32_t pdx_kv_link_tp_size(const struct pdx_kv_link *l);

/* Every rank's agent peer address, rank order (TP 1: out->n 1, its
 * own). */
void pdx_kv_link_peers(const struct pdx_kv_link *l, struct pdx_kv_peers *out);

/* Prefill side: pdx_engine_send(), to our pair, else open (other NULL
 * or empty: none known); w->cb gets "sent" or "failed". */
pdx_status_t pdx_kv_link_send(struct pdx_kv_link *l, struct pdx_kv_waiter *w,
			      const struct pdx_kv_peers *other,
			      const uint32_t *blocks, size_t n_blocks);

/* A layer of w's transfer is computed; in GPU memory, once the event of
 * slot for it completes (PDX_KV_POOL_NO_SLOT: the bytes are in memory
 * now). */
pdx_status_t pdx_kv_link_layer_done(struct pdx_kv_link *l,
				    const struct pdx_kv_waiter *w,
				    uint32_t layer, uint32_t slot);

/* Prefill side: the first token of w's transfer (pdx_engine_token()). */
pdx_status_t pdx_kv_link_token(struct pdx_kv_link *l,
			       const struct pdx_kv_waiter *w, uint32_t token);

/* Decode side: pdx_engine_recv() from our pair, else from every rank
 * (pdx_recv_opts.peers); the first skip_tokens tokens are held already (a
 * cached prefix: whole blocks of them are not sent); w->cb gets
 * "received" or "failed". PDX_EINVAL: no sender known. */
pdx_status_t pdx_kv_link_recv(struct pdx_kv_link *l, struct pdx_kv_waiter *w,
			      const struct pdx_kv_peers *other,
			      const uint32_t *blocks, size_t n_blocks,
			      uint32_t skip_tokens);

/* Takes w off the link (no callback will come) and aborts its transfer
 * when it was still active. NULL-safe for a waiter never announced. */
void pdx_kv_link_cancel(struct pdx_kv_link *l, struct pdx_kv_waiter *w);
/* Aborts w's transfer (at the agent, and the ranks') but goes on waiting
 * for its event: a receive's blocks are written until then (the agent
 * sends it once its sender says nothing more lands). */
void pdx_kv_link_abort(struct pdx_kv_link *l, struct pdx_kv_waiter *w);

/* Decode side: xfer's request waits in the queue; the agents of the other
 * side keep its KV for it (pdx_engine_hold(): our pair's, or every
 * rank's). */
void pdx_kv_link_hold(struct pdx_kv_link *l, const struct pdx_xfer_id *xfer,
		      const struct pdx_kv_peers *other);

/* cb gets the events no waiter takes: a held transfer's (its request
 * still queued) failure, which the agent reports before any recv, and
 * anything else no longer awaited (cb ignores what is not its own). */
void pdx_kv_link_on_held(struct pdx_kv_link *l,
			 void (*cb)(void *arg, const struct pdx_engine_event *ev),
			 void *arg);

/* For a transfer never announced here: the other side's agents (our
 * pair's, or every rank's) are told to abort it (pdx_engine_abort_at()). */
void pdx_kv_link_abort_at(struct pdx_kv_link *l,
			  const struct pdx_xfer_id *xfer,
			  const struct pdx_kv_peers *other);

#endif
