/* The sender's side of one layer-wise transfer, as pure state: which layers
 * are computed, whether the receiver's blocks are known, which layers were
 * pushed, and when to flush. No I/O, so every order of events can be tested.
 *
 * A layer is pushed once, as soon as it is computed AND the blocks are
 * known, whichever comes first. The flush starts once every layer was
 * pushed and every operation finished. */
#ifndef PDX_AGENT_XFER_SM_H
#define PDX_AGENT_XFER_SM_H

#include <stdbool.h>
#include <stdint.h>

#include <pdx/layout.h>

struct pdx_xfer_sm {
	uint32_t layers;
	uint32_t pushed_count;
	uint32_t inflight; /* data operations started and not finished */
	bool blocks_known;
	bool flush_started;
	uint64_t computed[PDX_MAX_LAYERS / 64];
	uint64_t pushed[PDX_MAX_LAYERS / 64];
};

void pdx_xfer_sm_init(struct pdx_xfer_sm *sm, uint32_t layers);
/* -1 when layer is out of range; 0 otherwise (repeats are harmless). */
int pdx_xfer_sm_computed(struct pdx_xfer_sm *sm, uint32_t layer);
/* No layer computed yet. */
bool pdx_xfer_sm_none_computed(const struct pdx_xfer_sm *sm);
void pdx_xfer_sm_blocks_known(struct pdx_xfer_sm *sm);
/* The next layer to push now (marked pushed), or -1 when none is ready. */
int pdx_xfer_sm_next(struct pdx_xfer_sm *sm);
/* Whether layer is ready to push now (nothing marked). */
bool pdx_xfer_sm_ready(const struct pdx_xfer_sm *sm, uint32_t layer);
/* How many layers from `layer` on are ready in a row (marked pushed), at
 * most max: one GPU launch can move them together. */
uint32_t pdx_xfer_sm_take_run(struct pdx_xfer_sm *sm, uint32_t layer,
			      uint32_t max);
void pdx_xfer_sm_op_started(struct pdx_xfer_sm *sm);
void pdx_xfer_sm_op_finished(struct pdx_xfer_sm *sm);
/* True exactly once: when the flush should start. */
bool pdx_xfer_sm_take_flush(struct pdx_xfer_sm *sm);

#endif
