/* pdx-xferbench's tensor-parallel sides (--prefill-tp, --decode-tp): a
 * side is one node (agent and engine, bench/xb_nodes.h) per rank, each
 * rank's pool holding its share of the model's KV heads (MLA: the whole
 * latent). A transfer goes from every prefill rank to every decode rank of
 * one decode side, the way an engine pairs its ranks (docs/protocol.md,
 * "TP legs"): at equal sizes rank i sends to rank i, naming it; otherwise
 * each prefill rank sends open and each decode rank's recv names every
 * prefill rank, its agent taking its heads from the ranks that hold them.
 *
 * The run measures one prefill side and one decode side per TP size its
 * arms ask for (--versus tp: the prefill side's size, and --decode-tp's).
 */
#ifndef PDX_BENCH_XB_TP_H
#define PDX_BENCH_XB_TP_H

#include <stdbool.h>
#include <stdint.h>

#include "bench/xb_nodes.h"
#include "bench/xb_plan.h"

struct xb_side {
	struct xb_node *rank[XB_TP_MAX];
	uint32_t size;
};

/* What one batch of transfers (xb_tp_round()) came to. */
struct xb_round {
	bool verified;                 /* every decode rank's bytes */
	bool rank_verified[XB_TP_MAX]; /* each decode rank's */
	char reason[1024];             /* the first mismatch */
	uint64_t first_ld, last_ld;    /* layer_done, over the prefill ranks */
};

/* Adds the size ranks of one side, their blocks in order, to ns (not
 * started). */
void xb_tp_side_add(struct xb_nodes *ns, struct xb_side *s, const char *role,
		    char tag, uint32_t size, enum pdx_kv_order order,
		    int cuda_dev);

/* Once the nodes are started: the prefill ranks' agents into the plan,
 * for the decode ranks' recvs. */
void xb_tp_peers(struct xb_plan *plan, const struct xb_side *pre);

/* One batch, the plan's shape: pre fills, dec posts its recvs, then pre
 * sends (layer_ms of modeled compute a layer) and dec collects its events;
 * once every rank has, dec checks its bytes. */
void xb_tp_round(struct xb_plan *plan, const struct xb_side *pre,
		 const struct xb_side *dec, int iter, double layer_ms,
		 struct xb_round *out);

/* Transfer x's time stamps across a side: the first rank's send, the last
 * rank's "received" (read by its engine, or agent: emitted by its agent). */
uint64_t xb_tp_first_send(const struct xb_plan *plan,
			  const struct xb_side *pre, uint32_t x);
uint64_t xb_tp_last_recv(const struct xb_plan *plan,
			 const struct xb_side *dec, uint32_t x, bool agent);

#endif
