#include "common/errbuf.h"
#include "bench/load_metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pdx_load_result_clear(struct pdx_load_result *r)
{
	if (!r)
		return;
	free(r->itl);
	free(r->error);
	free(r->text);
	memset(r, 0, sizeof(*r));
}


int pdx_load_goodput_parse(const char *spec, struct pdx_load_goodput *g,
			   char *err, size_t errlen)
{
	char name[16], *end;
	const char *p = spec, *colon;
	size_t nlen;
	double v;

	for (;;) {
		while (*p == ' ' || *p == ',' || *p == '\t')
			p++;
		if (!*p)
			return 0;
		colon = strchr(p, ':');
		nlen = colon ? (size_t)(colon - p) : 0;
		if (!colon || nlen == 0 || nlen >= sizeof(name)) {
			pdx_errbuf_set(err, errlen,
				"invalid goodput pair at \"%s\": want KEY:MS",
				p);
			return -1;
		}
		memcpy(name, p, nlen);
		name[nlen] = '\0';
		v = strtod(colon + 1, &end);
		if (end == colon + 1 ||
		    (*end && *end != ' ' && *end != ',' && *end != '\t')) {
			pdx_errbuf_set(err, errlen, "invalid goodput value for %s",
				name);
			return -1;
		}
		if (v < 0) {
			pdx_errbuf_set(
			    err, errlen,
			    "invalid value found, %s: %g; the service level "
			    "objective value should be non-negative",
			    name, v);
			return -1;
		}
		if (!strcmp(name, "ttft")) {
			g->ttft = true;
			g->ttft_ms = v;
		} else if (!strcmp(name, "tpot")) {
			g->tpot = true;
			g->tpot_ms = v;
		} else if (!strcmp(name, "e2el")) {
			g->e2el = true;
			g->e2el_ms = v;
		} else {
			pdx_errbuf_set(err, errlen,
				"invalid metric name %s: the service level "
				"objective name should be one of ttft, tpot, "
				"e2el",
				name);
			return -1;
		}
		p = end;
	}
}

int pdx_load_percentiles_parse(const char *spec, double *pcts, size_t max,
			       size_t *n_out)
{
	const char *p = spec;
	char *end;
	size_t n = 0;
	double v;

	for (;;) {
		while (*p == ' ')
			p++;
		v = strtod(p, &end);
		if (end == p || !(v >= 0.0 && v <= 100.0) || n == max)
			return -1;
		pcts[n++] = v;
		p = end;
		while (*p == ' ')
			p++;
		if (!*p)
			break;
		if (*p != ',')
			return -1;
		p++;
	}
	*n_out = n;
	return 0;
}

double pdx_load_percentile(const double *sorted, size_t n, double p)
{
	double rank, frac;
	size_t lo;

	if (n == 0)
		return 0.0;
	rank = p / 100.0 * (double)(n - 1);
	lo = (size_t)floor(rank);
	if (lo >= n - 1)
		return sorted[n - 1];
	frac = rank - (double)lo;
	return sorted[lo] + (sorted[lo + 1] - sorted[lo]) * frac;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

void pdx_load_stat_compute(const double *v, size_t n, const double *pcts,
			   size_t npct, struct pdx_load_stat *out)
{
	double *s, sum = 0, var = 0, mean;
	size_t i;

	memset(out, 0, sizeof(*out));
	if (n == 0)
		return;
	s = malloc(n * sizeof(*s));
	if (!s)
		return;
	memcpy(s, v, n * sizeof(*s));
	qsort(s, n, sizeof(*s), cmp_double);
	for (i = 0; i < n; i++)
		sum += s[i];
	mean = sum / (double)n;
	for (i = 0; i < n; i++)
		var += (s[i] - mean) * (s[i] - mean);
	out->mean = mean * 1000.0;
	out->std = sqrt(var / (double)n) * 1000.0;
	out->median = pdx_load_percentile(s, n, 50.0) * 1000.0;
	for (i = 0; i < npct && i < PDX_LOAD_MAX_PCTS; i++)
		out->pct[i] = pdx_load_percentile(s, n, pcts[i]) * 1000.0;
	free(s);
}

struct event {
	double t;
	int delta;
};

static int cmp_event(const void *a, const void *b)
{
	const struct event *x = a, *y = b;

	if (x->t != y->t)
		return (x->t > y->t) - (x->t < y->t);
	return x->delta - y->delta; /* a departure before an arrival */
}

/* vllm's peak figures: token chunks per 1-second bucket from the first
 * start, and the largest number of requests in flight at once. */
static int peaks(const struct pdx_load_result *res, size_t n,
		 struct pdx_load_metrics *m)
{
	double t0 = INFINITY, t1 = -INFINITY, t;
	struct event *ev = NULL;
	double *buckets = NULL;
	size_t nb, i, j, ne = 0;
	long b;
	int cur = 0;

	for (i = 0; i < n; i++) {
		if (!res[i].success)
			continue;
		t0 = fmin(t0, res[i].start);
		t1 = fmax(t1, res[i].start + res[i].latency);
	}
	if (isinf(t0))
		return 0;
	nb = (size_t)ceil(t1 - t0) + 1;
	buckets = calloc(nb, sizeof(*buckets));
	ev = calloc(2 * n, sizeof(*ev));
	if (!buckets || !ev) {
		free(buckets);
		free(ev);
		return -1;
	}
	for (i = 0; i < n; i++) {
		if (!res[i].success)
			continue;
		t = res[i].start + res[i].ttft;
		for (j = 0;; j++) {
			b = (long)(t - t0);
			if (b >= 0 && (size_t)b < nb)
				buckets[b] += 1;
			if (j == res[i].n_itl)
				break;
			t += res[i].itl[j];
		}
		ev[ne++] = (struct event){res[i].start, 1};
		ev[ne++] = (struct event){res[i].start + res[i].latency, -1};
	}
	for (i = 0; i < nb; i++)
		m->max_output_tokens_per_s =
		    fmax(m->max_output_tokens_per_s, buckets[i]);
	qsort(ev, ne, sizeof(*ev), cmp_event);
	for (i = 0; i < ne; i++) {
		cur += ev[i].delta;
		if (cur > m->max_concurrent_requests)
			m->max_concurrent_requests = cur;
	}
	free(buckets);
	free(ev);
	return 0;
}

int pdx_load_metrics_compute(const struct pdx_load_result *res, size_t n,
			     double duration_s, const double *pcts, size_t npct,
			     const struct pdx_load_goodput *g,
			     struct pdx_load_metrics *out)
{
	double *ttft, *tpot, *all_tpot, *e2el, *itl, *queue, *e2el_q;
	size_t n_itl = 0, i, j, k = 0, nt = 0;
	struct pdx_load_metrics m = {0};
	bool good;
	int rc = -1;

	for (i = 0; i < n; i++)
		if (res[i].success)
			n_itl += res[i].n_itl;
	ttft = calloc(n + 1, sizeof(double));
	tpot = calloc(n + 1, sizeof(double));
	all_tpot = calloc(n + 1, sizeof(double));
	e2el = calloc(n + 1, sizeof(double));
	queue = calloc(n + 1, sizeof(double));
	e2el_q = calloc(n + 1, sizeof(double));
	itl = calloc(n_itl + 1, sizeof(double));
	if (!ttft || !tpot || !all_tpot || !e2el || !queue || !e2el_q || !itl)
		goto out;
	n_itl = 0;
	for (i = 0; i < n; i++) {
		const struct pdx_load_result *r = &res[i];
		int olen = r->output_tokens;

		if (!r->success) {
			if (r->aborted)
				m.aborted++;
			else
				m.failed++;
			continue;
		}
		if (olen <= 0)
			olen = 1; /* vllm's count when it has nothing better */
		m.total_input += r->prompt_len;
		m.total_output += olen;
		all_tpot[k] = 0.0;
		if (olen > 1) {
			all_tpot[k] = (r->latency - r->ttft) / (olen - 1);
			tpot[nt++] = all_tpot[k];
		}
		for (j = 0; j < r->n_itl; j++)
			itl[n_itl++] = r->itl[j];
		ttft[k] = r->ttft;
		e2el[k] = r->latency;
		queue[k] = r->queue;
		e2el_q[k] = r->latency + r->queue;
		k++;
		m.completed++;
	}
	if (g && (g->ttft || g->tpot || g->e2el)) {
		for (i = 0; i < k; i++) {
			good = true;
			if (g->ttft && ttft[i] > g->ttft_ms / 1000.0)
				good = false;
			if (g->tpot && all_tpot[i] > g->tpot_ms / 1000.0)
				good = false;
			if (g->e2el && e2el[i] > g->e2el_ms / 1000.0)
				good = false;
			m.good += good;
		}
	}
	if (duration_s > 0) {
		m.request_throughput = m.completed / duration_s;
		m.request_goodput = m.good / duration_s;
		m.output_throughput = m.total_output / duration_s;
		m.total_token_throughput =
		    (m.total_input + m.total_output) / duration_s;
	}
	pdx_load_stat_compute(ttft, k, pcts, npct, &m.ttft);
	pdx_load_stat_compute(tpot, nt, pcts, npct, &m.tpot);
	pdx_load_stat_compute(itl, n_itl, pcts, npct, &m.itl);
	pdx_load_stat_compute(e2el, k, pcts, npct, &m.e2el);
	pdx_load_stat_compute(queue, k, pcts, npct, &m.client_queue_time);
	pdx_load_stat_compute(e2el_q, k, pcts, npct,
			      &m.e2el_including_client_queue);
	if (peaks(res, n, &m))
		goto out;
	*out = m;
	rc = 0;
out:
	free(ttft);
	free(tpot);
	free(all_tpot);
	free(e2el);
	free(queue);
	free(e2el_q);
	free(itl);
	return rc;
}
