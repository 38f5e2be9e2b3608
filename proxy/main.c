/* pdx-proxy: options, the two pools, their health checks and the HTTP
 * server on one libevent loop. SIGTERM, SIGINT or SIGHUP drain it: new requests
 * get 503, those in flight finish (up to --drain-timeout, then they are
 * cut short with a 503 or an SSE error event, and engines see their
 * client leave); a second signal cuts them at once. */
#define PDX_LOG_TOPIC "proxy"
#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hangup.h"
#include "common/http_listen.h"
#include "common/log.h"
#include "common/version.h"
#include "proxy/inst_host.h"
#include "proxy/proxy.h"

struct proxy_main {
	struct pdx_proxy_opts o;
	struct pdx_proxy px;
	struct event *sigterm, *sigint, *sighup, *drain_timer;
};

static void on_drain_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct proxy_main *m = arg;

	log_warn("--drain-timeout: %u requests still in flight are cut short",
		 m->px.ncalls);
	pdx_proxy_shut(&m->px, "the proxy is shutting down");
}

/* The first signal drains (call.c ends the loop when the last call is
 * freed), the second ends the calls left at once, each told why. */
static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct proxy_main *m = arg;
	struct pdx_proxy *px = &m->px;
	struct timeval tv = {m->o.drain_timeout_s, 0};

	if (px->draining || !px->ncalls || !m->o.drain_timeout_s ||
	    !(m->drain_timer = evtimer_new(px->base, on_drain_timeout, m)) ||
	    evtimer_add(m->drain_timer, &tv)) {
		log_info("signal %d: shutting down, %u requests in flight "
			 "cut short",
			 (int)sig, px->ncalls);
		pdx_proxy_shut(px, "the proxy is shutting down");
		return;
	}
	px->draining = true;
	log_info("signal %d: draining: new requests get 503, %u in flight "
		 "may finish within %u s (a second signal ends them now)",
		 (int)sig, px->ncalls, m->o.drain_timeout_s);
}

static int pools_fill(struct proxy_main *m)
{
	struct pdx_proxy *px = &m->px;
	char err[192];

	px->pool[PDX_POOL_PREFILL].role = PDX_POOL_PREFILL;
	px->pool[PDX_POOL_PREFILL].policy = m->o.policy_p;
	px->pool[PDX_POOL_DECODE].role = PDX_POOL_DECODE;
	px->pool[PDX_POOL_DECODE].policy = m->o.policy_d;
	for (int r = 0; r < 2; r++) {
		px->pool[r].breaker_failures = m->o.breaker_failures;
		px->pool[r].breaker_open_ns =
		    (uint64_t)m->o.breaker_open_ms * 1000000;
	}
	px->pool[PDX_POOL_PREFILL].no_trial_joining = m->o.prefill_fallback;
	for (unsigned i = 0; i < m->o.n_prefill; i++)
		if (pdx_pool_add(&px->pool[PDX_POOL_PREFILL], m->o.prefill[i],
				 err, sizeof(err)))
			goto bad;
	for (unsigned i = 0; i < m->o.n_decode; i++)
		if (pdx_pool_add(&px->pool[PDX_POOL_DECODE], m->o.decode[i],
				 err, sizeof(err)))
			goto bad;
	/* one engine as both: each request's pair shared one agent, and got
	 * a 502 that prescribed --advertise */
	for (unsigned i = 0; i < px->pool[PDX_POOL_DECODE].n; i++) {
		const struct pdx_inst *d = px->pool[PDX_POOL_DECODE].inst[i];

		for (unsigned k = 0; k < px->pool[PDX_POOL_PREFILL].n; k++)
			if (!strcmp(px->pool[PDX_POOL_PREFILL].inst[k]->url,
				    d->url)) {
				snprintf(err, sizeof(err),
					 "%s is given with both --prefill and "
					 "--decode: an engine is one or the "
					 "other", d->url);
				goto bad;
			}
	}
	/* said at start, as each connect would fail so (a cluster's DNS
	 * may add the name later: not refused) */
	for (int r = 0; r < 2; r++)
		for (unsigned k = 0; k < px->pool[r].n; k++) {
			const struct pdx_inst *i = px->pool[r].inst[k];
			char why[160];

			if (!pdx_inst_host_resolves(i, why, sizeof(why)))
				log_warn("--%s %s: %s; its requests and health "
					 "checks fail until it does",
					 pdx_pool_role_name(i->role), i->url,
					 why);
		}
	return 0;
bad:
	fprintf(stderr, "pdx-proxy: %s\n", err);
	return -1;
}

/* Descriptors a client request may hold: the client's socket, a decode
 * and a prefill leg. Beside them: the listener, the loop, logs, and the
 * idle connections kept for the instances given at start. */
#define FDS_PER_CALL 3
#define FDS_RESERVE 64

/* The most requests limit descriptors hold: each FDS_PER_CALL, and each
 * instance up to keepalive idle connections, which only requests made
 * (an instance never keeps more idle than were ever open to it at once,
 * so no more than the requests: under a low limit, counting every
 * instance's whole keepalive lowered 4 instances under ulimit -n 256 to
 * 1 request). At least 1. */
static rlim_t inflight_cap(rlim_t limit, unsigned keepalive,
			   unsigned instances)
{
	rlim_t avail = limit > FDS_RESERVE ? limit - FDS_RESERVE : 0;
	rlim_t cap = avail / (FDS_PER_CALL + instances);

	if (cap > keepalive) /* the idle lists fill before the requests do */
		cap = (avail - (rlim_t)keepalive * instances) / FDS_PER_CALL;
	return cap ? cap : 1;
}

/* Raises the soft limit on file descriptors to the hard one (under a
 * shell's 1024, about 300 requests fit), and lowers --max-inflight to
 * what the limit allows, so that overload gets a 429, not failed sockets. */
static void nofile_raise(struct pdx_proxy_opts *o)
{
	rlim_t limit = pdx_nofile_raise(), cap;

	if (limit == RLIM_INFINITY)
		return;
	cap = inflight_cap(limit, o->keepalive, o->n_prefill + o->n_decode);
	if (o->max_inflight > cap) {
		log_warn("--max-inflight %u lowered to %llu: the limit of %llu "
			 "file descriptors (ulimit -n) allows no more",
			 o->max_inflight, (unsigned long long)cap,
			 (unsigned long long)limit);
		o->max_inflight = (unsigned)cap;
	}
}

/* Where prefill engines post their early callback: the option, or this
 * proxy's own route (a wildcard listen address is reached on loopback). */
static void metaserver_url_set(struct pdx_proxy *px,
			       const struct pdx_proxy_opts *o)
{
	const char *h = o->host;

	if (o->metaserver_url) {
		snprintf(px->metaserver_url, sizeof(px->metaserver_url), "%s",
			 o->metaserver_url);
		return;
	}
	if (!strcmp(h, "0.0.0.0") || !strcmp(h, "::") || !*h) {
		h = "127.0.0.1";
		/* prefill engines on other hosts cannot post there: each
		 * request would run sequentially, and say so only at info */
		if (o->flow == PDX_FLOW_EARLY_CALLBACK)
			log_warn("--flow early-callback with --host %s and no "
				 "--metaserver-url: prefill engines post their "
				 "callback to 127.0.0.1:%u, which only engines "
				 "on this host reach (the others' requests run "
				 "as --flow sequential); give --metaserver-url "
				 "an address they reach",
				 *o->host ? o->host : "\"\"", px->port);
	}
	pdx_http_url(px->metaserver_url, sizeof(px->metaserver_url), h,
		     px->port, "/v1/metaserver");
}

/* --prefill-dns, --decode-dns: each name's first round runs once the
 * loop does. */
static int discovery_start(struct proxy_main *m)
{
	struct pdx_proxy *px = &m->px;
	char err[192];

	if (!m->o.n_dns)
		return 0;
	if (pdx_discovery_start(&px->discovery, px->base, m->o.dns_server,
				m->o.dns_interval_s, err, sizeof(err)))
		goto bad;
	for (unsigned k = 0; k < m->o.n_dns; k++)
		if (pdx_discovery_add(&px->discovery,
				      &px->pool[m->o.dns[k].role],
				      m->o.dns[k].name, err, sizeof(err)))
			goto bad;
	return 0;
bad:
	log_error("dns: %s", err);
	return -1;
}

static int proxy_start(struct proxy_main *m)
{
	struct pdx_proxy *px = &m->px;
	struct event_config *cfg = event_config_new();
	char err[192], url[PDX_HTTP_URL_MAX];
	bool hup;

	if (!cfg)
		return -1;
	/* epoll_ctl calls merged per loop turn: evhttp and the client watch
	 * turn read and write interest off and on within one turn (62 -> 52
	 * us of CPU a request, docs/benchmarking.md). Unsafe only for
	 * dup()ed descriptors, which the proxy has none of. */
	event_config_set_flag(cfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
	px->base = event_base_new_with_config(cfg);
	event_config_free(cfg);
	if (!px->base)
		return -1;
	m->sigterm = evsignal_new(px->base, SIGTERM, on_signal, m);
	m->sigint = evsignal_new(px->base, SIGINT, on_signal, m);
	/* a closed terminal drains as SIGTERM does; ignored when we
	 * started (nohup), it stays so */
	hup = !pdx_sighup_ignored();
	if (hup)
		m->sighup = evsignal_new(px->base, SIGHUP, on_signal, m);
	if (!m->sigterm || !m->sigint || (hup && !m->sighup) ||
	    evsignal_add(m->sigterm, NULL) || evsignal_add(m->sigint, NULL) ||
	    (m->sighup && evsignal_add(m->sighup, NULL)))
		return -1;
	if (pdx_proxy_listen(px, err, sizeof(err))) {
		log_error("http: %s", err);
		return -1;
	}
	metaserver_url_set(px, &m->o);
	if (m->o.notify_bind) {
		if (pdx_transfers_open(&px->xfers, px->base, m->o.notify_bind,
				       m->o.transfer_timeout_s, err,
				       sizeof(err))) {
			log_error("--notify-bind: %s", err);
			return -1;
		}
		log_info("transfer notifications on %s", px->xfers.endpoint);
	}
	if (m->o.health_interval_ms &&
	    pdx_health_start(&px->health, px->base, px->pool,
			     m->o.health_interval_ms, m->o.health_timeout_ms,
			     m->o.unhealthy_after, m->o.healthy_after))
		return -1;
	if (discovery_start(m))
		return -1;
	log_info("flow %s, %u prefill (%s, %s), %u decode (%s, %s), admin "
		 "api %s",
		 pdx_proxy_flow_name(m->o.flow), px->pool[0].n,
		 pdx_proxy_kind_name(m->o.kind_p),
		 pdx_pool_policy_name(px->pool[0].policy), px->pool[1].n,
		 pdx_proxy_kind_name(m->o.kind_d),
		 pdx_pool_policy_name(px->pool[1].policy),
		 m->o.admin_token ? "on" : "off");
	pdx_http_url(url, sizeof(url), m->o.host, px->port, "");
	log_info("listening on %s", url);
	return 0;
}

static void proxy_stop(struct proxy_main *m)
{
	pdx_proxy_close(&m->px);
	pdx_health_stop(&m->px.health);
	pdx_discovery_stop(&m->px.discovery);
	pdx_upstreams_clear(&m->px.legs);
	pdx_transfers_close(&m->px.xfers);
	pdx_pool_clear(&m->px.pool[PDX_POOL_PREFILL]);
	pdx_pool_clear(&m->px.pool[PDX_POOL_DECODE]);
	if (m->drain_timer)
		event_free(m->drain_timer);
	if (m->sigint)
		event_free(m->sigint);
	if (m->sigterm)
		event_free(m->sigterm);
	if (m->sighup)
		event_free(m->sighup);
	if (m->px.base)
		event_base_free(m->px.base);
}

int main(int argc, char **argv)
{
	static struct proxy_main m; /* the options hold the address tables */
	char err[256];
	int rc = 1;

	switch (pdx_proxy_opts_parse(argc, argv, &m.o, err, sizeof(err))) {
	case PDX_PROXY_OPTS_HELP:
		pdx_proxy_opts_usage(stdout);
		return 0;
	case PDX_PROXY_OPTS_VERSION:
		pdx_version_print("pdx-proxy");
		return 0;
	case PDX_PROXY_OPTS_BAD:
		fprintf(stderr, "pdx-proxy: %s (see --help)\n", err);
		return 2;
	case PDX_PROXY_OPTS_RUN:
		break;
	}
	m.px.o = &m.o;
	LIST_INIT(&m.px.calls);
	LIST_INIT(&m.px.legs.legs);
	if (pools_fill(&m)) {
		pdx_pool_clear(&m.px.pool[0]);
		pdx_pool_clear(&m.px.pool[1]);
		return 2;
	}
	pdx_log_prefix("proxy");
	nofile_raise(&m.o);
	signal(SIGPIPE, SIG_IGN);
	if (proxy_start(&m) == 0 && event_base_dispatch(m.px.base) == 0)
		rc = 0;
	proxy_stop(&m);
	return rc;
}
