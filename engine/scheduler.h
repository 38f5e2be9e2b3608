/* The engine's scheduler: continuous batching of prefill chunks and decode
 * steps on the engine's libevent loop.
 *
 * A request goes through these phases:
 *   queued   waiting for a running slot (--max-num-seqs) and for all its
 *            KV blocks (kv_seq.h), first come first served, at most
 *            queue_timeout_ms: then it ends with PDX_EAGAIN, never run.
 *            Blocks freed anywhere (block_alloc.h's hook) start a step
 *            that admits what fits now;
 *   prefill  its prompt's KV is written chunk by chunk, at most
 *            max_prefill_tokens prompt tokens per step over all requests;
 *            the step that writes the last chunk yields the first token;
 *   decode   one token per step: the newest token's KV is written, the
 *            next is read from the KV;
 *   done     after max_new tokens (no end-of-sequence token: every request
 *            runs to its length), or aborted.
 * Disaggregated requests slot in through the sink's KV hooks:
 *   wait KV  (a decode engine's request, sink.remote_kv) after admission
 *            it skips prefill until pdx_sched_kv_ready(): then its
 *            prompt's KV is checked and it decodes from the given first
 *            token (or the one its KV yields); on a failure it prefills
 *            here (sink.recompute; not after PDX_EAGENT, whose blocks
 *            may still be written) or ends with the failure;
 *   prefill  (a prefill engine's request) sink.admitted announces the
 *            blocks to the agent; in the step that writes its last chunk
 *            sink.layer_done(l) is called for each layer l when the
 *            step's modeled time reaches (l + 1) / layers of the pass
 *            (every layer, before the step's outputs); sink.hold takes
 *            the KV when the request ends, to free it once the agent
 *            has sent it.
 *
 * A step is one modeled forward pass. The step's real work (hashing,
 * writing and reading KV) runs when it starts; its outputs are delivered
 * when the modeled time (engine/synth_time.h, times the scale; scale 0:
 * none) has passed since it started, so a client sees the latency a GPU
 * would give. The next step starts in the same callback. An idle
 * scheduler arms no timer.
 *
 * One thread: the loop's. Sink callbacks run on it, from the step timer
 * (or the queue's bound's), and must not call pdx_sched_* themselves.
 */
#ifndef PDX_ENGINE_SCHEDULER_H
#define PDX_ENGINE_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>
#include <pdx/status.h>

#include "common/models.h"
#include "engine/kv_pool.h"
#include "engine/synth_time.h"

struct pdx_sched;
struct pdx_sched_req;
struct pdx_kv_seq;

/* The other ranks of a tensor-parallel instance (engine/tp_leader.h):
 * each pass run here is run there too, and a step's outputs wait until
 * they did. */
struct pdx_sched_mirror {
	/* The pass just run here: a failure fails its requests. */
	pdx_status_t (*pass)(void *arg, const struct pdx_synth_run *runs,
			     size_t n);
	/* Every rank ran every pass so far; else pdx_sched_resume() comes
	 * when they have. */
	bool (*caught_up)(void *arg);
	void *arg;
};

struct pdx_sched_params {
	/* With more than one priority (event_base_priority_init) steps get
	 * the lowest, so the loop writes what a step delivered before the
	 * next step's real work holds it. */
	struct event_base *base;
	struct pdx_kv_pool *pool;      /* borrowed; outlives the scheduler */
	const struct pdx_model *model; /* the pool's model */
	struct pdx_synth_gpu gpu;      /* zero: one H100 */
	double time_scale;	       /* 0: deliver outputs at once */
	uint32_t max_num_seqs;	       /* requests admitted at once */
	uint32_t max_waiting;	       /* requests queued beyond those */
	uint32_t max_prefill_tokens;   /* prompt tokens per step */
	uint32_t queue_timeout_ms;     /* longest wait queued; 0: none */
	const struct pdx_sched_mirror *mirror; /* borrowed; NULL: TP 1 */
};

/* Where a request's outputs go. */
struct pdx_sched_sink {
	/* Output token `index` (0 first); last: it is the request's final
	 * one, and done follows at once. */
	void (*token)(void *arg, uint32_t token, uint32_t index, bool last);
	/* The request ended (PDX_OK: all its tokens were delivered;
	 * PDX_EAGAIN: it waited queue_timeout_ms queued and never ran) and
	 * is freed right after the call. */
	void (*done)(void *arg, pdx_status_t status);
	void *arg;
	/* Optional KV hooks (NULL: none), for disaggregated requests. */
	bool remote_kv; /* its prompt's KV comes from elsewhere */
	bool recompute; /* ... and is computed here if that fails */
	/* Admitted: seq's blocks are the request's from now on. */
	void (*admitted)(void *arg, struct pdx_kv_seq *seq);
	/* The first token is sampled (before layer_done's; prefill side). */
	void (*first_token)(void *arg, uint32_t token);
	/* Layer `layer` of the whole prompt is computed (modeled time);
	 * in GPU memory, once the event of `slot` for it completes
	 * (kv_pool.h; PDX_KV_POOL_NO_SLOT: the bytes are in memory). */
	void (*layer_done)(void *arg, uint32_t layer, uint32_t slot);
	/* Called right before done(PDX_OK), and before done(PDX_EAGENT)
	 * (its transfer failed because the agent went away: the blocks may
	 * still be written, and are quarantined): returns true when it
	 * takes seq (and frees it with pdx_kv_seq_free() later). */
	bool (*hold)(void *arg, struct pdx_kv_seq *seq);
};

struct pdx_sched_stats {
	uint32_t running; /* admitted: prefill or decode */
	uint32_t waiting; /* queued */
};

pdx_status_t pdx_sched_new(const struct pdx_sched_params *p,
			   struct pdx_sched **out);

/* Frees every request left without calling its sink; NULL-safe. */
void pdx_sched_free(struct pdx_sched *s);

/* Queues a request of prompt[0..n_prompt) (copied; n_prompt > 0) for
 * max_new (>= 1) output tokens, its prefix-cache hits under cache_salt
 * (0: none; kv_seq.h). *out is the handle for
 * pdx_sched_abort(), valid until its sink's done returns.
 * PDX_ETOOBIG: it needs more KV blocks than the pool has (never fits);
 * PDX_EAGAIN: the queue is full; PDX_ENOMEM. */
pdx_status_t pdx_sched_submit(struct pdx_sched *s, const uint32_t *prompt,
			      uint32_t n_prompt, uint32_t max_new,
			      uint64_t cache_salt,
			      const struct pdx_sched_sink *sink,
			      struct pdx_sched_req **out);

/* Ends a request now (its client left): its blocks are free again and its
 * sink is never called again. */
void pdx_sched_abort(struct pdx_sched *s, struct pdx_sched_req *r);

/* A remote_kv request's transfer ended: PDX_OK when its prompt's KV is in
 * its blocks, with the prefill side's first token if first >= 0; else the
 * failure. Acted on at the next step (from the loop, not this stack). */
void pdx_sched_kv_ready(struct pdx_sched *s, struct pdx_sched_req *r,
			pdx_status_t status, int64_t first);

/* A queued remote_kv request's transfer failed before it was admitted
 * (the sender's agent lost, its lease lapsed, our agent lost): with
 * recompute it is prefilled here once admitted; else it ends now with
 * status, and its sink is called (done) from this stack. */
void pdx_sched_kv_failed_queued(struct pdx_sched *s, struct pdx_sched_req *r,
				pdx_status_t status);

void pdx_sched_stats(const struct pdx_sched *s, struct pdx_sched_stats *out);

/* The mirror's ranks caught up: a step's outputs held for them go out. */
void pdx_sched_resume(struct pdx_sched *s);

#endif
