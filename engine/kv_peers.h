/* The agents of the other side of a transfer, one per rank of its
 * tensor-parallel instance, rank order (kv_transfer_params' remote_agents,
 * or its remote_agent alone). Which of them a rank's agent deals with is
 * kv_link.c's rule: rank r's pair at equal TP sizes, else those that hold
 * its heads, picked by the agent. Plain data. */
#ifndef PDX_ENGINE_KV_PEERS_H
#define PDX_ENGINE_KV_PEERS_H

#include <stdint.h>

#include <pdx/engine.h>

#include "engine/tp_slice.h"

struct pdx_kv_peers {
	uint32_t n; /* 0: none known (a send is then open) */
	char addr[PDX_TP_MAX][PDX_ADDR_MAX];
};

#endif
