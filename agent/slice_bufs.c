/* The buffers a TP leg's slices pass through on their way between two
 * agents' blocks, where UCX cannot move them as they lie: packed for the
 * am lane's slice messages (am_slice.c), and the sender's whole blocks a
 * pull reads on the put lane before it copies its heads out (pull.c).
 *
 * Memory is bounded: an agent holds at most SLICE_BUDGET bytes of
 * buffers that UCX has not finished with (slice_buf_count()), and at
 * most SLICE_PEER_SHARE of them with one peer, plus what crossed either
 * (a push's layer, a pull's buffer); what then finds no room waits, in
 * order for each peer, and goes on when finished buffers give theirs
 * back (slice_bufs_resume()). The share is half the budget, and a peer
 * counts against the budget for its share at most (a layer may take it
 * past), so that a peer that stops answering holds back only its own
 * transfers until it is found dead: the other half stays for the rest.
 * Buffers of SLICE_BUF_MAX are kept for the next use: fresh ones cost
 * more in page faults than the copy into them; small ones come from
 * malloc's heap. */
#include <stdlib.h>
#include <utlist.h>

#include "agent/agent.h"
#include "common/log.h"

#define SLICE_KEEP 64
#define SLICE_SMALL (SLICE_BUF_MAX / 16)
/* Measured (docs/benchmarking.md, "TP legs over TCP"): one receiver's
 * 16 MiB in flight ran as fast as 32 MiB, and 64 MiB for the agent ran
 * slower than 32 MiB (more buffers than are kept: fresh pages) */
#define SLICE_PEER_SHARE ((uint64_t)16 * SLICE_BUF_MAX)
#define SLICE_BUDGET (2 * SLICE_PEER_SHARE)

/* What of x found no room (layer: a push's), and how it goes on. */
struct slice_wait {
	struct slice_wait *next, *prev;
	struct xfer *x; /* held: it and its peer stay */
	uint32_t layer;
	slice_resume_fn resume;
};

struct slice_buf *slice_buf_get(struct agent *a, struct xfer *x, size_t len)
{
	/* a small one from malloc's heap: a kept one would count
	 * SLICE_BUF_MAX against the bound for it */
	size_t cap = len > SLICE_BUF_MAX || len <= SLICE_SMALL ? len
							       : SLICE_BUF_MAX;
	struct slice_buf *b = a->slices.bufs;

	if (cap == SLICE_BUF_MAX && b) {
		DL_DELETE(a->slices.bufs, b);
		a->slices.n_bufs--;
	} else if ((b = malloc(sizeof(*b) + cap)) == NULL) {
		return NULL;
	}
	*b = (struct slice_buf){ .agent = a, .x = x, .len = len, .cap = cap };
	DL_PREPEND(a->slices.live, b);
	return b;
}

static uint64_t share_of(uint64_t out)
{
	return out < SLICE_PEER_SHARE ? out : SLICE_PEER_SHARE;
}

/* p's bytes out become out: the agent's too, its share only of them
 * against the budget. */
static void peer_out(struct slice_bufs *s, struct peer *p, uint64_t out)
{
	s->shares_out = s->shares_out - share_of(p->slice_out) + share_of(out);
	p->slice_out = out;
}

void slice_buf_count(struct agent *a, struct slice_buf *b)
{
	struct peer *p = b->x->peer;

	b->counted = true;
	peer_out(&a->slices, p, p->slice_out + b->cap);
	a->slices.bytes_out += b->cap;
}

void slice_buf_put(struct agent *a, struct slice_buf *b)
{
	if (b->counted) {
		a->slices.bytes_out -= b->cap;
		/* b->x is held until b is put, but at stop it and its
		 * peer are freed first */
		if (!a->slices.stopping)
			peer_out(&a->slices, b->x->peer,
				 b->x->peer->slice_out - b->cap);
	}
	DL_DELETE(a->slices.live, b);
	if (b->cap != SLICE_BUF_MAX || a->slices.n_bufs >= SLICE_KEEP ||
	    a->slices.stopping) {
		free(b);
		return;
	}
	DL_PREPEND(a->slices.bufs, b);
	a->slices.n_bufs++;
}

uint32_t slice_buf_blocks(uint64_t per)
{
	return per < SLICE_BUF_MAX ? (uint32_t)(SLICE_BUF_MAX / per) : 1;
}

static bool room_for(const struct slice_bufs *s, const struct peer *p)
{
	return s->shares_out < SLICE_BUDGET && p->slice_out < SLICE_PEER_SHARE;
}

bool slice_bufs_room(const struct xfer *x)
{
	/* with something of its peer waiting there is none: buffers are in
	 * flight, and the first to end resumes it. What waits for another
	 * peer waits for its own share, or for the budget, which then is
	 * spent: each buffer's end resumes what may go before anything
	 * else takes room. */
	return !x->peer->slice_waits && room_for(&x->agent->slices, x->peer);
}

pdx_status_t slice_bufs_wait(struct xfer *x, uint32_t layer,
			     slice_resume_fn resume)
{
	struct slice_wait *w = malloc(sizeof(*w));

	if (!w)
		return PDX_ENOMEM;
	*w = (struct slice_wait){ .x = x, .layer = layer, .resume = resume };
	xfer_hold_wait(x);
	x->peer->slice_waits++;
	x->agent->slices.waited++;
	log_debug("transfer with %s waits at layer %u: %llu bytes of "
		  "slices in flight, %llu of them with it", x->peer_addr, layer,
		  (unsigned long long)x->agent->slices.bytes_out,
		  (unsigned long long)x->peer->slice_out);
	DL_APPEND(x->agent->slices.waits, w);
	return PDX_OK;
}

static void resume_one(struct slice_bufs *s, struct slice_wait *w)
{
	DL_DELETE(s->waits, w);
	w->x->peer->slice_waits--;
	xfer_unhold_wait(w->x);
	w->resume(w->x, w->layer);
	free(w);
}

/* The wait to end next: the first of a transfer that finished
 * meanwhile (it needs no room, and ends now, not in its turn, so that
 * its transfer is released: its event, the word owed to its peer), else
 * the first whose peer has room (a peer's waits are in order: its first
 * has room when any has). */
static struct slice_wait *next_wait(struct slice_bufs *s)
{
	struct slice_wait *w;

	DL_FOREACH(s->waits, w)
		if (w->x->finished)
			return w;
	DL_FOREACH(s->waits, w)
		if (room_for(s, w->x->peer))
			return w;
	return NULL;
}

void slice_bufs_resume(struct agent *a)
{
	struct slice_bufs *s = &a->slices;
	struct slice_wait *w;

	/* a resume may end buffers at once (an endpoint closed calls its
	 * operations back), which calls this again: the outer call goes on
	 * from the list as it is then (next_wait looks at it afresh) */
	if (s->resuming)
		return;
	s->resuming = true;
	while (!s->stopping && (w = next_wait(s)) != NULL)
		resume_one(s, w);
	s->resuming = false;
}

void slice_bufs_stop(struct agent *a)
{
	struct slice_wait *w, *tmp;

	DL_FOREACH_SAFE(a->slices.waits, w, tmp) {
		DL_DELETE(a->slices.waits, w);
		free(w);
	}
	a->slices.stopping = true;
}

void slice_bufs_free(struct agent *a)
{
	struct slice_buf *b, *tmp;

	DL_FOREACH_SAFE(a->slices.bufs, b, tmp)
		free(b);
	/* operations UCX never called back for (pdx_ucx_stop) */
	DL_FOREACH_SAFE(a->slices.live, b, tmp)
		free(b);
	a->slices = (struct slice_bufs){ .stopping = true };
}
