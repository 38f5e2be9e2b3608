/* The messages between the ranks of one tensor-parallel instance of
 * pdx-engine: the leader (rank 0: HTTP, scheduler) and its followers
 * (ranks 1 .. size - 1), over one ZeroMQ link each (the leader's ROUTER,
 * a follower's DEALER). docs/engine.md "Tensor parallelism" has the
 * exchange; this is its encoding.
 *
 * One message is one frame: the magic "PDXT", a version byte, then every
 * field below in this order, little-endian, whatever the kind (the kind
 * says which ones mean something; the others are zero or empty): kind
 * u8, rank u32, size u32, blocks u32, seq u64, status i32, value u32,
 * xfer 16 bytes, peer and text (u16 length + bytes, no NUL), then the
 * arrays, each a u32 count and its items: peers (strings as peer, at
 * most PDX_TP_MAX), blocks (u32), tokens (u32),
 * runs (a u32, b u32, blocks: u32 count + u32 ids, hashes: b - a
 * u64).
 *
 * Pure: no I/O, no logging; any thread.
 */
#ifndef PDX_ENGINE_TP_WIRE_H
#define PDX_ENGINE_TP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/engine.h>
#include <pdx/status.h>

#include "engine/kv_peers.h"

#define PDX_TP_WIRE_VERSION 2

enum pdx_tp_kind {
	/* follower -> leader: rank, size, blocks (its pool's), value (its
	 * --role: engine/opts.h's enum), text (the model's name), peer (its
	 * agent's peer address) */
	PDX_TP_HELLO = 1,
	/* leader -> follower: text says why it may not join; it exits */
	PDX_TP_REFUSE,
	/* either way, when there was nothing else to say: alive; from a
	 * follower also its agent link's state: status PDX_OK, or why the
	 * agent is away in status and text (engine/kv_link.h), and its
	 * agent's peer address now in peer (it restarted elsewhere) */
	PDX_TP_PING,
	/* leader -> follower: one forward pass (seq, runs) to write in its
	 * pool */
	PDX_TP_STEP,
	/* follower -> leader: pass seq written (status) */
	PDX_TP_STEP_DONE,
	/* leader -> follower, a transfer of its agent's: pdx_engine_send()
	 * of xfer and blocks; peers: the other side's agents, rank order,
	 * from which the follower's link picks its own (kv_link.h; none:
	 * open) */
	PDX_TP_SEND,
	/* pdx_engine_recv() of xfer from peers into blocks, value its
	 * skip_tokens (the leader's prefix-cache hit: the follower's same
	 * blocks hold the same heads' KV); tokens: the prompt, whose KV
	 * the follower checks once it is in */
	PDX_TP_RECV,
	PDX_TP_LAYER,	 /* value: layer computed, of xfer */
	PDX_TP_TOKEN,	 /* value: the first token of xfer */
	PDX_TP_HOLD,	 /* pdx_engine_hold() of xfer at peers */
	PDX_TP_ABORT,	 /* xfer ends: abort it (nothing if it is over) */
	PDX_TP_ABORT_AT, /* pdx_engine_abort_at() of xfer at peers */
	/* follower -> leader: xfer's event at its agent: value the
	 * pdx_event_kind, status, text the reason */
	PDX_TP_EVENT,
	PDX_TP_KIND_END,
};

/* Positions [a, b) of one sequence in one pass (engine/synth_model.h's
 * pdx_synth_run): the blocks that hold them (blocks[i] holds positions
 * [(first + i) * bt, ...), first = a / bt) and their prefix hashes. */
struct pdx_tp_run {
	uint32_t a, b;
	uint32_t n_blocks;
	uint32_t *blocks;
	uint64_t *hash; /* [b - a]: hash[p - a] of position p */
};

struct pdx_tp_msg {
	enum pdx_tp_kind kind;
	uint32_t rank, size, blocks;
	uint64_t seq;
	int32_t status;
	uint32_t value;
	struct pdx_xfer_id xfer;
	char peer[PDX_ADDR_MAX]; /* hello: the follower's agent */
	char text[PDX_REASON_MAX];
	struct pdx_kv_peers peers;
	uint32_t n_block_ids;
	uint32_t *block_ids;
	uint32_t n_tokens;
	uint32_t *tokens;
	uint32_t n_runs;
	struct pdx_tp_run *runs;
};

/* Encodes m into a new buffer (*out, free()) of *len bytes. PDX_ENOMEM;
 * PDX_EINVAL: a bad kind, or a run with b < a. */
pdx_status_t pdx_tp_msg_encode(const struct pdx_tp_msg *m, uint8_t **out,
			       size_t *len);

/* Decodes buf[0..len) into m (its arrays allocated: pdx_tp_msg_clear()).
 * PDX_EINVAL: not a message of this version, or short, long or
 * inconsistent; PDX_ENOMEM. Nothing to clear on failure. */
pdx_status_t pdx_tp_msg_decode(const uint8_t *buf, size_t len,
			       struct pdx_tp_msg *m);

/* Frees a decoded message's arrays and zeroes it. */
void pdx_tp_msg_clear(struct pdx_tp_msg *m);

#endif
