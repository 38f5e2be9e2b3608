/* The agents of the other side of a transfer, one per rank of its
 * tensor-parallel instance (kv_transfer_params' remote_agents): rank r of
 * this instance pairs with addr[r] of that one, TP sizes being equal.
 * Plain data. */
#ifndef PDX_ENGINE_KV_PEERS_H
#define PDX_ENGINE_KV_PEERS_H

#include <stdint.h>

#include <pdx/engine.h>

#include "engine/tp_slice.h"

struct pdx_kv_peers {
	uint32_t n; /* 0: only remote_agent, rank 0's, is known */
	char addr[PDX_TP_MAX][PDX_ADDR_MAX];
};

#endif
