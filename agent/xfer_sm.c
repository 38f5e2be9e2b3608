#include "agent/xfer_sm.h"

#include <string.h>

static void set_bit(uint64_t *v, uint32_t i)
{
	v[i / 64] |= 1ULL << (i % 64);
}

static bool test_bit(const uint64_t *v, uint32_t i)
{
	return v[i / 64] & (1ULL << (i % 64));
}

void pdx_xfer_sm_init(struct pdx_xfer_sm *sm, uint32_t layers)
{
	memset(sm, 0, sizeof(*sm));
	sm->layers = layers;
}

int pdx_xfer_sm_computed(struct pdx_xfer_sm *sm, uint32_t layer)
{
	if (layer >= sm->layers)
		return -1;
	set_bit(sm->computed, layer);
	return 0;
}

bool pdx_xfer_sm_none_computed(const struct pdx_xfer_sm *sm)
{
	for (size_t w = 0; w < sizeof(sm->computed) / sizeof(*sm->computed);
	     w++)
		if (sm->computed[w])
			return false;
	return true;
}

void pdx_xfer_sm_blocks_known(struct pdx_xfer_sm *sm)
{
	sm->blocks_known = true;
}

int pdx_xfer_sm_next(struct pdx_xfer_sm *sm)
{
	if (!sm->blocks_known)
		return -1;
	for (uint32_t w = 0; w < (sm->layers + 63) / 64; w++) {
		uint64_t ready = sm->computed[w] & ~sm->pushed[w];

		if (ready) {
			uint32_t l = w * 64 + (uint32_t)__builtin_ctzll(ready);

			set_bit(sm->pushed, l);
			sm->pushed_count++;
			return (int)l;
		}
	}
	return -1;
}

bool pdx_xfer_sm_ready(const struct pdx_xfer_sm *sm, uint32_t layer)
{
	return layer < sm->layers && sm->blocks_known &&
	       test_bit(sm->computed, layer) && !test_bit(sm->pushed, layer);
}

uint32_t pdx_xfer_sm_take_run(struct pdx_xfer_sm *sm, uint32_t layer,
			      uint32_t max)
{
	uint32_t n = 0;

	while (n < max && layer + n < sm->layers && sm->blocks_known &&
	       test_bit(sm->computed, layer + n) &&
	       !test_bit(sm->pushed, layer + n)) {
		set_bit(sm->pushed, layer + n);
		sm->pushed_count++;
		n++;
	}
	return n;
}

void pdx_xfer_sm_op_started(struct pdx_xfer_sm *sm)
{
	sm->inflight++;
}

void pdx_xfer_sm_op_finished(struct pdx_xfer_sm *sm)
{
	sm->inflight--;
}

bool pdx_xfer_sm_take_flush(struct pdx_xfer_sm *sm)
{
	if (sm->flush_started || sm->pushed_count < sm->layers || sm->inflight)
		return false;
	sm->flush_started = true;
	return true;
}
