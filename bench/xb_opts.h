/* pdx-xferbench's command line: what a run measures, parsed and checked
 * before anything starts (a bad value exits 2 through xb_bad()), and the
 * --help text, which also explains every figure the report prints. */
#ifndef PDX_BENCH_XB_OPTS_H
#define PDX_BENCH_XB_OPTS_H

#include <stdbool.h>
#include <stdint.h>

#include "bench/xb_plan.h"
#include "common/models.h"

/* Numbers the --help text quotes, so they are defined beside it. */
#define MAX_ITERS 10000          /* --iters at most */
#define YARD_REPS 9              /* timed copies per GPU yardstick */
#define ONE_BLOCK_WARMUP 10      /* --one-block: transfers not counted */
#define ONE_BLOCK_LAYER_MS 0.1   /* its layers this far apart, unless
				  * --layer-ms says */

#define XB_AGENT_ARGS_MAX 8

/* How long an engine waits for one iteration's "received" (decode) or
 * "sent" (prefill) events: the agents' bound on a transfer
 * (--xfer-timeout-ms, else XB_AGENT_XFER_TIMEOUT_MS, pdx-agent's default),
 * plus the modeled compute (layers x --layer-ms), plus XB_EVENT_GRACE_MS
 * for an agent's "failed" to arrive after its own bound. Past it the run
 * fails saying so (an agent that neither finished nor failed the
 * transfer). */
#define XB_AGENT_XFER_TIMEOUT_MS 30000
#define XB_EVENT_GRACE_MS 5000

struct xb_opts {
	const char *tls;
	const char *ucx_tls;
	const char *model_name;
	const struct pdx_model *model;
	uint32_t tokens;
	uint32_t skip_tokens;
	bool random_blocks;
	uint32_t concurrency;
	double layer_ms;
	uint32_t iters;
	bool json;
	char agent_bin[4096];
	const char *data_path;
	bool pull;            /* the decode agent reads (pdx_engine_recv_opts) */
	uint32_t xfer_timeout_ms;
	const char *agent_args[XB_AGENT_ARGS_MAX + 1]; /* --agent-arg, in order */
	uint32_t n_agent_args;
	uint64_t seed;
	bool cuda;            /* --mem cuda[:DEVICE] */
	int cuda_dev;
	int decode_dev;       /* --decode-device, default cuda_dev */
	char mem[24];         /* "shm", "cuda:N" or "cuda:P,D", as reported */
	uint32_t one_block;   /* --one-block N: one-block transfers measured */
	uint32_t prefill_tp, decode_tp; /* --prefill-tp, --decode-tp */
	enum pdx_kv_order order;        /* --order: the prefill pools' */
	enum pdx_kv_order decode_order; /* --decode-order, default --order */
	const char *versus;   /* --versus WHAT, or NULL */
	/* the arms' transfers: [0] the run's own, [1] --versus's variant */
	struct xb_shape arm[2];
	uint32_t n_arms;
};

/* Fills o from argv (o zeroed by the caller); --help prints and exits 0,
 * anything wrong exits 2. */
void xb_opts_parse(int argc, char **argv, struct xb_opts *o);

/* The longest modeled compute per layer of the run, ms: --layer-ms, or
 * --one-block's own spacing. */
double xb_opts_layer_ms(const struct xb_opts *o);
/* The engines' wait for one iteration's events, ms (above). */
uint64_t xb_opts_event_wait_ms(const struct xb_opts *o);

#endif
