/* Prometheus text for the proxy (see metrics.h). */
#include "proxy/metrics.h"

#include <stdio.h>

#include "proxy/proxy.h"

static const double lat_le[PDX_PROXY_LAT_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

void pdx_proxy_metrics_request(struct pdx_proxy_metrics *m, int status,
			       double seconds)
{
	unsigned i;

	for (i = 0; i < m->nstatus; i++)
		if (m->status[i].code == status)
			break;
	if (i == m->nstatus) {
		if (m->nstatus == PDX_PROXY_STATUS_MAX)
			i = m->nstatus - 1; /* the last slot absorbs the rest */
		else
			m->status[m->nstatus++].code = status;
	}
	m->status[i].n++;
	m->lat_count++;
	m->lat_sum += seconds;
	for (i = 0; i < PDX_PROXY_LAT_BUCKETS; i++) {
		if (seconds <= lat_le[i]) {
			m->lat_bucket[i]++;
			break;
		}
	}
}

static int family(struct evbuffer *out, const char *name, const char *type,
		  const char *help)
{
	return evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name,
				   help, name, type) < 0;
}

enum inst_field { INST_INFLIGHT, INST_REQUESTS, INST_FAILURES };

static uint64_t inst_value(const struct pdx_inst *in, enum inst_field f)
{
	return f == INST_INFLIGHT ? in->inflight
	       : f == INST_REQUESTS ? in->requests
				    : in->failures;
}

/* One family with a sample per instance of both pools. */
static int render_per_instance(const struct pdx_proxy *px,
			       struct evbuffer *out, const char *name,
			       const char *type, const char *help,
			       enum inst_field f)
{
	int bad = family(out, name, type, help);

	for (int r = 0; r < 2; r++) {
		const struct pdx_pool *p = &px->pool[r];

		for (unsigned i = 0; i < p->n; i++)
			bad |= evbuffer_add_printf(
				       out, "%s{role=\"%s\",instance=\"%s\"} %llu\n",
				       name, pdx_pool_role_name(p->role),
				       p->inst[i]->url,
				       (unsigned long long)inst_value(p->inst[i], f)) < 0;
	}
	return bad;
}

static int render_instances(const struct pdx_proxy *px, struct evbuffer *out)
{
	int bad = render_per_instance(
		px, out, "pdx_proxy_instance_inflight", "gauge",
		"requests of this proxy in flight on an instance", INST_INFLIGHT);

	bad |= render_per_instance(px, out, "pdx_proxy_instance_requests_total",
				   "counter", "requests sent to an instance",
				   INST_REQUESTS);
	bad |= render_per_instance(
		px, out, "pdx_proxy_instance_failures_total", "counter",
		"requests an instance failed to connect or answer", INST_FAILURES);
	bad |=
	    family(out, "pdx_proxy_instances", "gauge", "instances in a pool");
	for (int r = 0; r < 2; r++)
		bad |= evbuffer_add_printf(
			   out, "pdx_proxy_instances{role=\"%s\"} %u\n",
			   pdx_pool_role_name(px->pool[r].role),
			   px->pool[r].n) < 0;
	return bad;
}

int pdx_proxy_metrics_render(const struct pdx_proxy *px, struct evbuffer *out)
{
	const struct pdx_proxy_metrics *m = &px->metrics;
	uint64_t cum = 0;
	int bad;

	bad = family(out, "pdx_proxy_requests_total", "counter",
		     "client requests finished, by HTTP status (499: the "
		     "client left)");
	for (unsigned i = 0; i < m->nstatus; i++)
		bad |= evbuffer_add_printf(
			   out, "pdx_proxy_requests_total{code=\"%d\"} %llu\n",
			   m->status[i].code,
			   (unsigned long long)m->status[i].n) < 0;
	bad |= family(out, "pdx_proxy_requests_aborted_total", "counter",
		      "client requests whose client left before the end");
	bad |=
	    evbuffer_add_printf(out, "pdx_proxy_requests_aborted_total %llu\n",
				(unsigned long long)m->aborted) < 0;
	bad |= family(out, "pdx_proxy_requests_inflight", "gauge",
		      "client requests in flight");
	bad |= evbuffer_add_printf(out, "pdx_proxy_requests_inflight %u\n",
				   px->ncalls) < 0;
	bad |= render_instances(px, out);
	bad |= family(out, "pdx_proxy_request_duration_seconds", "histogram",
		      "time from a client request's arrival to its end");
	for (int i = 0; i < PDX_PROXY_LAT_BUCKETS; i++) {
		cum += m->lat_bucket[i];
		bad |=
		    evbuffer_add_printf(
			out,
			"pdx_proxy_request_duration_seconds_bucket{le=\"%g\"} "
			"%llu\n",
			lat_le[i], (unsigned long long)cum) < 0;
	}
	bad |=
	    evbuffer_add_printf(
		out,
		"pdx_proxy_request_duration_seconds_bucket{le=\"+Inf\"} %llu\n"
		"pdx_proxy_request_duration_seconds_sum %.6f\n"
		"pdx_proxy_request_duration_seconds_count %llu\n",
		(unsigned long long)m->lat_count, m->lat_sum,
		(unsigned long long)m->lat_count) < 0;
	return bad ? -1 : 0;
}
