/* Transfers that ended here, remembered (the newest `cap` of them) so that
 * a late message about one gets a clear answer at once instead of starting
 * a wait: a "want" after the sender's lease expired is refused with why,
 * and an engine announcing a transfer its peer already aborted hears
 * "failed" now rather than at its timeout. Pure data, no I/O. */
#ifndef PDX_AGENT_ENDED_H
#define PDX_AGENT_ENDED_H

#include <stdint.h>

#include <pdx/engine.h>

struct pdx_ended;

/* NULL when out of memory (or cap is 0). */
struct pdx_ended *pdx_ended_new(uint32_t cap);
void pdx_ended_free(struct pdx_ended *s);
/* id, a transfer with peer, ended for reason; the oldest entry makes room
 * when full. An id already there is updated in place. */
void pdx_ended_add(struct pdx_ended *s, const struct pdx_xfer_id *id,
		   const char *peer, const char *reason);
/* Why id, a transfer with peer, ended; NULL when it did not (or with
 * another peer). One that ended open, with no peer (no agent claimed it),
 * is any peer's; peer NULL: with whichever peer. */
const char *pdx_ended_find(const struct pdx_ended *s,
			   const struct pdx_xfer_id *id, const char *peer);

#endif
