#include "engine/opts.h"

#include <pdx/engine.h>

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/errbuf.h"
#include "common/log.h"
#include "engine/tp_slice.h"

/* clang-format off */
void pdx_engine_opts_usage(FILE *f)
{
	fprintf(f,
"usage: pdx-engine [options]\n"
"\n"
"The reference engine: an OpenAI-compatible HTTP server over a synthetic\n"
"model with a real paged KV cache in shared memory (docs/engine.md).\n"
"\n"
"  --host H                 listen address (default 127.0.0.1)\n"
"  --port P                 listen port (default 8100; 0: any free port,\n"
"                           printed as \"listening on http://H:P\")\n"
"  --model M                model shape: %s (default tiny)\n"
"  --role R                 both (colocated, default), prefill or decode\n"
"                           (disaggregated: need --agent)\n"
"  --agent ADDR             this engine's pdx-agent, ipc://PATH: the KV\n"
"                           pool is registered with it\n"
"  --kv-timeout-ms N        bound on waiting for a transfer, decode side\n"
"                           (received) and prefill side (sent); default\n"
"                           30000\n"
"  --agent-liveness-ms N    a hung agent is noticed within N ms (a dead\n"
"                           one at once); default 1000\n"
"  --kv-quarantine-ms N     the blocks of a transfer that failed because\n"
"                           the agent went away are reused only after N\n"
"                           ms (the agent, if only hung, or its peer may\n"
"                           still write them until the peer notices:\n"
"                           keep it above the agents' --peer-timeout-ms);\n"
"                           default 6000\n"
"  --kv-blocks N            KV pool size in blocks (default: enough for\n"
"                           16384 tokens; tiny: 4096 blocks, 8 MiB;\n"
"                           llama3-8b: 1024 blocks, 2 GiB; deepseek-v3:\n"
"                           256 blocks, 1.1 GiB)\n"
"  --prefix-cache, --no-prefix-cache\n"
"                           keep a request's full KV blocks after it for\n"
"                           the next prompt that starts with the same\n"
"                           tokens (a decode engine then receives only the\n"
"                           rest), or free them when it ends; default: on\n"
"                           for --role decode, off for the others\n"
"  --kv-device D            where the KV pool lives: host (shared memory,\n"
"                           default) or cuda[:N] (GPU N's memory, 0 by\n"
"                           default; the synthetic model runs there and\n"
"                           the agent opens it with CUDA IPC). Exits 77\n"
"                           when there is no such CUDA device\n"
"  --max-num-seqs N         requests running at once (default 256)\n"
"  --max-waiting N          requests queued beyond those; more get 503\n"
"                           (default 1024)\n"
"  --queue-timeout-ms N     a request queued this long (no running slot\n"
"                           or not all its KV blocks free) gets 503;\n"
"                           keep it under --kv-timeout-ms; 0: no bound\n"
"                           (default 10000)\n"
"  --tp-size N              tensor parallelism: the instance is N\n"
"                           processes (one per rank, N a power of two\n"
"                           that splits the model's KV heads evenly;\n"
"                           an MLA model's latent is on every rank), each\n"
"                           with its own --agent and a KV pool of its\n"
"                           heads only (default 1)\n"
"  --tp-rank R              this process's rank: 0, the leader, serves\n"
"                           HTTP and schedules; the others follow it\n"
"                           (default 0)\n"
"  --tp-leader ADDR         where the ranks meet: the leader binds it,\n"
"                           the others connect (ipc://PATH or\n"
"                           tcp://HOST:PORT; needed with --tp-size > 1)\n"
"  --max-prefill-tokens N   prefill tokens per step, chunked (default 8192)\n"
"  --max-model-len N        prompt plus output tokens (default 8192)\n"
"  --time-scale X           multiplies the modeled compute time; 0: no\n"
"                           sleeping (default 1)\n"
"  --log-level L            error, warn, info, debug (default info)\n"
"  --version                print \"pdx-engine VERSION\" and exit\n"
"  --help                   this text\n",
		pdx_model_names());
}
/* clang-format on */

enum {
	O_HOST = 256,
	O_PORT,
	O_MODEL,
	O_ROLE,
	O_KV_BLOCKS,
	O_MAX_NUM_SEQS,
	O_MAX_WAITING,
	O_MAX_PREFILL,
	O_MAX_MODEL_LEN,
	O_TIME_SCALE,
	O_LOG_LEVEL,
	O_AGENT,
	O_KV_TIMEOUT,
	O_AGENT_LIVENESS,
	O_KV_QUARANTINE,
	O_KV_DEVICE,
	O_QUEUE_TIMEOUT,
	O_TP_SIZE,
	O_TP_RANK,
	O_TP_LEADER,
	O_PREFIX_CACHE,
	O_NO_PREFIX_CACHE,
	O_HELP,
	O_VERSION,
};

static const struct option long_opts[] = {
    {"host", required_argument, 0, O_HOST},
    {"port", required_argument, 0, O_PORT},
    {"model", required_argument, 0, O_MODEL},
    {"role", required_argument, 0, O_ROLE},
    {"kv-blocks", required_argument, 0, O_KV_BLOCKS},
    {"max-num-seqs", required_argument, 0, O_MAX_NUM_SEQS},
    {"max-waiting", required_argument, 0, O_MAX_WAITING},
    {"queue-timeout-ms", required_argument, 0, O_QUEUE_TIMEOUT},
    {"max-prefill-tokens", required_argument, 0, O_MAX_PREFILL},
    {"max-model-len", required_argument, 0, O_MAX_MODEL_LEN},
    {"time-scale", required_argument, 0, O_TIME_SCALE},
    {"log-level", required_argument, 0, O_LOG_LEVEL},
    {"agent", required_argument, 0, O_AGENT},
    {"kv-timeout-ms", required_argument, 0, O_KV_TIMEOUT},
    {"agent-liveness-ms", required_argument, 0, O_AGENT_LIVENESS},
    {"kv-quarantine-ms", required_argument, 0, O_KV_QUARANTINE},
    {"kv-device", required_argument, 0, O_KV_DEVICE},
    {"tp-size", required_argument, 0, O_TP_SIZE},
    {"tp-rank", required_argument, 0, O_TP_RANK},
    {"tp-leader", required_argument, 0, O_TP_LEADER},
    {"prefix-cache", no_argument, 0, O_PREFIX_CACHE},
    {"no-prefix-cache", no_argument, 0, O_NO_PREFIX_CACHE},
    {"help", no_argument, 0, O_HELP},
    {"version", no_argument, 0, O_VERSION},
    {0, 0, 0, 0},
};

/* A whole decimal number in [lo, hi]. */
static int parse_u32(const char *name, const char *s, unsigned long lo,
		     unsigned long hi, uint32_t *out, char *err, size_t errlen)
{
	unsigned long long v;
	char *end;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || *s == '-' || v < lo || v > hi) {
		pdx_errbuf_set(err, errlen,
			       "--%s: want an integer in [%lu, %lu], got '%s'",
			       name, lo, hi, s);
		return -1;
	}
	*out = (uint32_t)v;
	return 0;
}

static int parse_role(const char *s, enum pdx_engine_role *out, char *err,
		      size_t errlen)
{
	if (strcmp(s, "both") == 0)
		*out = PDX_ROLE_BOTH;
	else if (strcmp(s, "prefill") == 0)
		*out = PDX_ROLE_PREFILL;
	else if (strcmp(s, "decode") == 0)
		*out = PDX_ROLE_DECODE;
	else {
		pdx_errbuf_set(err, errlen,
			       "--role: want both, prefill or decode, got '%s'",
			       s);
		return -1;
	}
	return 0;
}

/* host, cuda or cuda:N. */
static int parse_kv_device(const char *s, struct pdx_engine_opts *o, char *err,
			   size_t errlen)
{
	uint32_t n = 0;

	if (strcmp(s, "host") == 0) {
		o->kv_mem = PDX_MEM_SHM;
		return 0;
	}
	if (strncmp(s, "cuda", 4) != 0 || (s[4] && s[4] != ':') ||
	    (s[4] == ':' && parse_u32("kv-device cuda:", s + 5, 0, 1023, &n,
				      err, errlen) < 0)) {
		pdx_errbuf_set(err, errlen,
			       "--kv-device: want host, cuda or cuda:N "
			       "(N in [0, 1023]), got '%s'",
			       s);
		return -1;
	}
	o->kv_mem = PDX_MEM_CUDA;
	o->cuda_device = (int)n;
	return 0;
}

static int parse_one(int c, const char *arg, struct pdx_engine_opts *o,
		     char *err, size_t errlen)
{
	uint32_t v;
	char *end;

	switch (c) {
	case O_HOST:
		o->host = arg;
		return 0;
	case O_PORT:
		if (parse_u32("port", arg, 0, 65535, &v, err, errlen))
			return -1;
		o->port = (uint16_t)v;
		return 0;
	case O_MODEL:
		o->model = pdx_model_find(arg);
		if (!o->model) {
			pdx_errbuf_set(err, errlen,
				       "--model: unknown '%s' (%s)", arg,
				       pdx_model_names());
			return -1;
		}
		return 0;
	case O_ROLE:
		return parse_role(arg, &o->role, err, errlen);
	case O_KV_BLOCKS:
		return parse_u32("kv-blocks", arg, 1, 1u << 24, &o->kv_blocks,
				 err, errlen);
	case O_MAX_NUM_SEQS:
		return parse_u32("max-num-seqs", arg, 1, 65536,
				 &o->max_num_seqs, err, errlen);
	case O_MAX_WAITING:
		return parse_u32("max-waiting", arg, 0, 1u << 20,
				 &o->max_waiting, err, errlen);
	case O_QUEUE_TIMEOUT:
		return parse_u32("queue-timeout-ms", arg, 0, 3600000,
				 &o->queue_timeout_ms, err, errlen);
	case O_MAX_PREFILL:
		return parse_u32("max-prefill-tokens", arg, 1, 1u << 24,
				 &o->max_prefill_tokens, err, errlen);
	case O_MAX_MODEL_LEN:
		return parse_u32("max-model-len", arg, 2, 1u << 24,
				 &o->max_model_len, err, errlen);
	case O_TIME_SCALE:
		errno = 0;
		o->time_scale = strtod(arg, &end);
		if (errno || end == arg || *end || !isfinite(o->time_scale) ||
		    o->time_scale < 0 || o->time_scale > 1e6) {
			pdx_errbuf_set(
			    err, errlen,
			    "--time-scale: want a number in [0, 1e6], got '%s'",
			    arg);
			return -1;
		}
		return 0;
	case O_AGENT:
		if (strncmp(arg, "ipc://", 6) != 0 || !arg[6]) {
			pdx_errbuf_set(err, errlen,
				       "--agent: want ipc://PATH, got '%s'",
				       arg);
			return -1;
		}
		o->agent = arg;
		return 0;
	case O_KV_TIMEOUT:
		return parse_u32("kv-timeout-ms", arg, 1, 3600000,
				 &o->kv_timeout_ms, err, errlen);
	case O_AGENT_LIVENESS:
		return parse_u32("agent-liveness-ms", arg, 4, 600000,
				 &o->agent_liveness_ms, err, errlen);
	case O_KV_QUARANTINE:
		return parse_u32("kv-quarantine-ms", arg, 0, 3600000,
				 &o->kv_quarantine_ms, err, errlen);
	case O_KV_DEVICE:
		return parse_kv_device(arg, o, err, errlen);
	case O_TP_SIZE:
		return parse_u32("tp-size", arg, 1, PDX_TP_MAX, &o->tp_size,
				 err, errlen);
	case O_TP_RANK:
		return parse_u32("tp-rank", arg, 0, PDX_TP_MAX - 1,
				 &o->tp_rank, err, errlen);
	case O_TP_LEADER:
		if (strncmp(arg, "ipc://", 6) && strncmp(arg, "tcp://", 6)) {
			pdx_errbuf_set(err, errlen,
				       "--tp-leader: want ipc://PATH or "
				       "tcp://HOST:PORT, got '%s'",
				       arg);
			return -1;
		}
		o->tp_leader = arg;
		return 0;
	case O_PREFIX_CACHE:
	case O_NO_PREFIX_CACHE:
		o->prefix_cache = c == O_PREFIX_CACHE;
		return 0;
	case O_LOG_LEVEL:
		if (pdx_log_set_level(arg) < 0) {
			pdx_errbuf_set(err, errlen,
				       "--log-level: want error, warn, info or "
				       "debug, got '%s'",
				       arg);
			return -1;
		}
		o->log_level = arg;
		return 0;
	}
	return -1;
}

/* A TP split that works: the model's heads split, each rank with its
 * own agent (its pool is its own), a place to meet. */
static int check_tp(const struct pdx_engine_opts *o, char *err, size_t errlen)
{
	struct pdx_tp_slice slice;
	char why[200];

	if (pdx_tp_slice(o->model, o->tp_size, o->tp_rank, &slice, why,
			 sizeof(why))) {
		pdx_errbuf_set(err, errlen, "--tp-size/--tp-rank: %s", why);
		return -1;
	}
	if (o->tp_size == 1)
		return 0;
	if (!o->tp_leader || !o->agent) {
		pdx_errbuf_set(err, errlen,
			       "--tp-size %u needs --tp-leader and --agent "
			       "(every rank registers its KV heads with its "
			       "own agent)",
			       o->tp_size);
		return -1;
	}
	if (o->kv_mem != PDX_MEM_SHM) {
		pdx_errbuf_set(err, errlen,
			       "--tp-size %u: tensor parallelism runs in host "
			       "memory only (not yet with --kv-device cuda)",
			       o->tp_size);
		return -1;
	}
	return 0;
}

enum pdx_engine_opts_result pdx_engine_opts_parse(int argc, char **argv,
						  struct pdx_engine_opts *o,
						  char *err, size_t errlen)
{
	int c;

	*o = (struct pdx_engine_opts){
	    .host = "127.0.0.1",
	    .port = 8100,
	    .model = pdx_model_find("tiny"),
	    .role = PDX_ROLE_BOTH,
	    .max_num_seqs = 256,
	    .max_waiting = 1024,
	    .queue_timeout_ms = 10000,
	    .max_prefill_tokens = 8192,
	    .max_model_len = 8192,
	    .time_scale = 1.0,
	    .log_level = "info",
	    .kv_timeout_ms = 30000,
	    .agent_liveness_ms = 1000,
	    .kv_quarantine_ms = 6000,
	    .tp_size = 1,
	    .prefix_cache = -1,
	};
	optind = 0; /* glibc: full reinitialisation */
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
		if (c == O_HELP)
			return PDX_OPTS_HELP;
		if (c == O_VERSION)
			return PDX_OPTS_VERSION;
		if (c == '?' || c == ':') {
			pdx_errbuf_set(err, errlen,
				       "unknown option or missing value: '%s'",
				       argv[optind - 1]);
			return PDX_OPTS_BAD;
		}
		if (parse_one(c, optarg, o, err, errlen))
			return PDX_OPTS_BAD;
	}
	/* libpdx's own lines too, whatever PDX_LOG_LEVEL says: set to
	 * error there, it hid the warning saying why the engine could not
	 * reach its agent */
	pdx_engine_set_log_level(o->log_level);
	if (o->kv_blocks == 0)
		o->kv_blocks = (PDX_ENGINE_DEFAULT_KV_TOKENS +
				o->model->block_tokens - 1) /
			       o->model->block_tokens;
	/* where a hit saves a transfer; a prefill or colocated engine
	 * computes every prompt unless asked, as its timings assume */
	if (o->prefix_cache < 0)
		o->prefix_cache = o->role == PDX_ROLE_DECODE;
	if (o->role != PDX_ROLE_BOTH && !o->agent) {
		pdx_errbuf_set(err, errlen, "--role %s needs --agent",
			       pdx_engine_role_name(o->role));
		return PDX_OPTS_BAD;
	}
	if (optind < argc) {
		pdx_errbuf_set(err, errlen, "unexpected argument '%s'",
			       argv[optind]);
		return PDX_OPTS_BAD;
	}
	return check_tp(o, err, errlen) ? PDX_OPTS_BAD : PDX_OPTS_RUN;
}

const char *pdx_engine_role_name(enum pdx_engine_role r)
{
	return r == PDX_ROLE_PREFILL  ? "prefill"
	       : r == PDX_ROLE_DECODE ? "decode"
				      : "both";
}
