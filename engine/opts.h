/* pdx-engine's command line: parsed into plain values, checked, never
 * logged here (the caller prints the reason and exits 2).
 *
 * Pure; one thread.
 */
#ifndef PDX_ENGINE_OPTS_H
#define PDX_ENGINE_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <pdx/engine.h>

#include "common/models.h"

enum pdx_engine_role {
	PDX_ROLE_BOTH,	  /* colocated: prefill and decode here */
	PDX_ROLE_PREFILL, /* disaggregated roles: need an agent */
	PDX_ROLE_DECODE,
};

/* The default pool holds this many tokens, whatever the model. */
#define PDX_ENGINE_DEFAULT_KV_TOKENS 16384

struct pdx_engine_opts {
	const char *host;	       /* listen address: 127.0.0.1 */
	uint16_t port;		       /* 8100 */
	const struct pdx_model *model; /* tiny */
	enum pdx_engine_role role;     /* both */
	uint32_t kv_blocks;	       /* pool size: DEFAULT_KV_TOKENS' worth */
	enum pdx_mem_type kv_mem;      /* where the pool lives: shm */
	int cuda_device;	       /* kv_mem cuda: the device, 0 */
	uint32_t max_num_seqs;	       /* running at once: 256 */
	uint32_t max_waiting;	       /* queued beyond those: 1024 */
	uint32_t queue_timeout_ms;     /* longest wait queued: 10000 */
	uint32_t max_prefill_tokens;   /* prefill tokens per step: 8192 */
	uint32_t max_model_len;	       /* prompt + output tokens: 8192 */
	double time_scale;	       /* modeled time factor; 0: no sleep */
	const char *log_level;	       /* info */
	const char *agent;	/* ipc://PATH of its pdx-agent, or NULL */
	uint32_t kv_timeout_ms; /* bound on a transfer's wait: 30000 */
	uint32_t agent_liveness_ms; /* a hung agent noticed within: 1000 */
	uint32_t kv_quarantine_ms;  /* blocks of a transfer failed because
				       the agent went away: 6000 */
	uint32_t tp_size;      /* ranks of a tensor-parallel instance: 1 */
	uint32_t tp_rank;      /* this one's: 0 (the leader) */
	const char *tp_leader; /* the leader's rank link, tp_size > 1 */
	/* keep full blocks for the next prompt that starts with them:
	 * --prefix-cache, --no-prefix-cache; on for --role decode */
	int prefix_cache; /* 1 on, 0 off (-1 while parsing: not given) */
};

enum pdx_engine_opts_result {
	PDX_OPTS_RUN = 0,
	PDX_OPTS_HELP = 1, /* --help: usage printed, exit 0 */
	PDX_OPTS_VERSION = 2, /* --version: the version printed, exit 0 */
	PDX_OPTS_BAD = -1, /* reason in err: exit 2 */
};

/* Fills o from argv (defaults first). getopt state is reset, so it may be
 * called more than once (tests). */
enum pdx_engine_opts_result pdx_engine_opts_parse(int argc, char **argv,
						  struct pdx_engine_opts *o,
						  char *err, size_t errlen);

void pdx_engine_opts_usage(FILE *f);

/* "both", "prefill" or "decode", as --role takes it. */
const char *pdx_engine_role_name(enum pdx_engine_role r);

#endif
