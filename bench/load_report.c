#include "bench/load_report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define WIDTH 50

int pdx_load_metric_names_parse(const char *spec, unsigned *mask)
{
	static const struct {
		const char *name;
		unsigned bit;
	} names[] = {
	    {"ttft", PDX_LOAD_M_TTFT},
	    {"tpot", PDX_LOAD_M_TPOT},
	    {"itl", PDX_LOAD_M_ITL},
	    {"e2el", PDX_LOAD_M_E2EL},
	    {"client_queue_time", PDX_LOAD_M_CLIENT_QUEUE},
	    {"e2el_including_client_queue", PDX_LOAD_M_E2EL_QUEUE},
	};
	const char *p = spec, *e;
	unsigned m = 0;
	size_t i, n;

	while (*p) {
		e = strchr(p, ',');
		n = e ? (size_t)(e - p) : strlen(p);
		for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
			if (strlen(names[i].name) == n &&
			    !memcmp(names[i].name, p, n))
				break;
		if (i == sizeof(names) / sizeof(names[0]))
			return -1;
		m |= names[i].bit;
		p += n + (e ? 1 : 0);
	}
	if (!m)
		return -1;
	*mask = m;
	return 0;
}

/* Python's repr of a float: the fewest significant digits that read back
 * the same, positional for exponents in [-4, 16), scientific otherwise. */
static void py_float(double v, char *buf, size_t len)
{
	char tmp[64];
	int prec, exp10, dec;

	for (prec = 1; prec <= 17; prec++) {
		snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, v);
		if (strtod(tmp, NULL) == v)
			break;
	}
	exp10 = atoi(strchr(tmp, 'e') + 1);
	if (exp10 < -4 || exp10 >= 16) {
		snprintf(buf, len, "%s", tmp);
		return;
	}
	dec = prec - 1 - exp10;
	snprintf(buf, len, "%.*f", dec > 0 ? dec : 0, v);
}

void pdx_load_py_float(double v, char *buf, size_t len)
{
	if (isinf(v)) {
		snprintf(buf, len, v > 0 ? "inf" : "-inf");
		return;
	}
	py_float(v, buf, len);
	if (!strpbrk(buf, ".e"))
		strncat(buf, ".0", len - strlen(buf) - 1);
}

void pdx_load_pct_word(double p, char *buf, size_t len)
{
	buf[0] = 'p';
	if (p == floor(p))
		snprintf(buf + 1, len - 1, "%d", (int)p);
	else
		py_float(p, buf + 1, len - 1);
}

/* "{s:{c}^{n}}": s centred in n columns of c, the odd one on the right. */
static void centred(FILE *f, const char *s, char c)
{
	size_t n = strlen(s), pad = n < WIDTH ? WIDTH - n : 0, i;

	for (i = 0; i < pad / 2; i++)
		fputc(c, f);
	fputs(s, f);
	for (i = 0; i < pad - pad / 2; i++)
		fputc(c, f);
	fputc('\n', f);
}

/* "{:<40} {:<10}" and "{:<40} {:<10.2f}". */
static void row_int(FILE *f, const char *label, long v)
{
	fprintf(f, "%-40s %-10ld\n", label, v);
}

static void row_f(FILE *f, const char *label, double v)
{
	fprintf(f, "%-40s %-10.2f\n", label, v);
}

static const struct metric_desc {
	unsigned bit;
	const char *attr, *name, *header;
	size_t offset;
} metric_descs[] = {
    {PDX_LOAD_M_TTFT, "ttft", "TTFT", "Time to First Token",
     offsetof(struct pdx_load_metrics, ttft)},
    {PDX_LOAD_M_TPOT, "tpot", "TPOT", "Time per Output Token (excl. 1st token)",
     offsetof(struct pdx_load_metrics, tpot)},
    {PDX_LOAD_M_ITL, "itl", "ITL", "Inter-token Latency",
     offsetof(struct pdx_load_metrics, itl)},
    {PDX_LOAD_M_E2EL, "e2el", "E2EL", "End-to-end Latency",
     offsetof(struct pdx_load_metrics, e2el)},
    {PDX_LOAD_M_CLIENT_QUEUE, "client_queue_time", "Client Queue Time",
     "Client-side Queueing",
     offsetof(struct pdx_load_metrics, client_queue_time)},
    {PDX_LOAD_M_E2EL_QUEUE, "e2el_including_client_queue",
     "E2EL incl. Client Queue", "Queue-inclusive End-to-end Latency",
     offsetof(struct pdx_load_metrics, e2el_including_client_queue)},
};

/* vllm reports the queue metrics only under --max-concurrency, and the
 * queue-inclusive latency only with a finite rate too. */
static bool metric_shown(const struct pdx_load_report *r,
			 const struct metric_desc *d)
{
	if (!(r->metrics & d->bit))
		return false;
	if (d->bit == PDX_LOAD_M_CLIENT_QUEUE)
		return r->max_concurrency > 0;
	if (d->bit == PDX_LOAD_M_E2EL_QUEUE)
		return r->max_concurrency > 0 && !isinf(r->request_rate);
	return true;
}

static const struct pdx_load_stat *stat_of(const struct pdx_load_report *r,
					   const struct metric_desc *d)
{
	return (const struct pdx_load_stat *)((const char *)r->m + d->offset);
}

void pdx_load_report_print(FILE *f, const struct pdx_load_report *r)
{
	const struct pdx_load_metrics *m = r->m;
	const struct pdx_load_stat *s;
	char label[96], pw[32];
	size_t i, j;

	centred(f, " Serving Benchmark Result ", '=');
	row_int(f, "Successful requests:", m->completed);
	row_int(f, "Failed requests:", m->failed);
	if (r->aborts)
		row_int(f, "Aborted requests:", m->aborted);
	if (r->max_concurrency > 0)
		row_int(f, "Maximum request concurrency:", r->max_concurrency);
	if (!isinf(r->request_rate))
		row_f(f, "Request rate configured (RPS):", r->request_rate);
	row_f(f, "Benchmark duration (s):", r->duration_s);
	row_int(f, "Total input tokens:", m->total_input);
	row_int(f, "Total generated tokens:", m->total_output);
	row_f(f, "Request throughput (req/s):", m->request_throughput);
	if (r->goodput)
		row_f(f, "Request goodput (req/s):", m->request_goodput);
	row_f(f, "Output token throughput (tok/s):", m->output_throughput);
	row_f(f, "Peak output token throughput (tok/s):",
	      m->max_output_tokens_per_s);
	row_f(f, "Peak concurrent requests:", m->max_concurrent_requests);
	if (r->prefix) {
		row_int(f, "Prefix hit tokens (engines):",
			(long)r->prefix->hit_tokens);
		row_int(f, "Prefix queried tokens (engines):",
			(long)r->prefix->query_tokens);
		row_int(f, "KV bytes saved by prefix hits:",
			(long)r->prefix->hit_bytes);
	}
	row_f(f, "Total token throughput (tok/s):", m->total_token_throughput);
	for (i = 0; i < sizeof(metric_descs) / sizeof(metric_descs[0]); i++) {
		const struct metric_desc *d = &metric_descs[i];

		if (!metric_shown(r, d))
			continue;
		s = stat_of(r, d);
		centred(f, d->header, '-');
		snprintf(label, sizeof(label), "Mean %s (ms):", d->name);
		row_f(f, label, s->mean);
		snprintf(label, sizeof(label), "Median %s (ms):", d->name);
		row_f(f, label, s->median);
		for (j = 0; j < r->npct && j < PDX_LOAD_MAX_PCTS; j++) {
			pdx_load_pct_word(r->pcts[j], pw, sizeof(pw));
			pw[0] = 'P';
			snprintf(label, sizeof(label), "%s %s (ms):", pw,
				 d->name);
			row_f(f, label, s->pct[j]);
		}
	}
	for (i = 0; i < WIDTH; i++)
		fputc('=', f);
	fputc('\n', f);
}

static int set(json_t *o, const char *k, json_t *v)
{
	return v ? json_object_set_new(o, k, v) : -1;
}

static json_t *str_or_null(const char *s)
{
	return s ? json_string(s) : json_null();
}

/* A list with one value per request. */
enum list_kind {
	L_INPUT,
	L_OUTPUT,
	L_TTFT,
	L_ITL,
	L_LAT,
	L_START,
	L_QUEUE,
	L_TEXT,
	L_ERROR
};

static json_t *per_request(const struct pdx_load_report *r, enum list_kind k)
{
	json_t *a = json_array(), *v, *itl;
	size_t i, j;

	if (!a)
		return NULL;
	for (i = 0; i < r->n_res; i++) {
		const struct pdx_load_result *x = &r->res[i];

		switch (k) {
		case L_INPUT:
			v = json_integer(x->prompt_len);
			break;
		case L_OUTPUT:
			v = json_integer(
			    x->success
				? (x->output_tokens > 0 ? x->output_tokens : 1)
				: 0);
			break;
		case L_TTFT:
			v = json_real(x->ttft);
			break;
		case L_ITL:
			v = itl = json_array();
			for (j = 0; itl && j < x->n_itl; j++)
				json_array_append_new(itl,
						      json_real(x->itl[j]));
			break;
		case L_LAT:
			v = json_real(x->latency);
			break;
		case L_START:
			v = json_real(x->start);
			break;
		case L_QUEUE:
			v = json_real(x->queue);
			break;
		case L_TEXT:
			v = json_string(x->text ? x->text : "");
			break;
		default:
			v = json_string(x->error ? x->error : "");
			break;
		}
		if (!v || json_array_append_new(a, v)) {
			json_decref(a);
			return NULL;
		}
	}
	return a;
}

json_t *pdx_load_report_json(const struct pdx_load_report *r)
{
	const struct pdx_load_metrics *m = r->m;
	const struct pdx_load_stat *s;
	json_t *o = json_object();
	char key[96], pw[32];
	size_t i, j;
	int err = 0;

	if (!o)
		return NULL;
	err |= set(o, "date", str_or_null(r->date));
	err |= set(o, "endpoint_type", str_or_null(r->backend));
	err |= set(o, "backend", str_or_null(r->backend));
	err |= set(o, "label", str_or_null(r->label));
	err |= set(o, "model_id", str_or_null(r->model_id));
	err |= set(o, "tokenizer_id", str_or_null(r->tokenizer_id));
	err |= set(o, "num_prompts", json_integer((json_int_t)r->num_prompts));
	err |= set(o, "request_rate",
		   isinf(r->request_rate) ? json_string("inf")
					  : json_real(r->request_rate));
	err |= set(o, "burstiness",
		   isinf(r->burstiness) ? json_string("inf")
					: json_real(r->burstiness));
	err |= set(o, "max_concurrency",
		   r->max_concurrency > 0 ? json_integer(r->max_concurrency)
					  : json_null());
	err |= set(o, "duration", json_real(r->duration_s));
	err |= set(o, "completed", json_integer(m->completed));
	err |= set(o, "failed", json_integer(m->failed));
	if (r->aborts)
		err |= set(o, "aborted", json_integer(m->aborted));
	err |= set(o, "total_input_tokens", json_integer(m->total_input));
	err |= set(o, "total_output_tokens", json_integer(m->total_output));
	err |= set(o, "request_throughput", json_real(m->request_throughput));
	err |= set(o, "request_goodput",
		   r->goodput ? json_real(m->request_goodput) : json_null());
	err |= set(o, "output_throughput", json_real(m->output_throughput));
	err |= set(o, "total_token_throughput",
		   json_real(m->total_token_throughput));
	if (r->detailed) {
		err |= set(o, "input_lens", per_request(r, L_INPUT));
		err |= set(o, "output_lens", per_request(r, L_OUTPUT));
		err |= set(o, "ttfts", per_request(r, L_TTFT));
		err |= set(o, "itls", per_request(r, L_ITL));
	}
	err |= set(o, "latencies", per_request(r, L_LAT));
	if (r->detailed)
		err |= set(o, "start_times", per_request(r, L_START));
	err |= set(o, "queue_times", per_request(r, L_QUEUE));
	if (r->detailed) {
		err |= set(o, "generated_texts", per_request(r, L_TEXT));
		err |= set(o, "errors", per_request(r, L_ERROR));
	}
	err |= set(o, "max_output_tokens_per_s",
		   json_real(m->max_output_tokens_per_s));
	err |= set(o, "max_concurrent_requests",
		   json_integer(m->max_concurrent_requests));
	err |= set(o, "rtfx", json_real(0.0));
	for (i = 0; i < sizeof(metric_descs) / sizeof(metric_descs[0]); i++) {
		const struct metric_desc *d = &metric_descs[i];

		if (!metric_shown(r, d))
			continue;
		s = stat_of(r, d);
		snprintf(key, sizeof(key), "mean_%s_ms", d->attr);
		err |= set(o, key, json_real(s->mean));
		snprintf(key, sizeof(key), "median_%s_ms", d->attr);
		err |= set(o, key, json_real(s->median));
		snprintf(key, sizeof(key), "std_%s_ms", d->attr);
		err |= set(o, key, json_real(s->std));
		for (j = 0; j < r->npct && j < PDX_LOAD_MAX_PCTS; j++) {
			pdx_load_pct_word(r->pcts[j], pw, sizeof(pw));
			snprintf(key, sizeof(key), "%s_%s_ms", pw, d->attr);
			err |= set(o, key, json_real(s->pct[j]));
		}
	}
	err |= set(o, "pdx_max_send_lag_ms", json_real(r->max_send_lag_ms));
	if (r->prefix) {
		err |= set(o, "pdx_prefix_hit_tokens",
			   json_integer((json_int_t)r->prefix->hit_tokens));
		err |= set(o, "pdx_prefix_query_tokens",
			   json_integer((json_int_t)r->prefix->query_tokens));
		err |= set(o, "pdx_prefix_saved_bytes",
			   json_integer((json_int_t)r->prefix->hit_bytes));
	}
	if (err) {
		json_decref(o);
		return NULL;
	}
	return o;
}
