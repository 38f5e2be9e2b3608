/* pdx-xferbench's options and --help (xb_opts.h). */
#define _GNU_SOURCE
#include "bench/xb_opts.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/pdx_bench.h"
#include "bench/xb_fail.h"
#include "common/clock.h"
#include "common/kv_order.h"
#include "common/version.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: pdx-xferbench [options]\n"
		"\n"
		"Moves synthetic KV caches between two pdx-agent processes through the\n"
		"engine API and reports throughput, latency and correctness.\n"
		"\n"
		"  --tls shm|tcp          UCX transports: sm,self or tcp,self (default shm)\n"
		"  --model NAME           %s (default llama3-8b)\n"
		"  --tokens N             prompt tokens per transfer (default 8192)\n"
		"  --skip-tokens N        tokens the decode side already holds (default 0)\n"
		"  --random-blocks        scattered block ids (default: contiguous)\n"
		"  --concurrency C        transfers per iteration (default 1)\n"
		"  --layer-ms X           modeled compute per layer, ms (default 0)\n"
		"  --iters K              measured iterations, after 1 warm-up (default 5)\n"
		"  --mem shm|cuda[:DEV]   where the engines keep their KV pools: /dev/shm\n"
		"                         (default), or memory of CUDA device DEV (default\n"
		"                         0) shared by CUDA IPC, with per-layer CUDA events;\n"
		"                         exits 77 when there is no such device\n"
		"  --decode-device DEV    with --mem cuda: the decode engine's device\n"
		"                         (default: the prefill engine's), e.g. to move\n"
		"                         KV between two GPUs\n"
		"  --data-path PATH       passed to both agents as is: auto (default), ipc,\n"
		"                         put, am; for GPU memory e.g. cuda-ipc, staged,\n"
		"                         cuda-put\n"
		"  --pull                 the decode agent reads the prefill agent's blocks\n"
		"                         once all layers are computed (default: push)\n"
		"  --prefill-tp P         tensor parallelism: P prefill ranks, each an\n"
		"  --decode-tp D          agent and an engine whose pool holds its share\n"
		"                         of the KV heads (MLA: the whole latent), and D\n"
		"                         decode ranks; powers of two up to %d that split\n"
		"                         the model's heads (default 1 and 1). P != D: the\n"
		"                         agents reshard (open sends, each decode rank's\n"
		"                         recv names every prefill rank); a transfer ends\n"
		"                         at the last decode rank's \"received\"\n"
		"  --order NHD|HND        the order inside a block (default NHD)\n"
		"  --decode-order NHD|HND the decode pools' (default --order): the other\n"
		"                         one, and the agents convert each block\n"
		"  --xfer-timeout-ms N    passed to the agents (default: theirs, %d);\n"
		"                         the engines wait for a transfer's events N +\n"
		"                         layers x --layer-ms + %d ms at most\n"
		"  --agent-arg ARG        one more argument for every agent, after the\n"
		"                         others (repeatable, 8 at most), e.g.\n"
		"                         --agent-arg=--heartbeat-ms --agent-arg=50\n"
		"  --agent-bin PATH       pdx-agent (default: ../agent/pdx-agent beside\n"
		"                         this program)\n"
		"  --seed N               seed for block choice and data (default: random)\n"
		"  --one-block N          then N one-block transfers one after another\n"
		"                         (after %d warm-up), layers %g ms apart (or\n"
		"                         --layer-ms), each followed by a ping over the\n"
		"                         decode agent's engine link; the agents trace\n"
		"                         their steps (PDX_AGENT_TRACE=1)\n"
		"  --versus WHAT          measure a variant beside the run's own transfer\n"
		"                         (the baseline), iterations alternating, both\n"
		"                         verified: pull (the decode agent pulls),\n"
		"                         skip-half (it holds the first half of the\n"
		"                         prompt), skip=N (the first N tokens), tp (with\n"
		"                         --prefill-tp P --decode-tp D: the variant is\n"
		"                         P -> D, the baseline P -> P, the same bytes\n"
		"                         between equal TP sizes), order (the variant's\n"
		"                         decode pools hold the other order than the\n"
		"                         baseline's --decode-order: one of the two arms\n"
		"                         converts)\n"
		"  --json                 one JSON object on stdout, logs on stderr\n"
		"  --version              print \"pdx-xferbench VERSION\" and exit\n"
		"  --help                 this text\n"
		"\n"
		"Figures (JSON keys): gbps = payload bytes / summed wall time from the\n"
		"first send to the last \"received\"; memcpy_gbps = a single-thread\n"
		"memcpy of the same bytes in op_bytes pieces, run before each measured\n"
		"iteration; layer_xfer_ms = transfer time / layers with no compute;\n"
		"exposed_ms = median time from the last layer computed to the decode\n"
		"agent's \"received\" (engine_exposed_ms: to the engine reading it);\n"
		"p50_ms, p99_ms = send posted to \"received\" read, per transfer;\n"
		"data_by = the path the prefill agent logged it moves data by\n"
		"(data_by_decode: the decode agent's). With --one-block:\n"
		"one_block_ctl_us = {p50, p90, mean, n} from the last layer_done called\n"
		"to the decode engine reading \"received\"; zmq_rtt_us = the same of the\n"
		"pings; one_block_ratio = their p50s' ratio; one_block_breakdown_us =\n"
		"{step: {p50, mean}} from the agents' traces (docs/benchmarking.md).\n"
		"With --versus: versus = {what, baseline, variant, time_ratio,\n"
		"mean_time_ratio, exposed_ratio, bytes_ratio}, each arm's figures and\n"
		"the variant's over the baseline's (p50, mean, exposed_ms, bytes the\n"
		"decode agent received); the other keys are the baseline's, but\n"
		"verified covers both. decode_ranks = per decode rank {rank, bytes,\n"
		"event_bytes, verified}: the bytes of its heads per transfer, what its\n"
		"agent's events said, whether all arrived intact.\n"
		"With --mem cuda: d2d_gbps,\n"
		"d2h_gbps = cudaMemcpy of one transfer's bytes device to device and\n"
		"device to pinned host on that GPU (median of %d, timed by CUDA events);\n"
		"d2d_ratio, d2h_ratio = gbps / them.\n",
		pdx_model_names(), XB_TP_MAX, XB_AGENT_XFER_TIMEOUT_MS,
		XB_EVENT_GRACE_MS, ONE_BLOCK_WARMUP,
		ONE_BLOCK_LAYER_MS, YARD_REPS);
}

static uint64_t parse_u64(const char *opt, const char *s, uint64_t lo,
			  uint64_t hi)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi)
		xb_bad("%s: \"%s\" is not an integer in %" PRIu64 "..%" PRIu64, opt, s,
		       lo, hi);
	return v;
}

static enum pdx_kv_order parse_order(const char *opt, const char *s)
{
	enum pdx_kv_order order;

	if (!pdx_kv_order_parse(s, &order))
		xb_bad("%s: \"%s\" is neither NHD nor HND", opt, s);
	return order;
}

static void check_skip(const struct xb_opts *o, const char *opt,
		       uint32_t skip)
{
	if (skip / o->model->block_tokens >=
	    (o->tokens + o->model->block_tokens - 1) / o->model->block_tokens)
		xb_bad("%s %u leaves no block of the %u tokens to move", opt, skip,
		       o->tokens);
}

/* --prefill-tp, --decode-tp: sizes the model's heads split into, on the
 * paths the benchmark checks head by head. */
static void check_tp(const struct xb_opts *o)
{
	const struct pdx_model *m = o->model;
	const uint32_t tp[2] = { o->prefill_tp, o->decode_tp };
	const char *opt[2] = { "--prefill-tp", "--decode-tp" };

	for (int i = 0; i < 2; i++) {
		if (tp[i] & (tp[i] - 1))
			xb_bad("%s %u is not a power of two", opt[i], tp[i]);
		if (m->tensors == 2 && m->kv_heads % tp[i])
			xb_bad("%s %u: %s's %u KV heads do not split into %u",
			       opt[i], tp[i], m->name, m->kv_heads, tp[i]);
	}
	bool converts = o->decode_order != o->order ||
			(o->versus && !strcmp(o->versus, "order"));

	if ((o->order == PDX_KV_HND || o->decode_order == PDX_KV_HND ||
	     converts) && o->cuda)
		xb_bad("HND blocks need --mem shm (the GPU pattern is NHD's)");
	/* the pattern is written and checked a head at a time (pb_fill_rank) */
	if ((tp[0] > 1 || tp[1] > 1 || converts) &&
	    (m->head_dim * m->dtype_bytes) % 8)
		xb_bad("%s: %s's heads are not whole 8-byte words",
		       converts ? "converting the order" : "TP", m->name);
	if (tp[0] == 1 && tp[1] == 1)
		return;
	if (o->one_block)
		xb_bad("--one-block measures one agent pair: drop "
		       "--prefill-tp/--decode-tp");
}

/* --versus WHAT: the variant, measured beside the run's own transfer (the
 * baseline). A variant differs from the baseline in one thing only. */
static void parse_versus(struct xb_opts *o, const char *what)
{
	struct xb_shape *v = &o->arm[1];

	*v = o->arm[0];
	if (!strcmp(what, "pull")) {
		if (o->pull)
			xb_bad("--versus pull: the baseline pushes; drop --pull");
		v->pull = true;
	} else if (!strcmp(what, "skip-half") || !strncmp(what, "skip=", 5)) {
		if (o->skip_tokens)
			xb_bad("--versus %s: the baseline moves the whole prompt; "
			       "drop --skip-tokens", what);
		v->skip_tokens = what[4] == '=' ?
			(uint32_t)parse_u64("--versus skip=N", what + 5, 1,
					    1u << 22) : o->tokens / 2;
		check_skip(o, "--versus skip", v->skip_tokens);
		v->skip_blocks = v->skip_tokens / o->model->block_tokens;
	} else if (!strcmp(what, "tp")) {
		/* the same prefill ranks, a decode instance of their size: the
		 * same bytes between equal TP sizes, only the reshard differs */
		if (o->prefill_tp == o->decode_tp)
			xb_bad("--versus tp: give --prefill-tp and --decode-tp of "
			       "different sizes (the variant; the baseline is "
			       "--prefill-tp on both sides)");
		o->arm[0].decode_tp = o->prefill_tp;
	} else if (!strcmp(what, "order")) {
		v->decode_order = o->decode_order == PDX_KV_NHD ? PDX_KV_HND
								: PDX_KV_NHD;
	} else {
		xb_bad("--versus: \"%s\" is none of pull, skip-half, skip=N, tp, "
		       "order", what);
	}
	o->n_arms = 2;
}

void xb_opts_parse(int argc, char **argv, struct xb_opts *o)
{
	enum {
		O_TLS = 256, O_MODEL, O_TOKENS, O_SKIP, O_RANDOM, O_CONC, O_LAYER,
		O_ITERS, O_JSON, O_BIN, O_DATA, O_XTMO, O_AARG, O_SEED, O_MEM, O_DDEV,
		O_PULL, O_ONE, O_VERSUS, O_PTP, O_DTP, O_ORDER, O_DORDER, O_HELP,
		O_VERSION
	};
	static const struct option lo[] = {
		{ "tls", required_argument, NULL, O_TLS },
		{ "model", required_argument, NULL, O_MODEL },
		{ "tokens", required_argument, NULL, O_TOKENS },
		{ "skip-tokens", required_argument, NULL, O_SKIP },
		{ "random-blocks", no_argument, NULL, O_RANDOM },
		{ "concurrency", required_argument, NULL, O_CONC },
		{ "layer-ms", required_argument, NULL, O_LAYER },
		{ "iters", required_argument, NULL, O_ITERS },
		{ "json", no_argument, NULL, O_JSON },
		{ "agent-bin", required_argument, NULL, O_BIN },
		{ "data-path", required_argument, NULL, O_DATA },
		{ "pull", no_argument, NULL, O_PULL },
		{ "xfer-timeout-ms", required_argument, NULL, O_XTMO },
		{ "agent-arg", required_argument, NULL, O_AARG },
		{ "seed", required_argument, NULL, O_SEED },
		{ "mem", required_argument, NULL, O_MEM },
		{ "decode-device", required_argument, NULL, O_DDEV },
		{ "one-block", required_argument, NULL, O_ONE },
		{ "versus", required_argument, NULL, O_VERSUS },
		{ "prefill-tp", required_argument, NULL, O_PTP },
		{ "decode-tp", required_argument, NULL, O_DTP },
		{ "order", required_argument, NULL, O_ORDER },
		{ "decode-order", required_argument, NULL, O_DORDER },
		{ "help", no_argument, NULL, O_HELP },
		{ "version", no_argument, NULL, O_VERSION },
		{ NULL, 0, NULL, 0 },
	};
	const char *mem = "shm";
	bool have_seed = false, have_ddev = false, have_decode_order = false;
	int c;

	o->tls = "shm";
	o->model_name = "llama3-8b";
	o->tokens = 8192;
	o->concurrency = 1;
	o->iters = 5;
	o->data_path = "auto";
	o->prefill_tp = o->decode_tp = 1;
	o->order = PDX_KV_NHD;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":", lo, NULL)) != -1) {
		char *end;

		switch (c) {
		case O_TLS:
			o->tls = optarg;
			break;
		case O_MODEL:
			o->model_name = optarg;
			break;
		case O_TOKENS:
			o->tokens = (uint32_t)parse_u64("--tokens", optarg, 1,
						       1u << 22);
			break;
		case O_SKIP:
			o->skip_tokens = (uint32_t)parse_u64("--skip-tokens",
							    optarg, 0, 1u << 22);
			break;
		case O_RANDOM:
			o->random_blocks = true;
			break;
		case O_CONC:
			o->concurrency = (uint32_t)parse_u64("--concurrency",
							    optarg, 1, 4096);
			break;
		case O_LAYER:
			errno = 0;
			o->layer_ms = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(o->layer_ms >= 0) ||
			    o->layer_ms > 60000)
				xb_bad("--layer-ms: \"%s\" is not a number of ms in 0..60000",
				       optarg);
			break;
		case O_ITERS:
			o->iters = (uint32_t)parse_u64("--iters", optarg, 1, MAX_ITERS);
			break;
		case O_JSON:
			o->json = true;
			break;
		case O_BIN:
			if (strlen(optarg) >= sizeof(o->agent_bin))
				xb_bad("--agent-bin: path too long");
			snprintf(o->agent_bin, sizeof(o->agent_bin), "%s", optarg);
			break;
		case O_DATA:
			o->data_path = optarg;
			break;
		case O_PULL:
			o->pull = true;
			break;
		case O_XTMO:
			o->xfer_timeout_ms = (uint32_t)parse_u64(
				"--xfer-timeout-ms", optarg, 1, 86400000);
			break;
		case O_AARG:
			if (o->n_agent_args == XB_AGENT_ARGS_MAX)
				xb_bad("--agent-arg: %d at most",
				       XB_AGENT_ARGS_MAX);
			o->agent_args[o->n_agent_args++] = optarg;
			break;
		case O_SEED:
			o->seed = parse_u64("--seed", optarg, 0, UINT64_MAX);
			have_seed = true;
			break;
		case O_MEM:
			mem = optarg;
			break;
		case O_DDEV:
			o->decode_dev = (int)parse_u64("--decode-device", optarg, 0,
						      1023);
			have_ddev = true;
			break;
		case O_ONE:
			o->one_block = (uint32_t)parse_u64("--one-block", optarg,
							  1, 100000);
			break;
		case O_VERSUS:
			o->versus = optarg;
			break;
		case O_PTP:
			o->prefill_tp = (uint32_t)parse_u64("--prefill-tp", optarg,
							   1, XB_TP_MAX);
			break;
		case O_DTP:
			o->decode_tp = (uint32_t)parse_u64("--decode-tp", optarg,
							  1, XB_TP_MAX);
			break;
		case O_ORDER:
			o->order = parse_order("--order", optarg);
			break;
		case O_DORDER:
			o->decode_order = parse_order("--decode-order", optarg);
			have_decode_order = true;
			break;
		case O_HELP:
			usage(stdout);
			exit(0);
		case O_VERSION:
			pdx_version_print("pdx-xferbench");
			exit(0);
		case ':':
			xb_bad("%s needs a value", argv[optind - 1]);
		default:
			xb_bad("unknown option \"%s\"", argv[optind - 1]);
		}
	}
	if (optind < argc)
		xb_bad("unexpected argument \"%s\"", argv[optind]);
	if (!strcmp(o->tls, "shm"))
		o->ucx_tls = "sm,self";
	else if (!strcmp(o->tls, "tcp"))
		o->ucx_tls = "tcp,self";
	else
		xb_bad("--tls: \"%s\" is neither shm nor tcp", o->tls);
	o->model = pdx_model_find(o->model_name);
	if (!o->model)
		xb_bad("--model: unknown model \"%s\" (known: %s)", o->model_name,
		       pdx_model_names());
	/* the agent judges the value: its paths grow (GPU memory) faster
	 * than a list here would */
	if (!o->data_path[0] || strlen(o->data_path) >= sizeof(((struct pb_agent *)0)->data_path))
		xb_bad("--data-path: \"%s\" is empty or too long", o->data_path);
	if (!strcmp(mem, "shm")) {
		o->cuda = false;
	} else if (!strncmp(mem, "cuda", 4) && (!mem[4] || mem[4] == ':')) {
		o->cuda = true;
		o->cuda_dev = mem[4] ? (int)parse_u64("--mem cuda:DEVICE", mem + 5,
						      0, 1023) : 0;
	} else {
		xb_bad("--mem: \"%s\" is neither shm nor cuda[:DEVICE]", mem);
	}
	if (have_ddev && !o->cuda)
		xb_bad("--decode-device needs --mem cuda");
	if (!have_ddev)
		o->decode_dev = o->cuda_dev;
	if (o->cuda && o->decode_dev != o->cuda_dev)
		snprintf(o->mem, sizeof(o->mem), "cuda:%d,%d", o->cuda_dev,
			 o->decode_dev);
	else if (o->cuda)
		snprintf(o->mem, sizeof(o->mem), "cuda:%d", o->cuda_dev);
	else
		snprintf(o->mem, sizeof(o->mem), "shm");
	check_skip(o, "--skip-tokens", o->skip_tokens);
	if (!have_decode_order)
		o->decode_order = o->order;
	o->n_arms = 1;
	o->arm[0] = (struct xb_shape){
		.conc = o->concurrency,
		.nblocks = (o->tokens + o->model->block_tokens - 1) /
			   o->model->block_tokens,
		.skip_tokens = o->skip_tokens,
		.skip_blocks = o->skip_tokens / o->model->block_tokens,
		.pull = o->pull,
		.prefill_tp = o->prefill_tp,
		.decode_tp = o->decode_tp,
		.decode_order = o->decode_order,
	};
	check_tp(o);
	if (o->versus)
		parse_versus(o, o->versus);
	if (!o->agent_bin[0] &&
	    pb_default_agent_bin(o->agent_bin, sizeof(o->agent_bin)))
		xb_bad("cannot find pdx-agent beside this program; use --agent-bin");
	if (access(o->agent_bin, X_OK))
		xb_bad("agent binary %s: %s", o->agent_bin, strerror(errno));
	if (!have_seed)
		o->seed = pdx_now_ns() ^ ((uint64_t)getpid() << 40);
}

double xb_opts_layer_ms(const struct xb_opts *o)
{
	/* --one-block's layers come ONE_BLOCK_LAYER_MS apart unless told */
	return o->one_block && o->layer_ms == 0 ? ONE_BLOCK_LAYER_MS :
						   o->layer_ms;
}

uint64_t xb_opts_event_wait_ms(const struct xb_opts *o)
{
	uint64_t t = o->xfer_timeout_ms ? o->xfer_timeout_ms :
					  XB_AGENT_XFER_TIMEOUT_MS;

	return t + (uint64_t)ceil(o->model->layers * xb_opts_layer_ms(o)) +
	       XB_EVENT_GRACE_MS;
}
