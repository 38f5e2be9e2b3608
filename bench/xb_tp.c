/* pdx-xferbench's tensor-parallel sides (xb_tp.h). */
#include "bench/xb_tp.h"

#include <stdio.h>
#include <string.h>

#include "bench/xb_fail.h"

void xb_tp_side_add(struct xb_nodes *ns, struct xb_side *s, const char *role,
		    char tag, uint32_t size, enum pdx_kv_order order,
		    int cuda_dev)
{
	if (size > XB_TP_MAX)
		xb_fail("TP %u: more than %d ranks", size, XB_TP_MAX);
	s->size = size;
	for (uint32_t i = 0; i < size; i++) {
		s->rank[i] = xb_nodes_add(ns, role, tag, i, size, cuda_dev);
		s->rank[i]->order = order;
	}
}

void xb_tp_peers(struct xb_plan *plan, const struct xb_side *pre)
{
	for (uint32_t i = 0; i < pre->size; i++)
		snprintf(plan->peers[i], PDX_ADDR_MAX, "%s", pre->rank[i]->peer);
}

/* The agent prefill rank i names in its send: its pair at equal sizes,
 * none (an open send) else. */
static const char *send_peer(const struct xb_side *pre,
			     const struct xb_side *dec, uint32_t i)
{
	return pre->size == dec->size ? dec->rank[i]->peer : NULL;
}

/* ... decode rank j in its recv: its pair, or (NULL) every prefill rank
 * from the plan's list. */
static const char *recv_peer(const struct xb_side *pre,
			     const struct xb_side *dec, uint32_t j)
{
	return pre->size == dec->size ? pre->rank[j]->peer : NULL;
}

void xb_tp_round(struct xb_plan *plan, const struct xb_side *pre,
		 const struct xb_side *dec, int iter, double layer_ms,
		 struct xb_round *out)
{
	struct xb_node *all[2 * XB_TP_MAX];
	struct xb_ack acks[2 * XB_TP_MAX];
	uint32_t np = pre->size, nd = dec->size;
	/* P acks after its compute and its wait for "sent"; D after its wait
	 * for "received", begun before P's compute: never cut short here
	 * what an engine still waits for */
	uint64_t xfer_ms = plan->event_wait_ms +
			   (uint64_t)(plan->model->layers * layer_ms) + 10000;

	for (uint32_t i = 0; i < np; i++)
		xb_node_cmd(pre->rank[i], CMD_FILL, iter, layer_ms, NULL);
	xb_nodes_wait((struct xb_node **)pre->rank, (int)np, acks,
		      ACK_TIMEOUT_MS, "fill");
	for (uint32_t j = 0; j < nd; j++)
		xb_node_cmd(dec->rank[j], CMD_RECV, iter, 0,
			    recv_peer(pre, dec, j));
	xb_nodes_wait((struct xb_node **)dec->rank, (int)nd, acks,
		      ACK_TIMEOUT_MS, "recv");
	for (uint32_t j = 0; j < nd; j++)
		xb_node_cmd(dec->rank[j], CMD_WAIT, iter, 0, NULL);
	for (uint32_t i = 0; i < np; i++)
		xb_node_cmd(pre->rank[i], CMD_SEND, iter, layer_ms,
			    send_peer(pre, dec, i));
	memcpy(all, dec->rank, nd * sizeof(*all));
	memcpy(all + nd, pre->rank, np * sizeof(*all));
	xb_nodes_wait(all, (int)(nd + np), acks,
		      (int)(xfer_ms > ACK_TIMEOUT_MS ? xfer_ms : ACK_TIMEOUT_MS),
		      "transfer");
	/* only now: a rank that checks its bytes while another still
	 * receives would take the CPU its copies need */
	for (uint32_t j = 0; j < nd; j++)
		xb_node_cmd(dec->rank[j], CMD_VERIFY, iter, 0, NULL);
	xb_nodes_wait((struct xb_node **)dec->rank, (int)nd, acks,
		      ACK_TIMEOUT_MS, "verify");

	memset(out, 0, sizeof(*out));
	out->verified = true;
	for (uint32_t j = 0; j < nd; j++) {
		out->rank_verified[j] = acks[j].verified;
		if (acks[j].verified)
			continue;
		if (out->verified)
			snprintf(out->reason, sizeof(out->reason), "%s: %s",
				 dec->rank[j]->name, acks[j].reason);
		out->verified = false;
	}
	out->first_ld = UINT64_MAX;
	for (uint32_t i = 0; i < np; i++) {
		int row = pre->rank[i]->row;

		if (plan->t_first_ld[row] < out->first_ld)
			out->first_ld = plan->t_first_ld[row];
		if (plan->t_last_ld[row] > out->last_ld)
			out->last_ld = plan->t_last_ld[row];
	}
}

uint64_t xb_tp_first_send(const struct xb_plan *plan,
			  const struct xb_side *pre, uint32_t x)
{
	uint64_t t = UINT64_MAX;

	for (uint32_t i = 0; i < pre->size; i++) {
		uint64_t s = xb_plan_row(plan, plan->t_send, pre->rank[i]->row)[x];

		if (s < t)
			t = s;
	}
	return t;
}

uint64_t xb_tp_last_recv(const struct xb_plan *plan,
			 const struct xb_side *dec, uint32_t x, bool agent)
{
	uint64_t t = 0;

	for (uint32_t j = 0; j < dec->size; j++) {
		uint64_t r = xb_plan_row(plan, agent ? plan->t_recv_agent :
						     plan->t_recv,
					 dec->rank[j]->row)[x];

		if (r > t)
			t = r;
	}
	return t;
}
