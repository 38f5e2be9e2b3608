/* pdx-bench: the TTFT load tool. Drives an OpenAI-compatible server (a
 * pdx-engine, the pdx-proxy, or vLLM itself) with streaming requests and
 * reports what a client feels, with the options, metric definitions,
 * console block and result-JSON keys of `vllm bench serve`. */
#include "bench/load_abort.h"
#include "bench/load_arrival.h"
#include "bench/load_dataset.h"
#include "bench/load_http.h"
#include "bench/load_metrics.h"
#include "bench/load_scrape.h"
#include "bench/load_openai.h"
#include "bench/load_opts.h"
#include "bench/load_plot.h"
#include "bench/load_report.h"

#include <errno.h>
#include <event2/http.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && !strcmp(s + n - m, suffix);
}

/* host, port and the path prefix of --base-url (or --host/--port). */
struct target {
	char host[256];
	int port;
	char prefix[512]; /* "" or "/something", no trailing slash */
};

static int resolve_target(const struct pdx_load_opts *o, struct target *t)
{
	struct evhttp_uri *u;
	const char *scheme, *h, *path;
	size_t n;

	memset(t, 0, sizeof(*t));
	if (!o->base_url) {
		snprintf(t->host, sizeof(t->host), "%s", o->host);
		t->port = o->port;
		return 0;
	}
	u = evhttp_uri_parse(o->base_url);
	if (!u) {
		fprintf(stderr, "pdx-bench: --base-url: cannot parse '%s'\n",
			o->base_url);
		return -1;
	}
	scheme = evhttp_uri_get_scheme(u);
	h = evhttp_uri_get_host(u);
	if (!scheme || strcmp(scheme, "http") || !h) {
		fprintf(stderr, "pdx-bench: --base-url: only http://host[:port]"
				"[/prefix] is supported\n");
		evhttp_uri_free(u);
		return -1;
	}
	snprintf(t->host, sizeof(t->host), "%s", h);
	t->port = evhttp_uri_get_port(u) > 0 ? evhttp_uri_get_port(u) : 80;
	path = evhttp_uri_get_path(u);
	snprintf(t->prefix, sizeof(t->prefix), "%s", path ? path : "");
	n = strlen(t->prefix);
	while (n && t->prefix[n - 1] == '/')
		t->prefix[--n] = '\0';
	evhttp_uri_free(u);
	return 0;
}

/* vllm's default: the first model the server lists. */
static char *first_model(const struct target *t)
{
	char path[600], *body = NULL, *id = NULL;
	json_t *root, *v;
	int status = 0;

	snprintf(path, sizeof(path), "%s/v1/models", t->prefix);
	if (pdx_load_http_get(t->host, t->port, path, 10.0, &body, &status) ||
	    status != 200) {
		free(body);
		return NULL;
	}
	root = json_loads(body, 0, NULL);
	v = json_object_get(json_array_get(json_object_get(root, "data"), 0),
			    "id");
	if (json_is_string(v))
		id = strdup(json_string_value(v));
	json_decref(root);
	free(body);
	return id;
}

static int write_result(const struct pdx_load_opts *o, json_t *result,
			const char *label, const char *model_id,
			const char *date)
{
	char name[1024], path[2048], rate[64], conc[48] = "";
	const char *base = strrchr(model_id, '/');

	base = base ? base + 1 : model_id;
	pdx_load_py_float(o->request_rate, rate, sizeof(rate));
	if (o->max_concurrency > 0)
		snprintf(conc, sizeof(conc), "-concurrency%d",
			 o->max_concurrency);
	if (o->result_filename)
		snprintf(name, sizeof(name), "%s", o->result_filename);
	else
		snprintf(name, sizeof(name), "%s-%sqps%s-%s-%s.json", label,
			 rate, conc, base, date);
	if (o->result_dir) {
		if (mkdir(o->result_dir, 0777) && errno != EEXIST) {
			fprintf(stderr, "pdx-bench: %s: %s\n", o->result_dir,
				strerror(errno));
			return -1;
		}
		snprintf(path, sizeof(path), "%s/%s", o->result_dir, name);
	} else {
		snprintf(path, sizeof(path), "%s", name);
	}
	if (json_dump_file(result, path, 0)) {
		fprintf(stderr, "pdx-bench: cannot write %s\n", path);
		return -1;
	}
	fprintf(stderr, "pdx-bench: result written to %s\n", path);
	return 0;
}

/* The request bodies, built before the clock starts. */
static int build_bodies(const struct pdx_load_opts *o,
			const struct pdx_load_dataset *ds, const char *model,
			bool chat, char **bodies, size_t *lens)
{
	struct pdx_load_body_params bp = {0};
	size_t i;

	bp.chat = chat;
	bp.model = model;
	bp.ignore_eos = o->ignore_eos;
	bp.temperature = o->temperature;
	bp.top_p = o->top_p;
	bp.top_k = o->top_k;
	for (i = 0; i < ds->n; i++) {
		const struct pdx_load_request *r = &ds->reqs[i];

		bp.text = r->text;
		bp.ids = r->text ? NULL : r->ids;
		bp.n_ids = (size_t)r->prompt_len;
		bp.max_tokens = r->output_len;
		bodies[i] = pdx_load_openai_body(&bp, &lens[i]);
		if (!bodies[i]) {
			fprintf(stderr,
				"pdx-bench: cannot build request %zu%s\n", i,
				chat && !r->text ? " (chat needs text "
						   "prompts)"
						 : "");
			return -1;
		}
	}
	return 0;
}

/* What the options decide before anything is sent. */
struct plan {
	struct target t;
	char api_path[1024];
	bool chat;
	const char *backend;
	unsigned mask; /* --percentile-metrics */
	double pcts[PDX_LOAD_MAX_PCTS];
	size_t npct;
};

static bool lmcache_kind(enum pdx_load_dataset_kind k)
{
	return k == PDX_LOAD_DS_MULTI_ROUND || k == PDX_LOAD_DS_LONG_DOC_QA;
}

/* Checks the options against each other and fills the plan and the
 * dataset parameters; -1 (exit 2) with the reason on stderr. */
static int check_opts(struct pdx_load_opts *o, struct plan *pl)
{
	pl->mask = PDX_LOAD_M_DEFAULT;
	if (o->percentile_metrics &&
	    pdx_load_metric_names_parse(o->percentile_metrics, &pl->mask)) {
		fprintf(stderr,
			"pdx-bench: --percentile-metrics: unknown "
			"metric in '%s'\n",
			o->percentile_metrics);
		return -1;
	}
	if (pdx_load_percentiles_parse(o->metric_percentiles, pl->pcts,
				       PDX_LOAD_MAX_PCTS, &pl->npct)) {
		fprintf(stderr, "pdx-bench: --metric-percentiles: want numbers "
				"in [0, 100] separated by commas\n");
		return -1;
	}
	if (!(o->request_rate > 0) || !(o->burstiness > 0)) {
		fprintf(stderr, "pdx-bench: --request-rate and --burstiness "
				"must be > 0\n");
		return -1;
	}
	pl->chat = ends_with(o->endpoint, "chat/completions");
	pl->backend = o->backend ? o->backend
		      : pl->chat ? "openai-chat"
				 : "openai";
	if (!strcmp(pl->backend, "openai-chat")) {
		/* chat bodies to a completions endpoint: every request
		 * failed (vLLM's bench refuses it too) */
		if (!pl->chat) {
			fprintf(stderr, "pdx-bench: --backend openai-chat "
					"wants an --endpoint ending in "
					"chat/completions (not %s)\n",
				o->endpoint);
			return -1;
		}
	} else if (!strcmp(pl->backend, "openai")) {
		pl->chat = false;
	} else {
		fprintf(stderr,
			"pdx-bench: --backend: openai or openai-chat\n");
		return -1;
	}
	if (pl->chat && o->ids) {
		fprintf(stderr, "pdx-bench: chat requests need "
				"--prompt-format text\n");
		return -1;
	}
	if (pdx_load_dataset_kind_parse(o->dataset_name, &o->dp.kind)) {
		fprintf(stderr, "pdx-bench: --dataset-name: random, "
				"prefix_repetition, file, multi-round or "
				"long-doc-qa\n");
		return -1;
	}
	if (resolve_target(o, &pl->t))
		return -1;
	snprintf(pl->api_path, sizeof(pl->api_path), "%s%s", pl->t.prefix,
		 o->endpoint);

	if (o->input_len >= 0)
		o->dp.random_input_len = o->input_len;
	if (o->output_len > 0) {
		o->dp.random_output_len = o->output_len;
		o->dp.pr_output_len = o->output_len;
		o->dp.file_output_len = o->output_len;
		o->dp.mr_output_len = o->output_len;
		o->dp.ld_output_len = o->output_len;
	}
	if (o->dp.kind == PDX_LOAD_DS_RANDOM)
		o->ignore_eos = true;
	if (!o->num_prompts && !lmcache_kind(o->dp.kind))
		o->num_prompts = 1000;
	o->dp.num_prompts = (size_t)o->num_prompts;
	o->dp.path = o->dataset_path;
	o->dp.text = !o->ids;
	return 0;
}

/* The line vllm prints about the sampled lengths, or what an LMCache set
 * holds. */
static void print_dataset(const struct pdx_load_opts *o,
			  const struct pdx_load_dataset *ds)
{
	const struct pdx_load_dataset_params *dp = &o->dp;
	int pre = dp->kind == PDX_LOAD_DS_RANDOM ? dp->random_prefix_len : 0;

	if (dp->kind == PDX_LOAD_DS_MULTI_ROUND)
		printf("Multi-round: %d users x %d rounds (%zu requests), "
		       "prompts of %d to %d tokens, answers of %d\n",
		       dp->mr_num_users, dp->mr_num_rounds, ds->n, ds->input_lo,
		       ds->input_hi, ds->output_hi);
	else if (dp->kind == PDX_LOAD_DS_LONG_DOC_QA)
		printf("Long-doc QA: %d documents of %d tokens, %d requests "
		       "each (%zu sent), repeat mode %s, output %d\n",
		       dp->ld_num_documents, dp->ld_doc_len,
		       dp->ld_repeat_count, ds->n,
		       dp->ld_repeat_mode == PDX_LOAD_REPEAT_TILE ? "tile"
		       : dp->ld_repeat_mode == PDX_LOAD_REPEAT_INTERLEAVE
			   ? "interleave"
			   : "random",
		       ds->output_hi);
	else if (dp->kind != PDX_LOAD_DS_FILE)
		printf("Sampling input_len from [%d, %d] and output_len from "
		       "[%d, %d]\n",
		       ds->input_lo + pre, ds->input_hi + pre, ds->output_lo,
		       ds->output_hi);
}

static void print_load(const struct pdx_load_opts *o)
{
	char rs[64], bs[64];

	pdx_load_py_float(o->request_rate, rs, sizeof(rs));
	pdx_load_py_float(o->burstiness, bs, sizeof(bs));
	printf("Starting main benchmark run...\n");
	printf("Traffic request rate: %s\n", rs);
	printf("Burstiness factor: %s (%s)\n", bs,
	       o->burstiness == 1.0 ? "Poisson process" : "Gamma distribution");
	if (o->max_concurrency > 0)
		printf("Maximum request concurrency: %d\n", o->max_concurrency);
	else
		printf("Maximum request concurrency: None\n");
	if (o->abort_fraction > 0)
		printf("Client aborts: %g%% of requests, within %g ms of their "
		       "send\n",
		       o->abort_fraction * 100.0, o->abort_within_ms);
	fflush(stdout);
}

/* Prints up to ten failures, as vllm does (aborts are not failures). */
static void print_failures(const struct pdx_load_result *res, size_t n)
{
	size_t i, nfail = 0;

	for (i = 0; i < n && nfail < 10; i++) {
		if (res[i].success || res[i].aborted)
			continue;
		if (!nfail)
			printf("Failed requests during benchmark run "
			       "detected (capping to 10):\n");
		printf("Error %zu: %s\n", nfail++,
		       res[i].error ? res[i].error : "");
	}
}

static int plot(const struct pdx_load_opts *o, const char *model,
		const char *date, const struct pdx_load_result *res, size_t n,
		double duration_s)
{
	char title[512], rate[64], conc[32] = "none", err[512];

	pdx_load_py_float(o->request_rate, rate, sizeof(rate));
	if (o->max_concurrency > 0)
		snprintf(conc, sizeof(conc), "%d", o->max_concurrency);
	snprintf(title, sizeof(title),
		 "pdx-bench %s: %s, %zu requests, rate %s, max concurrency "
		 "%s, model %s",
		 date, o->dataset_name, n, rate, conc, model);
	if (pdx_load_plot_write(o->plot, title, res, n, duration_s, err,
				sizeof(err))) {
		fprintf(stderr, "pdx-bench: --plot: %s\n", err);
		return -1;
	}
	fprintf(stderr, "pdx-bench: plot written to %s\n", o->plot);
	return 0;
}

/* The requests' sessions (multi-round) into *out, NULL when all stand
 * alone; -1 on out of memory. */
static int session_links(const struct pdx_load_dataset *ds, bool **out)
{
	bool *follows, any = false;
	size_t i;

	*out = NULL;
	for (i = 0; i < ds->n; i++)
		any |= ds->reqs[i].follows;
	if (!any)
		return 0;
	follows = calloc(ds->n, sizeof(*follows));
	if (!follows)
		return -1;
	for (i = 0; i < ds->n; i++)
		follows[i] = ds->reqs[i].follows;
	*out = follows;
	return 0;
}

/* The engines' prefix-cache counters now, summed (--engine-metrics). */
static int scrape(const struct pdx_load_opts *o, struct pdx_load_prefix *out)
{
	char err[256];

	*out = (struct pdx_load_prefix){0};
	for (int i = 0; i < o->n_engine_metrics; i++) {
		if (pdx_load_scrape_prefix(o->engine_metrics[i], out, err,
					   sizeof(err))) {
			fprintf(stderr, "pdx-bench: %s\n", err);
			return -1;
		}
	}
	return 0;
}

static int run(struct pdx_load_opts *o)
{
	struct pdx_load_prefix px0, px1;
	struct pdx_load_dataset ds = {0};
	struct pdx_load_run_params rp = {0};
	struct pdx_load_run_stats st = {0};
	struct pdx_load_arrival_params ap = {0};
	struct pdx_load_abort_params abp = {0};
	struct pdx_load_metrics m;
	struct pdx_load_report rep = {0};
	struct pdx_load_result *res = NULL;
	struct plan pl = {0};
	double *arrivals = NULL, *aborts = NULL;
	size_t i;
	char err[512], date[32];
	char **bodies = NULL, *model_owned = NULL;
	size_t *lens = NULL;
	int *plens = NULL;
	bool *follows = NULL;
	const char *model, *label;
	json_t *result = NULL;
	time_t now;
	int rc = 1;

	if (check_opts(o, &pl))
		return 2;
	if (o->plot && pdx_load_plot_check(o->plot, err, sizeof(err))) {
		fprintf(stderr, "pdx-bench: %s\n", err);
		return 1;
	}
	if (pdx_load_dataset_build(&o->dp, &ds, err, sizeof(err))) {
		fprintf(stderr, "pdx-bench: dataset: %s\n", err);
		return 2;
	}
	if (!o->num_prompts)
		o->num_prompts = (long)ds.n;

	model = o->model;
	if (!model) {
		printf("Model not specified, fetching first model from "
		       "server...\n");
		model = model_owned = first_model(&pl.t);
		if (!model) {
			fprintf(stderr,
				"pdx-bench: no --model, and no model "
				"from http://%s:%d%s/v1/models\n",
				pl.t.host, pl.t.port, pl.t.prefix);
			goto out;
		}
		printf("First model name: %s, first model id: %s\n", model,
		       model);
	}
	label = o->label ? o->label : pl.backend;

	print_dataset(o, &ds);
	bodies = calloc(ds.n, sizeof(*bodies));
	lens = calloc(ds.n, sizeof(*lens));
	plens = calloc(ds.n, sizeof(*plens));
	arrivals = calloc(ds.n, sizeof(*arrivals));
	res = calloc(ds.n, sizeof(*res));
	if (!bodies || !lens || !plens || !arrivals || !res ||
	    session_links(&ds, &follows))
		goto out;
	if (build_bodies(o, &ds,
			 o->served_model_name ? o->served_model_name : model,
			 pl.chat, bodies, lens))
		goto out;
	for (i = 0; i < ds.n; i++)
		plens[i] = ds.reqs[i].prompt_len;
	ap.n = ds.n;
	ap.rate = o->request_rate;
	ap.burstiness = o->burstiness;
	ap.seed = o->dp.seed;
	if (pdx_load_session_arrivals(&ap, follows, arrivals))
		goto out;
	if (o->abort_fraction > 0) {
		abp.n = ds.n;
		abp.fraction = o->abort_fraction;
		abp.within_s = o->abort_within_ms / 1000.0;
		abp.seed = o->dp.seed;
		aborts = calloc(ds.n + 1, sizeof(*aborts));
		if (!aborts || pdx_load_aborts(&abp, aborts))
			goto out;
	}

	print_load(o);
	rp.host = pl.t.host;
	rp.port = pl.t.port;
	rp.path = pl.api_path;
	rp.chat = pl.chat;
	rp.bodies = bodies;
	rp.body_lens = lens;
	rp.prompt_lens = plens;
	rp.arrivals = arrivals;
	rp.follows = follows;
	rp.n = ds.n;
	rp.max_concurrency = o->max_concurrency;
	rp.timeout_s = o->request_timeout;
	rp.abort_after = aborts;
	rp.progress = !o->disable_tqdm && isatty(STDERR_FILENO);
	rp.keep_text = o->save_detailed;
	rp.api_key = getenv("OPENAI_API_KEY");
	if (scrape(o, &px0))
		goto out;
	if (pdx_load_run(&rp, res, &st, err, sizeof(err))) {
		fprintf(stderr, "pdx-bench: %s\n", err);
		goto out;
	}
	if (scrape(o, &px1))
		goto out;
	px1.hit_tokens -= px0.hit_tokens;
	px1.hit_bytes -= px0.hit_bytes;
	px1.query_tokens -= px0.query_tokens;
	if (pdx_load_metrics_compute(res, ds.n, st.duration_s, pl.pcts, pl.npct,
				     o->has_goodput ? &o->goodput : NULL, &m))
		goto out;
	print_failures(res, ds.n);
	if (m.completed == 0)
		fprintf(stderr, "pdx-bench: all requests failed\n");

	now = time(NULL);
	strftime(date, sizeof(date), "%Y%m%d-%H%M%S", localtime(&now));
	rep.m = &m;
	rep.duration_s = st.duration_s;
	rep.request_rate = o->request_rate;
	rep.burstiness = o->burstiness;
	rep.max_concurrency = o->max_concurrency;
	rep.goodput = o->has_goodput;
	rep.metrics = pl.mask;
	rep.pcts = pl.pcts;
	rep.npct = pl.npct;
	rep.date = date;
	rep.backend = pl.backend;
	rep.label = o->label;
	rep.model_id = model;
	rep.tokenizer_id = NULL;
	rep.num_prompts = (size_t)o->num_prompts;
	rep.res = res;
	rep.n_res = ds.n;
	rep.detailed = o->save_detailed;
	rep.max_send_lag_ms = st.max_send_lag_s * 1000.0;
	rep.aborts = o->abort_fraction > 0;
	rep.prefix = o->n_engine_metrics ? &px1 : NULL;
	pdx_load_report_print(stdout, &rep);
	fflush(stdout);
	if (o->save_result || o->save_detailed) {
		result = pdx_load_report_json(&rep);
		for (i = 0; result && i < (size_t)o->n_metadata; i++) {
			char kv[512], *eq;

			snprintf(kv, sizeof(kv), "%s", o->metadata[i]);
			eq = strchr(kv, '=');
			*eq = '\0';
			json_object_set_new(result, kv, json_string(eq + 1));
		}
		if (!result || write_result(o, result, label, model, date))
			goto out;
	}
	if (o->plot && plot(o, model, date, res, ds.n, st.duration_s))
		goto out;
	rc = m.completed > 0 ? 0 : 1;
out:
	json_decref(result);
	for (i = 0; res && i < ds.n; i++)
		pdx_load_result_clear(&res[i]);
	for (i = 0; bodies && i < ds.n; i++)
		free(bodies[i]);
	free(res);
	free(bodies);
	free(lens);
	free(plens);
	free(arrivals);
	free(aborts);
	free(follows);
	free(model_owned);
	pdx_load_dataset_free(&ds);
	return rc;
}

int main(int argc, char **argv)
{
	struct pdx_load_opts o;

	signal(SIGPIPE, SIG_IGN);
	pdx_load_opts_defaults(&o);
	if (pdx_load_opts_parse(argc, argv, &o))
		return 2;
	return run(&o);
}
