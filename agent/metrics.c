/* The agent's Prometheus metrics and their server (see metrics.h). */
#define PDX_LOG_TOPIC "metrics"
#include "agent/metrics.h"

#include <event2/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/http_listen.h"
#include "common/http_route.h"
#include "common/log.h"

enum { OUT_SENT, OUT_RECEIVED, OUT_FAILED };

static const char *const outcome_names[METRICS_OUTCOMES] = {"sent", "received",
							    "failed"};
static const char *const role_names[2] = {"send", "recv"};

_Static_assert(METRICS_PATHS == DATA_STAGED + 1, "a count per data path");

/* The path label: the option's spelling, "none" when no handshake with
 * the peer was held as the transfer ended (it failed before one, or
 * because the peer went). */
static const char *path_label(int d)
{
	return d == DATA_AUTO ? "none" : data_path_key((enum data_path)d);
}

void metrics_xfer_ended(struct agent *a, const struct xfer *x, int d)
{
	struct agent_metrics *m = &a->metrics;
	int role = x->role == XFER_SEND ? 0 : 1;

	if (x->status) {
		m->xfers[OUT_FAILED][d]++;
	} else {
		m->xfers[role ? OUT_RECEIVED : OUT_SENT][d]++;
		pdx_prom_hist_observe(&m->duration[role],
				      (double)(pdx_now_ns() - x->t_first_ns) /
					  1e9);
	}
	m->bytes[role][d] += x->bytes;
}

void metrics_handshake(struct agent *a, bool ok)
{
	a->metrics.handshakes[ok]++;
}

void metrics_lease_renewed(struct agent *a)
{
	a->metrics.renewals++;
}

static int render_counts(const struct agent_metrics *m, struct evbuffer *out)
{
	static const char xn[] = "pdx_agent_transfers_total";
	static const char bn[] = "pdx_agent_transfer_bytes_total";
	static const char hn[] = "pdx_agent_transfer_duration_seconds";
	char lab[64];
	int bad;

	bad =
	    pdx_prom_family(out, xn, "counter",
			    "transfers ended, by outcome (the engine's event: "
			    "sent, received or failed) and data path (none: "
			    "no handshake held with the peer at the end)");
	for (int o = 0; o < METRICS_OUTCOMES; o++)
		for (int d = 0; d < METRICS_PATHS; d++) {
			snprintf(lab, sizeof(lab), "outcome=\"%s\",path=\"%s\"",
				 outcome_names[o], path_label(d));
			bad |= pdx_prom_sample(out, xn, lab, m->xfers[o][d]);
		}
	bad |=
	    pdx_prom_family(out, bn, "counter",
			    "KV payload bytes of transfers ended, failed ones "
			    "included, by role (send: pushed from here, recv: "
			    "written here) and data path");
	for (int r = 0; r < 2; r++)
		for (int d = 0; d < METRICS_PATHS; d++) {
			snprintf(lab, sizeof(lab), "role=\"%s\",path=\"%s\"",
				 role_names[r], path_label(d));
			bad |= pdx_prom_sample(out, bn, lab, m->bytes[r][d]);
		}
	bad |=
	    pdx_prom_family(out, hn, "histogram",
			    "time from a transfer's first mention here (our "
			    "engine's send or recv, or the peer's message) to "
			    "its end, of transfers that completed");
	for (int r = 0; r < 2; r++) {
		snprintf(lab, sizeof(lab), "outcome=\"%s\"",
			 outcome_names[r ? OUT_RECEIVED : OUT_SENT]);
		bad |= pdx_prom_hist_render(out, hn, lab, &m->duration[r]);
	}
	bad |=
	    pdx_prom_family(out, "pdx_agent_handshakes_total", "counter",
			    "handshakes settled here: a peer's hello accepted "
			    "(ok) or refused by either side (refused)");
	bad |= pdx_prom_sample(out, "pdx_agent_handshakes_total",
			       "result=\"ok\"", m->handshakes[1]);
	bad |= pdx_prom_sample(out, "pdx_agent_handshakes_total",
			       "result=\"refused\"", m->handshakes[0]);
	bad |= pdx_prom_family(out, "pdx_agent_lease_renewals_total", "counter",
			       "leases of sent transfers renewed by the "
			       "receiver's ping while its engine queues them");
	bad |= pdx_prom_sample(out, "pdx_agent_lease_renewals_total", "",
			       m->renewals);
	return bad;
}

static int render_state(const struct agent *a, struct evbuffer *out)
{
	static const char *const states[] = {
	    [PEER_NEW] = "none",
	    [PEER_HELLO_SENT] = "handshaking",
	    [PEER_READY] = "ready",
	    [PEER_REFUSED] = "refused",
	};
	uint64_t peers[4] = {0}, live[2] = {0};
	const struct peer *p, *ptmp;
	const struct xfer *x, *xtmp;
	char lab[32];
	int bad;

	HASH_ITER(hh, a->peers, p, ptmp)
	peers[p->state]++;
	HASH_ITER(hh, a->xfers, x, xtmp)
	live[x->role == XFER_SEND ? 0 : 1]++;
	bad = pdx_prom_family(out, "pdx_agent_peers", "gauge",
			      "peer agents known here, by handshake state "
			      "(none: no handshake held now)");
	for (int s = 0; s < 4; s++) {
		snprintf(lab, sizeof(lab), "state=\"%s\"", states[s]);
		bad |= pdx_prom_sample(out, "pdx_agent_peers", lab, peers[s]);
	}
	bad |= pdx_prom_family(out, "pdx_agent_transfers_live", "gauge",
			       "transfers in the table (--max-xfers bounds "
			       "them), by role");
	for (int r = 0; r < 2; r++) {
		snprintf(lab, sizeof(lab), "role=\"%s\"", role_names[r]);
		bad |= pdx_prom_sample(out, "pdx_agent_transfers_live", lab,
				       live[r]);
	}
	bad |= pdx_prom_family(out, "pdx_agent_engine_registered", "gauge",
			       "1 while an engine is registered, else 0");
	bad |=
	    pdx_prom_sample(out, "pdx_agent_engine_registered", "", a->reg.ok);
	snprintf(lab, sizeof(lab), ",peer_protocol=\"%d\"",
		 PEER_PROTOCOL_VERSION);
	bad |= pdx_prom_build_info(out, "pdx_agent_build_info", lab);
	bad |= pdx_prom_family(out, "pdx_agent_notifications_dropped_total",
			       "counter",
			       "transfer notifications (--notify) dropped "
			       "while a collector was away or slow (one "
			       "per collector)");
	bad |= pdx_prom_sample(out, "pdx_agent_notifications_dropped_total", "",
			       a->notify_dropped);
	bad |= pdx_prom_family(out, "pdx_agent_slice_waits_total", "counter",
			       "times a transfer waited for room for the "
			       "buffers of TP slices or whole blocks pulled "
			       "(16 MiB a peer, 32 MiB an agent in flight)");
	bad |= pdx_prom_sample(out, "pdx_agent_slice_waits_total", "",
			       a->slices.waited);
	bad |= pdx_prom_family(out, "pdx_agent_slice_bytes_in_flight", "gauge",
			       "bytes of those buffers UCX has not finished "
			       "with");
	bad |= pdx_prom_sample(out, "pdx_agent_slice_bytes_in_flight", "",
			       a->slices.bytes_out);
	return bad;
}

static void on_request(struct evhttp_request *req, void *arg)
{
	struct agent *a = arg;
	char buf[PDX_HTTP_PATH_MAX];
	/* "/metrics/" too, as the engine's and the proxy's routes */
	const char *path = pdx_http_route_path(req, buf, sizeof(buf));
	struct evbuffer *b;

	if (strcmp(path, "/metrics")) {
		evhttp_send_error(req, 404, "only /metrics here");
		return;
	}
	b = evbuffer_new();
	if (!b || render_counts(&a->metrics, b) || render_state(a, b)) {
		if (b)
			evbuffer_free(b);
		evhttp_send_error(req, 500, "out of memory");
		return;
	}
	evhttp_add_header(evhttp_request_get_output_headers(req),
			  "Content-Type", "text/plain; version=0.0.4");
	evhttp_send_reply(req, 200, NULL, b);
	evbuffer_free(b);
}

int metrics_addr_parse(const char *addr, char *host, size_t len, uint16_t *port)
{
	const char *colon = strrchr(addr, ':');
	char *end;
	unsigned long v;
	size_t n;

	if (!colon || colon == addr || !colon[1])
		return -1;
	v = strtoul(colon + 1, &end, 10);
	if (*end || v > 65535 || colon[1] == '-' || colon[1] == '+')
		return -1;
	n = (size_t)(colon - addr);
	if (addr[0] == '[' && colon[-1] == ']') {
		addr++;
		n -= 2;
	}
	if (n == 0 || n >= len)
		return -1;
	memcpy(host, addr, n);
	host[n] = '\0';
	*port = (uint16_t)v;
	return 0;
}

int metrics_start(struct agent *a)
{
	struct evhttp_bound_socket *bs;
	char host[PDX_ADDR_MAX], err[256];
	uint16_t port;

	if (!a->cfg.metrics_addr)
		return 0;
	if (metrics_addr_parse(a->cfg.metrics_addr, host, sizeof(host), &port))
		return -1; /* parse_args() checked it */
	a->metrics.http = evhttp_new(a->base);
	if (!a->metrics.http)
		return -1;
	evhttp_set_allowed_methods(a->metrics.http, EVHTTP_REQ_GET);
	evhttp_set_max_body_size(a->metrics.http, 1024);
	evhttp_set_max_headers_size(a->metrics.http, 8192);
	evhttp_set_timeout(a->metrics.http, 10);
	evhttp_set_gencb(a->metrics.http, on_request, a);
	bs = pdx_http_bind(a->metrics.http, host, port, "--metrics port", err,
			   sizeof(err));
	if (!bs) {
		log_error("--metrics: %s", err);
		return -1;
	}
	pdx_http_listen_tune(bs);
	if (pdx_http_listen_start(bs, "--metrics port", err,
				  sizeof(err))) {
		log_error("--metrics: %s", err);
		return -1;
	}
	log_info("metrics on http://%s%s%s:%u/metrics",
		 strchr(host, ':') ? "[" : "", host,
		 strchr(host, ':') ? "]" : "", pdx_http_bound_port(bs));
	return 0;
}

void metrics_stop(struct agent *a)
{
	if (a->metrics.http)
		evhttp_free(a->metrics.http);
	a->metrics.http = NULL;
}
