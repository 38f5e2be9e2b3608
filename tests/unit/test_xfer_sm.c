/* Every order of "blocks known" and "layer computed" events, with every
 * layer's operations finishing at any point: each layer is pushed exactly
 * once, never before both its conditions hold, and the flush comes once,
 * after the last operation. */
#include "agent/xfer_sm.h"
#include "tests/check.h"

#define LAYERS 4
#define EVENTS (LAYERS + 1) /* event LAYERS = blocks known */

static int runs;

static void run_order(const int *order, int finish_early)
{
	struct pdx_xfer_sm sm;
	int pushed[LAYERS] = { 0 }, computed[LAYERS] = { 0 }, known = 0;
	int flushes = 0, outstanding = 0;

	pdx_xfer_sm_init(&sm, LAYERS);
	for (int e = 0; e < EVENTS; e++) {
		int layer;

		if (order[e] == LAYERS) {
			pdx_xfer_sm_blocks_known(&sm);
			known = 1;
		} else {
			CHECK_EQ(pdx_xfer_sm_computed(&sm, (uint32_t)order[e]), 0);
			computed[order[e]] = 1;
		}
		while ((layer = pdx_xfer_sm_next(&sm)) >= 0) {
			CHECK(known && computed[layer]);
			pushed[layer]++;
			pdx_xfer_sm_op_started(&sm);
			pdx_xfer_sm_op_started(&sm);
			outstanding += 2;
		}
		if (finish_early) {
			while (outstanding) {
				pdx_xfer_sm_op_finished(&sm);
				outstanding--;
				flushes += pdx_xfer_sm_take_flush(&sm);
			}
		} else {
			CHECK(!pdx_xfer_sm_take_flush(&sm) || outstanding == 0);
		}
	}
	while (outstanding) {
		CHECK(!pdx_xfer_sm_take_flush(&sm));
		pdx_xfer_sm_op_finished(&sm);
		outstanding--;
		flushes += pdx_xfer_sm_take_flush(&sm);
	}
	for (int l = 0; l < LAYERS; l++)
		CHECK_EQ(pushed[l], 1);
	CHECK_EQ(flushes, 1);
	CHECK(!pdx_xfer_sm_take_flush(&sm));
	runs++;
}

static void permute(int *v, int k)
{
	if (k == EVENTS) {
		run_order(v, 0);
		run_order(v, 1);
		return;
	}
	for (int i = k; i < EVENTS; i++) {
		int t = v[k];

		v[k] = v[i];
		v[i] = t;
		permute(v, k + 1);
		v[i] = v[k];
		v[k] = t;
	}
}

int main(void)
{
	int order[EVENTS];
	struct pdx_xfer_sm sm;

	for (int i = 0; i < EVENTS; i++)
		order[i] = i;
	permute(order, 0);
	CHECK_EQ(runs, 2 * 120);

	/* Out of range layers are refused; repeats push once. */
	pdx_xfer_sm_init(&sm, 2);
	CHECK_EQ(pdx_xfer_sm_computed(&sm, 2), -1);
	pdx_xfer_sm_computed(&sm, 1);
	pdx_xfer_sm_computed(&sm, 1);
	pdx_xfer_sm_blocks_known(&sm);
	CHECK_EQ(pdx_xfer_sm_next(&sm), 1);
	CHECK_EQ(pdx_xfer_sm_next(&sm), -1);
	CHECK(!pdx_xfer_sm_take_flush(&sm));

	/* Runs of ready layers, taken together. */
	pdx_xfer_sm_init(&sm, 8);
	for (uint32_t l = 0; l < 8; l++)
		if (l != 5)
			pdx_xfer_sm_computed(&sm, l);
	CHECK_EQ(pdx_xfer_sm_take_run(&sm, 0, 8), 0u); /* blocks unknown */
	pdx_xfer_sm_blocks_known(&sm);
	CHECK_EQ(pdx_xfer_sm_next(&sm), 0);
	CHECK_EQ(pdx_xfer_sm_take_run(&sm, 1, 2), 2u); /* at most max */
	CHECK_EQ(pdx_xfer_sm_take_run(&sm, 3, 8), 2u); /* 3, 4; 5 not ready */
	CHECK_EQ(pdx_xfer_sm_take_run(&sm, 4, 8), 0u); /* already pushed */
	CHECK_EQ(pdx_xfer_sm_next(&sm), 6);
	CHECK_EQ(pdx_xfer_sm_take_run(&sm, 7, 8), 1u); /* to the last */
	pdx_xfer_sm_computed(&sm, 5);
	CHECK_EQ(pdx_xfer_sm_next(&sm), 5);
	CHECK_EQ(sm.pushed_count, 8u);
	CHECK(pdx_xfer_sm_take_flush(&sm));

	/* Layers beyond the first bitmap word. */
	pdx_xfer_sm_init(&sm, 130);
	pdx_xfer_sm_computed(&sm, 129);
	pdx_xfer_sm_blocks_known(&sm);
	CHECK_EQ(pdx_xfer_sm_next(&sm), 129);
	printf("%d event orders checked\n", runs);
	CHECK_DONE();
}
