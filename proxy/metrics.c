/* Prometheus text for the proxy (see metrics.h). */
#include "proxy/metrics.h"

#include <stdio.h>
#include <string.h>

#include "common/prom.h"
#include "proxy/proxy.h"

static const double lat_le[PDX_PROXY_LAT_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

static void hist_observe(struct pdx_hist *h, double seconds)
{
	h->count++;
	h->sum += seconds;
	for (int i = 0; i < PDX_PROXY_LAT_BUCKETS; i++) {
		if (seconds <= lat_le[i]) {
			h->bucket[i]++;
			break;
		}
	}
}

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
	hist_observe(&m->lat, seconds);
}

void pdx_proxy_metrics_phase(struct pdx_proxy_metrics *m,
			     enum pdx_proxy_phase ph, double seconds)
{
	hist_observe(&m->phase[ph], seconds);
}

void pdx_proxy_metrics_timing(struct pdx_proxy_metrics *m, const char *v,
			      bool prefill)
{
	while (v && *v) {
		char name[16];
		double ms;
		int n = 0;

		v += strspn(v, " ,");
		if (sscanf(v, "%15[a-z_];dur=%lf%n", name, &ms, &n) == 2 &&
		    ms >= 0) {
			double s = ms / 1e3;

			if (!strcmp(name, "queue"))
				pdx_proxy_metrics_phase(
				    m,
				    prefill ? PDX_PHASE_PREFILL_QUEUE
					    : PDX_PHASE_DECODE_QUEUE,
				    s);
			else if (!strcmp(name, "prefill") && prefill)
				pdx_proxy_metrics_phase(m, PDX_PHASE_PREFILL,
							s);
			else if (!strcmp(name, "kv") && !prefill)
				pdx_proxy_metrics_phase(m, PDX_PHASE_KV_WAIT,
							s);
		}
		v = strchr(v, ',');
	}
}

static const char *const phase_names[PDX_PHASES] = {
    "prefill_queue", "prefill", "decode_queue", "kv_wait", "first_token"};

/* One histogram's lines; phase "" for none. */
static int hist_render(struct evbuffer *out, const char *name,
		       const char *phase, const struct pdx_hist *h)
{
	char lab[48] = "";
	uint64_t cum = 0;
	int bad = 0;

	if (*phase)
		snprintf(lab, sizeof(lab), "phase=\"%s\",", phase);
	for (int i = 0; i < PDX_PROXY_LAT_BUCKETS; i++) {
		cum += h->bucket[i];
		bad |= evbuffer_add_printf(out, "%s_bucket{%sle=\"%g\"} %llu\n",
					   name, lab, lat_le[i],
					   (unsigned long long)cum) < 0;
	}
	lab[strlen(lab) ? strlen(lab) - 1 : 0] = '\0'; /* no trailing comma */
	bad |= evbuffer_add_printf(
		   out,
		   "%s_bucket{%s%sle=\"+Inf\"} %llu\n%s_sum%s%s%s %.6f\n"
		   "%s_count%s%s%s %llu\n",
		   name, lab, *lab ? "," : "", (unsigned long long)h->count,
		   name, *lab ? "{" : "", lab, *lab ? "}" : "", h->sum, name,
		   *lab ? "{" : "", lab, *lab ? "}" : "",
		   (unsigned long long)h->count) < 0;
	return bad;
}

static int family(struct evbuffer *out, const char *name, const char *type,
		  const char *help)
{
	return evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name,
				   help, name, type) < 0;
}

enum inst_field {
	INST_INFLIGHT,
	INST_XFERS,
	INST_REQUESTS,
	INST_FAILURES,
	INST_HEALTHY,
	INST_BREAKER,
};

static uint64_t inst_value(const struct pdx_inst *in, enum inst_field f)
{
	switch (f) {
	case INST_INFLIGHT:
		return in->inflight;
	case INST_XFERS:
		return in->xfers;
	case INST_REQUESTS:
		return in->requests;
	case INST_HEALTHY:
		return !in->unhealthy;
	case INST_BREAKER:
		return in->breaker.state;
	default:
		return in->failures;
	}
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

static int render_breaker_transitions(const struct pdx_proxy *px,
				      struct evbuffer *out)
{
	const char *name = "pdx_proxy_instance_breaker_transitions_total";
	int bad = family(out, name, "counter",
			 "an instance's circuit breaker turning open, "
			 "half_open or closed");
	static const char *const to[PDX_BREAKER_STATES] = {"closed", "open",
							   "half_open"};

	for (int r = 0; r < 2; r++) {
		const struct pdx_pool *p = &px->pool[r];

		for (unsigned i = 0; i < p->n; i++)
			for (int s = 0; s < PDX_BREAKER_STATES; s++)
				bad |= evbuffer_add_printf(
					   out,
					   "%s{role=\"%s\",instance=\"%s\","
					   "to=\"%s\"} %llu\n",
					   name, pdx_pool_role_name(p->role),
					   p->inst[i]->url, to[s],
					   (unsigned long long)p->inst[i]
					       ->breaker.entered[s]) < 0;
	}
	return bad;
}

static int render_instances(const struct pdx_proxy *px, struct evbuffer *out)
{
	int bad = render_per_instance(
		px, out, "pdx_proxy_instance_inflight", "gauge",
		"requests of this proxy in flight on an instance", INST_INFLIGHT);

	bad |= render_per_instance(
		px, out, "pdx_proxy_instance_transfers", "gauge",
		"transfers this proxy set up on an instance that its agent has "
		"not reported finished (needs --notify-bind)",
		INST_XFERS);
	bad |= render_per_instance(px, out, "pdx_proxy_instance_requests_total",
				   "counter", "requests sent to an instance",
				   INST_REQUESTS);
	bad |= render_per_instance(
		px, out, "pdx_proxy_instance_failures_total", "counter",
		"requests to an instance that failed: no answer, a timeout or a "
		"5xx", INST_FAILURES);
	bad |= render_per_instance(
		px, out, "pdx_proxy_instance_healthy", "gauge",
		"1 while an instance passes its health checks (or is not "
		"checked), 0 while it is out of rotation", INST_HEALTHY);
	bad |= render_per_instance(
		px, out, "pdx_proxy_instance_breaker_state", "gauge",
		"an instance's circuit breaker: 0 closed, 1 open, 2 half-open",
		INST_BREAKER);
	bad |= render_breaker_transitions(px, out);
	bad |=
	    family(out, "pdx_proxy_instances", "gauge", "instances in a pool");
	for (int r = 0; r < 2; r++)
		bad |= evbuffer_add_printf(
			   out, "pdx_proxy_instances{role=\"%s\"} %u\n",
			   pdx_pool_role_name(px->pool[r].role),
			   px->pool[r].n) < 0;
	return bad;
}

static int render_dns(const struct pdx_discovery *d, struct evbuffer *out)
{
	struct pdx_dns_name_stats st[PDX_DISCOVERY_NAMES];
	int bad;

	if (!d->n)
		return 0;
	for (unsigned k = 0; k < d->n; k++)
		pdx_discovery_stats(d, k, &st[k]);
	bad = family(out, "pdx_proxy_dns_instances", "gauge",
		     "instances a --prefill-dns or --decode-dns name added "
		     "that have not left its records");
	for (unsigned k = 0; k < d->n; k++)
		bad |= evbuffer_add_printf(
			   out, "pdx_proxy_dns_instances{role=\"%s\",name=\"%s\"} %u\n",
			   pdx_pool_role_name(st[k].role), st[k].name,
			   st[k].instances) < 0;
	bad |= family(out, "pdx_proxy_dns_resolve_failures_total", "counter",
		      "rounds in which a DNS name gave no address (its last "
		      "instances are kept)");
	for (unsigned k = 0; k < d->n; k++)
		bad |= evbuffer_add_printf(
			   out,
			   "pdx_proxy_dns_resolve_failures_total{role=\"%s\","
			   "name=\"%s\"} %llu\n",
			   pdx_pool_role_name(st[k].role), st[k].name,
			   (unsigned long long)st[k].failures) < 0;
	return bad;
}

static int render_transfers(const struct pdx_transfers *t,
			    struct evbuffer *out)
{
	int bad = family(out, "pdx_proxy_transfer_notifications_total",
			 "counter",
			 "agents' notifications received, by what they were "
			 "about: a transfer counted here, an unknown one, or "
			 "not an xfer_event");

	bad |= evbuffer_add_printf(
		   out,
		   "pdx_proxy_transfer_notifications_total{about=\"counted\"} "
		   "%llu\n"
		   "pdx_proxy_transfer_notifications_total{about=\"unknown\"} "
		   "%llu\n"
		   "pdx_proxy_transfer_notifications_total{about=\"bad\"} "
		   "%llu\n",
		   (unsigned long long)(t->events - t->unknown),
		   (unsigned long long)t->unknown,
		   (unsigned long long)t->bad) < 0;
	bad |= family(out, "pdx_proxy_transfers_expired_total", "counter",
		      "transfers no agent reported within --transfer-timeout");
	bad |= evbuffer_add_printf(out,
				   "pdx_proxy_transfers_expired_total %llu\n",
				   (unsigned long long)t->expired) < 0;
	bad |= family(out, "pdx_proxy_transfers_sent_total", "counter",
		      "transfers of this proxy the sending agents reported sent, "
		      "by the data path they chose (pdx-agent --data-path)");
	for (int i = 0; i < PDX_TRANSFER_PATHS; i++)
		bad |= evbuffer_add_printf(
			   out, "pdx_proxy_transfers_sent_total{path=\"%s\"} %llu\n",
			   pdx_transfer_paths[i],
			   (unsigned long long)t->sent[i]) < 0;
	bad |= family(out, "pdx_proxy_transfer_sent_bytes_total", "counter",
		      "KV bytes of those transfers, by data path");
	for (int i = 0; i < PDX_TRANSFER_PATHS; i++)
		bad |= evbuffer_add_printf(
			   out,
			   "pdx_proxy_transfer_sent_bytes_total{path=\"%s\"} %llu\n",
			   pdx_transfer_paths[i],
			   (unsigned long long)t->sent_bytes[i]) < 0;
	return bad;
}

int pdx_proxy_metrics_render(const struct pdx_proxy *px, struct evbuffer *out)
{
	const struct pdx_proxy_metrics *m = &px->metrics;
	int bad;

	bad = pdx_prom_build_info(out, "pdx_proxy_build_info", "");
	bad |= family(out, "pdx_proxy_requests_total", "counter",
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
	bad |= family(out, "pdx_proxy_retries_total", "counter",
		      "client requests started over after a leg failed before "
		      "any byte reached the client, by the failed leg");
	for (int r = 0; r < 2; r++)
		bad |= evbuffer_add_printf(
			   out, "pdx_proxy_retries_total{leg=\"%s\"} %llu\n",
			   pdx_pool_role_name(r),
			   (unsigned long long)m->retries[r]) < 0;
	bad |= family(out, "pdx_proxy_draining", "gauge",
		      "1 after SIGTERM, SIGINT or SIGHUP while requests in flight "
		      "finish");
	bad |= evbuffer_add_printf(out, "pdx_proxy_draining %d\n",
				   px->draining) < 0;
	bad |= render_instances(px, out);
	bad |= render_dns(&px->discovery, out);
	bad |= render_transfers(&px->xfers, out);
	bad |= family(out, "pdx_proxy_request_duration_seconds", "histogram",
		      "time from a client request's arrival to its end");
	bad |= hist_render(out, "pdx_proxy_request_duration_seconds", "",
			   &m->lat);
	bad |= family(out, "pdx_proxy_request_phase_seconds", "histogram",
		      "where the time to first token went: prefill_queue and "
		      "prefill (P's Server-Timing), decode_queue and kv_wait "
		      "(D's), first_token (the proxy's clock)");
	for (int p = 0; p < PDX_PHASES; p++)
		bad |= hist_render(out, "pdx_proxy_request_phase_seconds",
				   phase_names[p], &m->phase[p]);
	return bad ? -1 : 0;
}
