/* pdx-xferbench --one-block's transfers and trace lines
 * (xb_one_block.h). */
#include "bench/xb_one_block.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/xb_fail.h"
#include "bench/xfer_ctl.h"

void xb_one_block_trace(void *arg, const char *line)
{
	struct xb_one_block *ob = arg;
	uint64_t marks[MARK_N];
	char hex[33];
	bool send;

	if (!xc_trace_parse(line, hex, &send, marks))
		return;
	for (uint32_t i = 0; i < ob->n; i++) {
		if (strcmp(ob->s[i].hex, hex))
			continue;
		memcpy(send ? ob->s[i].p : ob->s[i].d, marks, sizeof(marks));
		return;
	}
}

/* Each transfer is followed by a ping over the decode agent's engine link
 * after as long a quiet as the transfer's, so that both see the same
 * machine. The layers come ONE_BLOCK_LAYER_MS apart (or --layer-ms), so
 * the agent is idle when the last one is computed: what follows it is
 * that layer's copy and the control path. */
void xb_one_block_run(struct xb_run *r, struct xb_one_block *ob)
{
	const struct xb_opts *o = r->o;
	struct xb_plan *plan = r->plan;
	struct xb_node *D = r->decode;
	double layer_ms = o->layer_ms > 0 ? o->layer_ms : ONE_BLOCK_LAYER_MS;
	struct xb_round rd;
	struct xb_ack ack;

	ob->s = calloc(o->one_block, sizeof(*ob->s));
	if (!ob->s)
		xb_fail("out of memory");
	/* the run's own transfer (not --versus's variant), whole */
	*plan->shape = (struct xb_shape){
		.conc = 1, .nblocks = 1, .pull = r->arm[0].shape.pull,
		.prefill_tp = 1, .decode_tp = 1 };
	for (uint32_t i = 0; i < ONE_BLOCK_WARMUP + o->one_block; i++) {
		struct xb_ob_sample *smp = i < ONE_BLOCK_WARMUP ? NULL :
								 &ob->s[ob->n];

		if (pdx_xfer_id_random(&plan->ids[0]) != PDX_OK)
			xb_fail("cannot draw a transfer id");
		plan->seeds[0] = pdx_splitmix64(&r->rng);
		pb_pick_blocks(plan->src, 1, plan->pool_blocks, false, &r->rng);
		pb_pick_blocks(plan->dst, 1, plan->pool_blocks, false, &r->rng);
		if (smp) { /* before its trace lines can come */
			pdx_xfer_id_hex(&plan->ids[0], smp->hex);
			ob->n++;
		}
		xb_tp_round(plan, &r->pre, r->arm[0].dec, -1, layer_ms, &rd);
		if (!rd.verified) {
			fprintf(stderr, "pdx-xferbench: MISMATCH: %s\n",
				rd.reason);
			r->arm[0].res.verified = false;
		}
		xb_node_cmd(D, CMD_PING, -1, o->model->layers * layer_ms, NULL);
		xb_nodes_wait(&D, 1, &ack, ACK_TIMEOUT_MS, "ping");
		if (!smp)
			continue;
		smp->t_ld = rd.last_ld;
		smp->t_ev = xb_plan_row(plan, plan->t_recv, D->row)[0];
		smp->rtt_ns = ack.rtt_ns;
	}
}
