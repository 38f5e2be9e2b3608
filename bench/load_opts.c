#include "bench/load_opts.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/version.h"

/* clang-format off */
void pdx_load_opts_usage(FILE *f)
{
	fputs(
"usage: pdx-bench [options]\n"
"\n"
"Sends streaming requests to an OpenAI-compatible server and reports time to\n"
"first token and the rest, as `vllm bench serve` does: same options, same\n"
"metric definitions, same console block and result-JSON keys.\n"
"\n"
"Server\n"
"  --host H                 server address (default 127.0.0.1)\n"
"  --port P                 server port (default 8000)\n"
"  --base-url URL           http://host:port[/prefix], instead of --host/--port\n"
"  --endpoint PATH          API path (default /v1/completions; or\n"
"                           /v1/chat/completions)\n"
"  --backend B              openai (completions) or openai-chat (which wants\n"
"                           an endpoint ending in chat/completions); default:\n"
"                           openai-chat when the endpoint ends in\n"
"                           chat/completions, openai otherwise\n"
"  --model M                the request's model; default: the first model of\n"
"                           the server's /v1/models\n"
"  --served-model-name M    name sent in requests when it differs from --model\n"
"  --label L                result label (default: the backend)\n"
"  --request-timeout S      give up on a request S seconds after its intended\n"
"                           send time and count it failed (default 21600)\n"
"  $OPENAI_API_KEY          sent as a bearer token when set\n"
"\n"
"Dataset\n"
"  --dataset-name D         random (default), prefix_repetition, file (alias:\n"
"                           custom), multi-round, or long-doc-qa\n"
"  --dataset-path F         the file dataset: JSON lines {\"prompt\": \"text\" or\n"
"                           [token ids], \"output_len\": N}, or plain text, one\n"
"                           prompt per line; cycled if shorter than\n"
"                           --num-prompts\n"
"  --num-prompts N          requests to send (default 1000; multi-round and\n"
"                           long-doc-qa: all of theirs, and at most that)\n"
"  --input-len N            sets --random-input-len\n"
"  --output-len N           sets every dataset's output length (multi-round's\n"
"                           answer length too)\n"
"  --random-input-len N     prompt tokens (default 1024)\n"
"  --random-output-len N    max_tokens asked for (default 128)\n"
"  --random-range-ratio R   lengths uniform in [L(1-R), L(1+R)], 0 <= R < 1\n"
"                           (default 0)\n"
"  --random-prefix-len N    tokens of one random prefix shared by every prompt,\n"
"                           before the input tokens (default 0)\n"
"  --prefix-repetition-prefix-len N   shared prefix tokens (default 256)\n"
"  --prefix-repetition-suffix-len N   distinct suffix tokens (default 256)\n"
"  --prefix-repetition-num-prefixes N distinct prefixes; each gets\n"
"                           num-prompts / N prompts, shuffled (default 10)\n"
"  --prefix-repetition-output-len N   max_tokens (default 128)\n"
"  --custom-output-len N    file prompts' max_tokens when the line has none\n"
"                           (default 256)\n"
"\n"
"  multi-round (LMCache's multi-round QA): users in chat sessions. Round 1 of\n"
"  a user is the shared system prefix, the user's own prefix and a question;\n"
"  each next round adds the previous answer (output-len synthetic words) and\n"
"  a new question, so the prompt grows by question-len + output-len a round\n"
"  and every prompt is a prefix of the user's next one. A user's next round is\n"
"  sent only once the previous one has ended (failed or not); --request-rate\n"
"  staggers the users' first rounds (the last starts at users / R s; inf: all\n"
"  at once). --max-concurrency caps rounds in flight, so active users.\n"
"  --num-prompts N keeps the first N in round order (all users' round 1, then\n"
"  round 2, ...).\n"
"  --multi-round-num-users N          users, one session each (default 10)\n"
"  --multi-round-num-rounds N         requests per user (default 5)\n"
"  --multi-round-shared-prefix-len N  system prefix of every user (default 1000)\n"
"  --multi-round-user-prefix-len N    each user's own prefix (default 2000)\n"
"  --multi-round-question-len N       tokens of each question (default 50)\n"
"  (answers: --output-len tokens, default 100)\n"
"\n"
"  long-doc-qa (LMCache's long-document QA): documents asked several times,\n"
"  each request ending in its own 8-token question. --num-prompts N keeps\n"
"  the first N in sending order.\n"
"  --long-doc-num-documents N  distinct documents (default 20)\n"
"  --long-doc-len N            tokens per document (default 10000)\n"
"  --long-doc-repeat-count N   requests per document (default 2)\n"
"  --long-doc-repeat-mode M    order of the requests: random (default,\n"
"                              shuffled), tile (d1 d2 d3 d1 d2 d3) or\n"
"                              interleave (d1 d1 d2 d2 d3 d3)\n"
"  (max_tokens: --output-len, default 100)\n"
"\n"
"  --prompt-format F        text (default): N space-separated words, one word\n"
"                           per token; ids: an array of N token ids\n"
"                           (completions only)\n"
"  --vocab-size N           synthetic token ids in [0, N) (default 32000)\n"
"  --seed S                 seeds prompts and arrival times (default 0)\n"
"  --ignore-eos             ask the server to ignore EOS (always on for\n"
"                           random, as vllm)\n"
"  --temperature T, --top-p P, --top-k K   sampling parameters, sent when given\n"
"\n"
"Load\n"
"  --request-rate R         requests per second; inf (default) sends all at\n"
"                           once. Gaps are gamma-distributed and rescaled so the\n"
"                           last request arrives at num-prompts / R seconds\n"
"                           (multi-round: the last user's first round)\n"
"  --burstiness B           gamma shape of the gaps: 1 (default) is a Poisson\n"
"                           process, < 1 burstier, > 1 more even, inf constant\n"
"  --max-concurrency C      at most C requests in flight; the others wait in the\n"
"                           client queue. Latencies count from the intended send\n"
"                           time (arrival, or when a slot freed), never from a\n"
"                           late actual send\n"
"  --abort-fraction F       the client cancels this fraction of the requests,\n"
"                           0 to 1 (default 0), chosen at random (--seed):\n"
"                           it closes the connection, as a user who left,\n"
"  --abort-within-ms MS     a delay uniform in [0, MS] ms after sending each\n"
"                           (default 2000), unless the request ended first.\n"
"                           Counted as aborted: neither completed nor failed,\n"
"                           and left out of every latency metric\n"
"\n"
"Metrics (as vllm: TTFT = first SSE chunk with choices; TPOT = (E2EL - TTFT) /\n"
"(output tokens - 1); ITL = every gap between chunks; E2EL = last chunk; output\n"
"tokens from the server's usage, else one per chunk)\n"
"  --percentile-metrics L   of ttft,tpot,itl,e2el,client_queue_time,\n"
"                           e2el_including_client_queue (default ttft,tpot,itl)\n"
"  --metric-percentiles L   e.g. 50,90,99 (default 99)\n"
"  --goodput KEY:MS ...     SLOs (ttft, tpot, e2el in ms); requests meeting all\n"
"                           count toward request_goodput. One quoted argument\n"
"                           or several\n"
"\n"
"Output\n"
"  --save-result            write the result JSON\n"
"  --save-detailed          also write per-request lists (ttfts, itls,\n"
"                           input_lens, output_lens, start_times,\n"
"                           generated_texts, errors); implies --save-result\n"
"  --result-dir DIR         where (default: the current directory)\n"
"  --result-filename F      default {label}-{rate}qps[-concurrency{C}]-\n"
"                           {model}-{YYYYmmdd-HHMMSS}.json\n"
"  --metadata KEY=VALUE ... extra keys for the result JSON\n"
"  --engine-metrics HOST:PORT  an engine behind the server (repeatable, up\n"
"                           to 16; the decode engines of a disaggregated\n"
"                           pair): its prefix-cache hits over the run, and\n"
"                           the KV bytes they saved, join the report\n"
"  --disable-tqdm           no progress line on stderr (tqdm's: done/total,\n"
"                           [elapsed<left, rate]; drawn only on a terminal,\n"
"                           10 times a second)\n"
"  --plot FILE.png          also draw the run into a PNG with gnuplot (Debian:\n"
"                           gnuplot-nox; checked for before the run): CDFs of\n"
"                           TTFT and ITL, and output tokens/s and requests\n"
"                           completed/s over the run, in 1 s buckets (0.1 s\n"
"                           for runs under 10 s)\n"
"  --version                print \"pdx-bench VERSION\" and exit\n"
"  -h, --help               this text\n"
"\n"
"Exit status: 0 when at least one request completed; 1 when none did, or the\n"
"run could not take place (server, gnuplot, result file); 2 on a bad option\n"
"or dataset.\n",
	      f);
}
/* clang-format on */

enum {
	O_BACKEND = 256,
	O_LABEL,
	O_BASE_URL,
	O_HOST,
	O_PORT,
	O_ENDPOINT,
	O_MODEL,
	O_SERVED,
	O_TIMEOUT,
	O_DS_NAME,
	O_DS_PATH,
	O_NUM_PROMPTS,
	O_INPUT_LEN,
	O_OUTPUT_LEN,
	O_R_IN,
	O_R_OUT,
	O_R_RATIO,
	O_R_PREFIX,
	O_PR_PREFIX,
	O_PR_SUFFIX,
	O_PR_NUM,
	O_PR_OUT,
	O_CUSTOM_OUT,
	O_PROMPT_FMT,
	O_VOCAB,
	O_SEED,
	O_IGNORE_EOS,
	O_TEMP,
	O_TOP_P,
	O_TOP_K,
	O_RATE,
	O_BURST,
	O_MAXC,
	O_ABORT_FRACTION,
	O_ABORT_WITHIN,
	O_PCT_METRICS,
	O_METRIC_PCTS,
	O_GOODPUT,
	O_SAVE,
	O_SAVE_DETAILED,
	O_RESULT_DIR,
	O_RESULT_FILE,
	O_METADATA,
	O_ENGINE_METRICS,
	O_NO_TQDM,
	O_PLOT,
	O_MR_USERS,
	O_MR_ROUNDS,
	O_MR_SHARED,
	O_MR_USER_PREFIX,
	O_MR_QUESTION,
	O_LD_DOCS,
	O_LD_LEN,
	O_LD_REPEAT,
	O_LD_MODE,
};

static const struct option long_opts[] = {
    {"backend", required_argument, 0, O_BACKEND},
    {"label", required_argument, 0, O_LABEL},
    {"base-url", required_argument, 0, O_BASE_URL},
    {"host", required_argument, 0, O_HOST},
    {"port", required_argument, 0, O_PORT},
    {"endpoint", required_argument, 0, O_ENDPOINT},
    {"model", required_argument, 0, O_MODEL},
    {"served-model-name", required_argument, 0, O_SERVED},
    {"request-timeout", required_argument, 0, O_TIMEOUT},
    {"dataset-name", required_argument, 0, O_DS_NAME},
    {"dataset-path", required_argument, 0, O_DS_PATH},
    {"num-prompts", required_argument, 0, O_NUM_PROMPTS},
    {"input-len", required_argument, 0, O_INPUT_LEN},
    {"output-len", required_argument, 0, O_OUTPUT_LEN},
    {"random-input-len", required_argument, 0, O_R_IN},
    {"random-output-len", required_argument, 0, O_R_OUT},
    {"random-range-ratio", required_argument, 0, O_R_RATIO},
    {"random-prefix-len", required_argument, 0, O_R_PREFIX},
    {"prefix-repetition-prefix-len", required_argument, 0, O_PR_PREFIX},
    {"prefix-repetition-suffix-len", required_argument, 0, O_PR_SUFFIX},
    {"prefix-repetition-num-prefixes", required_argument, 0, O_PR_NUM},
    {"prefix-repetition-output-len", required_argument, 0, O_PR_OUT},
    {"custom-output-len", required_argument, 0, O_CUSTOM_OUT},
    {"prompt-format", required_argument, 0, O_PROMPT_FMT},
    {"vocab-size", required_argument, 0, O_VOCAB},
    {"seed", required_argument, 0, O_SEED},
    {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
    {"temperature", required_argument, 0, O_TEMP},
    {"top-p", required_argument, 0, O_TOP_P},
    {"top-k", required_argument, 0, O_TOP_K},
    {"request-rate", required_argument, 0, O_RATE},
    {"burstiness", required_argument, 0, O_BURST},
    {"max-concurrency", required_argument, 0, O_MAXC},
    {"abort-fraction", required_argument, 0, O_ABORT_FRACTION},
    {"abort-within-ms", required_argument, 0, O_ABORT_WITHIN},
    {"percentile-metrics", required_argument, 0, O_PCT_METRICS},
    {"metric-percentiles", required_argument, 0, O_METRIC_PCTS},
    {"goodput", required_argument, 0, O_GOODPUT},
    {"save-result", no_argument, 0, O_SAVE},
    {"save-detailed", no_argument, 0, O_SAVE_DETAILED},
    {"result-dir", required_argument, 0, O_RESULT_DIR},
    {"result-filename", required_argument, 0, O_RESULT_FILE},
    {"metadata", required_argument, 0, O_METADATA},
    {"engine-metrics", required_argument, 0, O_ENGINE_METRICS},
    {"disable-tqdm", no_argument, 0, O_NO_TQDM},
    {"plot", required_argument, 0, O_PLOT},
    {"multi-round-num-users", required_argument, 0, O_MR_USERS},
    {"multi-round-num-rounds", required_argument, 0, O_MR_ROUNDS},
    {"multi-round-shared-prefix-len", required_argument, 0, O_MR_SHARED},
    {"multi-round-user-prefix-len", required_argument, 0, O_MR_USER_PREFIX},
    {"multi-round-question-len", required_argument, 0, O_MR_QUESTION},
    {"long-doc-num-documents", required_argument, 0, O_LD_DOCS},
    {"long-doc-len", required_argument, 0, O_LD_LEN},
    {"long-doc-repeat-count", required_argument, 0, O_LD_REPEAT},
    {"long-doc-repeat-mode", required_argument, 0, O_LD_MODE},
    {"help", no_argument, 0, 'h'},
    {"version", no_argument, 0, 'V'},
    {0, 0, 0, 0},
};

static int parse_long(const char *name, const char *s, long lo, long hi,
		      long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi) {
		if (hi >= 1L << 30)
			fprintf(stderr,
				"pdx-bench: --%s: bad value '%s' (want an "
				"integer >= %ld)\n",
				name, s, lo);
		else
			fprintf(stderr,
				"pdx-bench: --%s: bad value '%s' (want an "
				"integer in [%ld, %ld])\n",
				name, s, lo, hi);
		return -1;
	}
	*out = v;
	return 0;
}

static int parse_int(const char *name, const char *s, int lo, int *out)
{
	long v;

	if (parse_long(name, s, lo, 1L << 30, &v))
		return -1;
	*out = (int)v;
	return 0;
}

/* Accepts "inf" as Python's float() does. */
static int parse_double(const char *name, const char *s, double *out)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || *end || isnan(v)) {
		fprintf(stderr, "pdx-bench: --%s: bad value '%s'\n", name, s);
		return -1;
	}
	*out = v;
	return 0;
}

/* The options of the multi-round and long-doc-qa datasets: each an
 * int with its smallest value. */
static const struct {
	int opt, lo;
	size_t off;
} int_opts[] = {
    {O_MR_USERS, 1, offsetof(struct pdx_load_opts, dp.mr_num_users)},
    {O_MR_ROUNDS, 1, offsetof(struct pdx_load_opts, dp.mr_num_rounds)},
    {O_MR_SHARED, 0, offsetof(struct pdx_load_opts, dp.mr_shared_prefix_len)},
    {O_MR_USER_PREFIX, 0,
     offsetof(struct pdx_load_opts, dp.mr_user_prefix_len)},
    {O_MR_QUESTION, 0, offsetof(struct pdx_load_opts, dp.mr_question_len)},
    {O_LD_DOCS, 1, offsetof(struct pdx_load_opts, dp.ld_num_documents)},
    {O_LD_LEN, 1, offsetof(struct pdx_load_opts, dp.ld_doc_len)},
    {O_LD_REPEAT, 1, offsetof(struct pdx_load_opts, dp.ld_repeat_count)},
};

/* 1 when c is one of int_opts (parsed into o, or -1 on a bad value). */
static int parse_int_opt(int c, const char *arg, struct pdx_load_opts *o)
{
	const struct option *lo;
	size_t i;

	for (i = 0; i < sizeof(int_opts) / sizeof(int_opts[0]); i++) {
		if (int_opts[i].opt != c)
			continue;
		for (lo = long_opts; lo->val != c; lo++)
			;
		if (parse_int(lo->name, arg, int_opts[i].lo,
			      (int *)((char *)o + int_opts[i].off)))
			return -1;
		return 1;
	}
	return 0;
}

/* The next argument after an nargs="+" option (vllm's --goodput and
 * --metadata take several), up to the next option; -1 when none. */
static int take_more(int argc, char **argv)
{
	if (optind < argc && argv[optind][0] != '-')
		return optind++;
	return -1;
}

int pdx_load_opts_parse(int argc, char **argv, struct pdx_load_opts *o)
{
	char err[256];
	long lv;
	int c, i;

	while ((c = getopt_long(argc, argv, "+h", long_opts, NULL)) != -1) {
		i = parse_int_opt(c, optarg, o);
		if (i < 0)
			return -1;
		if (i > 0)
			continue;
		switch (c) {
		case O_BACKEND:
			o->backend = optarg;
			break;
		case O_LABEL:
			o->label = optarg;
			break;
		case O_BASE_URL:
			o->base_url = optarg;
			break;
		case O_HOST:
			o->host = optarg;
			break;
		case O_PORT:
			if (parse_long("port", optarg, 1, 65535, &lv))
				return -1;
			o->port = (int)lv;
			break;
		case O_ENDPOINT:
			o->endpoint = optarg;
			break;
		case O_MODEL:
			o->model = optarg;
			break;
		case O_SERVED:
			o->served_model_name = optarg;
			break;
		case O_TIMEOUT:
			if (parse_double("request-timeout", optarg,
					 &o->request_timeout))
				return -1;
			/* it becomes a struct timeval: inf failed every
			 * request at once, 0 or less meant the default */
			if (!(o->request_timeout > 0.0 &&
			      o->request_timeout <= PDX_LOAD_TIMEOUT_MAX_S)) {
				fprintf(stderr, "pdx-bench: --request-timeout: "
						"want seconds in (0, %g]\n",
					PDX_LOAD_TIMEOUT_MAX_S);
				return -1;
			}
			break;
		case O_DS_NAME:
			o->dataset_name = optarg;
			break;
		case O_DS_PATH:
			o->dataset_path = optarg;
			break;
		case O_NUM_PROMPTS:
			if (parse_long("num-prompts", optarg, 1, 100000000,
				       &o->num_prompts))
				return -1;
			break;
		case O_INPUT_LEN:
			if (parse_int("input-len", optarg, 0, &o->input_len))
				return -1;
			break;
		case O_OUTPUT_LEN:
			if (parse_int("output-len", optarg, 1, &o->output_len))
				return -1;
			break;
		case O_R_IN:
			if (parse_int("random-input-len", optarg, 0,
				      &o->dp.random_input_len))
				return -1;
			break;
		case O_R_OUT:
			if (parse_int("random-output-len", optarg, 1,
				      &o->dp.random_output_len))
				return -1;
			break;
		case O_R_RATIO:
			if (parse_double("random-range-ratio", optarg,
					 &o->dp.random_range_ratio))
				return -1;
			break;
		case O_R_PREFIX:
			if (parse_int("random-prefix-len", optarg, 0,
				      &o->dp.random_prefix_len))
				return -1;
			break;
		case O_PR_PREFIX:
			if (parse_int("prefix-repetition-prefix-len", optarg, 0,
				      &o->dp.pr_prefix_len))
				return -1;
			break;
		case O_PR_SUFFIX:
			if (parse_int("prefix-repetition-suffix-len", optarg, 0,
				      &o->dp.pr_suffix_len))
				return -1;
			break;
		case O_PR_NUM:
			if (parse_int("prefix-repetition-num-prefixes", optarg,
				      1, &o->dp.pr_num_prefixes))
				return -1;
			break;
		case O_PR_OUT:
			if (parse_int("prefix-repetition-output-len", optarg, 1,
				      &o->dp.pr_output_len))
				return -1;
			break;
		case O_CUSTOM_OUT:
			if (parse_int("custom-output-len", optarg, 1,
				      &o->dp.file_output_len))
				return -1;
			break;
		case O_PROMPT_FMT:
			if (!strcmp(optarg, "ids")) {
				o->ids = true;
			} else if (!strcmp(optarg, "text")) {
				o->ids = false;
			} else {
				fprintf(stderr, "pdx-bench: --prompt-format: "
						"text or ids\n");
				return -1;
			}
			break;
		case O_VOCAB:
			if (parse_long("vocab-size", optarg, 1, UINT32_MAX,
				       &lv))
				return -1;
			o->dp.vocab_size = (uint32_t)lv;
			break;
		case O_SEED:
			if (parse_long("seed", optarg, 0, LONG_MAX, &lv))
				return -1;
			o->dp.seed = (uint64_t)lv;
			break;
		case O_IGNORE_EOS:
			o->ignore_eos = true;
			break;
		case O_TEMP:
			if (parse_double("temperature", optarg,
					 &o->temperature))
				return -1;
			break;
		case O_TOP_P:
			if (parse_double("top-p", optarg, &o->top_p))
				return -1;
			break;
		case O_TOP_K:
			if (parse_int("top-k", optarg, 0, &o->top_k))
				return -1;
			break;
		case O_RATE:
			if (parse_double("request-rate", optarg,
					 &o->request_rate))
				return -1;
			break;
		case O_BURST:
			if (parse_double("burstiness", optarg, &o->burstiness))
				return -1;
			break;
		case O_MAXC:
			if (parse_int("max-concurrency", optarg, 1,
				      &o->max_concurrency))
				return -1;
			break;
		case O_ABORT_FRACTION:
			if (parse_double("abort-fraction", optarg,
					 &o->abort_fraction))
				return -1;
			if (!(o->abort_fraction >= 0.0 &&
			      o->abort_fraction <= 1.0)) {
				fprintf(stderr, "pdx-bench: --abort-fraction: "
						"want a number in [0, 1]\n");
				return -1;
			}
			break;
		case O_ABORT_WITHIN:
			if (parse_double("abort-within-ms", optarg,
					 &o->abort_within_ms))
				return -1;
			if (!(o->abort_within_ms >= 0.0) ||
			    isinf(o->abort_within_ms)) {
				fprintf(stderr, "pdx-bench: --abort-within-ms: "
						"want a number >= 0\n");
				return -1;
			}
			break;
		case O_PCT_METRICS:
			o->percentile_metrics = optarg;
			break;
		case O_METRIC_PCTS:
			o->metric_percentiles = optarg;
			break;
		case O_GOODPUT:
			i = optind - 1;
			do {
				if (pdx_load_goodput_parse(argv[i], &o->goodput,
							   err, sizeof(err))) {
					fprintf(stderr,
						"pdx-bench: --goodput: "
						"%s\n",
						err);
					return -1;
				}
			} while ((i = take_more(argc, argv)) >= 0);
			o->has_goodput = true;
			break;
		case O_SAVE:
			o->save_result = true;
			break;
		case O_SAVE_DETAILED:
			o->save_detailed = true;
			break;
		case O_RESULT_DIR:
			o->result_dir = optarg;
			break;
		case O_RESULT_FILE:
			o->result_filename = optarg;
			break;
		case O_METADATA:
			i = optind - 1;
			do {
				if (!strchr(argv[i], '=') ||
				    o->n_metadata == 32) {
					fprintf(stderr,
						"pdx-bench: --metadata: want "
						"KEY=VALUE\n");
					return -1;
				}
				o->metadata[o->n_metadata++] = argv[i];
			} while ((i = take_more(argc, argv)) >= 0);
			break;
		case O_ENGINE_METRICS:
			if (o->n_engine_metrics == 16) {
				fprintf(stderr, "pdx-bench: --engine-metrics: "
						"at most 16\n");
				return -1;
			}
			o->engine_metrics[o->n_engine_metrics++] = optarg;
			break;
		case O_NO_TQDM:
			o->disable_tqdm = true;
			break;
		case O_PLOT:
			o->plot = optarg;
			break;
		case O_LD_MODE:
			if (pdx_load_repeat_mode_parse(optarg,
						       &o->dp.ld_repeat_mode)) {
				fprintf(stderr,
					"pdx-bench: --long-doc-repeat-mode: "
					"random, tile or interleave\n");
				return -1;
			}
			break;
		case 'h':
			pdx_load_opts_usage(stdout);
			exit(0);
		case 'V':
			pdx_version_print("pdx-bench");
			exit(0);
		default:
			fprintf(stderr, "pdx-bench: try --help\n");
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "pdx-bench: unexpected argument '%s'\n",
			argv[optind]);
		return -1;
	}
	return 0;
}

void pdx_load_opts_defaults(struct pdx_load_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->host = "127.0.0.1";
	o->port = 8000;
	o->endpoint = "/v1/completions";
	o->dataset_name = "random";
	o->num_prompts = 0; /* unset: 1000, or all of an LMCache set's */
	o->input_len = o->output_len = -1;
	o->request_rate = INFINITY;
	o->burstiness = 1.0;
	o->temperature = o->top_p = NAN;
	o->top_k = -1;
	o->metric_percentiles = "99";
	o->abort_within_ms = 2000.0;
	o->dp.random_input_len = 1024;
	o->dp.random_output_len = 128;
	o->dp.pr_prefix_len = 256;
	o->dp.pr_suffix_len = 256;
	o->dp.pr_num_prefixes = 10;
	o->dp.pr_output_len = 128;
	o->dp.file_output_len = 256;
	o->dp.mr_num_users = 10;
	o->dp.mr_num_rounds = 5;
	o->dp.mr_shared_prefix_len = 1000;
	o->dp.mr_user_prefix_len = 2000;
	o->dp.mr_question_len = 50;
	o->dp.mr_output_len = 100;
	o->dp.ld_num_documents = 20;
	o->dp.ld_doc_len = 10000;
	o->dp.ld_repeat_count = 2;
	o->dp.ld_repeat_mode = PDX_LOAD_REPEAT_RANDOM;
	o->dp.ld_output_len = 100;
}
