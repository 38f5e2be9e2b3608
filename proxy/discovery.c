/* Instances found through DNS (see discovery.h). */
#define PDX_LOG_TOPIC "dns"
#include "proxy/discovery.h"

#include <arpa/inet.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define RESOLV_CONF "/etc/resolv.conf"
#define MIN_PERIOD_S 1 /* the soonest a name is asked again */

/* "host:port" as pdx_pool_add() takes it: brackets around IPv6 */
#define ADDR_LEN (INET6_ADDRSTRLEN + 8)

struct pdx_dns_name {
	struct pdx_discovery *d;
	struct pdx_pool *pool;
	const char *spec; /* "NAME:PORT" as given */
	char host[PDX_POOL_ADDR_MAX];
	uint16_t port;
	struct event *timer;
	/* this round: queries in flight, the first error, the smallest TTL
	 * and the addresses found */
	unsigned pending;
	int err;
	int ttl;
	unsigned n_found;
	char found[PDX_POOL_MAX][ADDR_LEN];
	/* the instances this name added and its pool still holds */
	unsigned n_owned;
	char owned[PDX_POOL_MAX][ADDR_LEN];
	int last_err; /* the last round's outcome (logged when it changes) */
	uint64_t failures;
};

static bool listed(char (*v)[ADDR_LEN], unsigned n, const char *a)
{
	for (unsigned k = 0; k < n; k++)
		if (!strcmp(v[k], a))
			return true;
	return false;
}

static void arm(struct pdx_dns_name *nm, unsigned s)
{
	struct timeval tv = {s, 0};

	evtimer_add(nm->timer, &tv);
}

/* New addresses in, vanished ones out; each instance this name added is
 * in owned until it leaves again. */
static void apply(struct pdx_dns_name *nm)
{
	const char *role = pdx_pool_role_name(nm->pool->role);
	char err[192];

	for (unsigned k = 0; k < nm->n_found; k++) {
		const char *a = nm->found[k];

		if (listed(nm->owned, nm->n_owned, a))
			continue;
		if (pdx_pool_add(nm->pool, a, err, sizeof(err))) {
			/* "already": given by a flag or the admin API */
			log_debug("%s: %s", nm->spec, err);
			continue;
		}
		snprintf(nm->owned[nm->n_owned++], ADDR_LEN, "%s", a);
		log_info("%s: added %s instance %s", nm->spec, role,
			 nm->pool->inst[nm->pool->n - 1]->url);
	}
	for (unsigned k = 0; k < nm->n_owned;) {
		const char *a = nm->owned[k];

		if (listed(nm->found, nm->n_found, a)) {
			k++;
			continue;
		}
		/* the admin API may have removed it already */
		if (!pdx_pool_remove(nm->pool, a))
			log_info("%s: %s instance http://%s left the records: removed, "
				 "its requests in flight finish",
				 nm->spec, role, a);
		memmove(nm->owned[k], nm->owned[k + 1],
			(nm->n_owned - k - 1) * sizeof(nm->owned[0]));
		nm->n_owned--;
	}
}

/* Both queries answered: a set found replaces the last one; none keeps
 * it. Logged when the outcome changes. */
static void round_end(struct pdx_dns_name *nm)
{
	int err = nm->n_found ? DNS_ERR_NONE
			      : nm->err ? nm->err : DNS_ERR_NODATA;
	unsigned next;

	if (err != DNS_ERR_NONE) {
		nm->failures++;
		if (err != nm->last_err)
			log_warn("%s: no address (%s); keeping the %u %s "
				 "instances found before",
				 nm->spec, evdns_err_to_string(err),
				 nm->n_owned,
				 pdx_pool_role_name(nm->pool->role));
		nm->last_err = err;
		arm(nm, nm->d->interval_s);
		return;
	}
	if (nm->last_err != DNS_ERR_NONE)
		log_info("%s: resolves again (%u addresses)", nm->spec,
			 nm->n_found);
	nm->last_err = DNS_ERR_NONE;
	apply(nm);
	next = nm->ttl < MIN_PERIOD_S ? MIN_PERIOD_S : (unsigned)nm->ttl;
	if (next > nm->d->interval_s)
		next = nm->d->interval_s;
	log_debug("%s: %u addresses, ttl %d s; asked again in %u s", nm->spec,
		  nm->n_found, nm->ttl, next);
	arm(nm, next);
}

static void found_add(struct pdx_dns_name *nm, int family, const void *a)
{
	char ip[INET6_ADDRSTRLEN];

	if (nm->n_found == PDX_POOL_MAX ||
	    !inet_ntop(family, a, ip, sizeof(ip)))
		return;
	snprintf(nm->found[nm->n_found], ADDR_LEN,
		 family == AF_INET6 ? "[%s]:%u" : "%s:%u", ip, nm->port);
	if (!listed(nm->found, nm->n_found, nm->found[nm->n_found]))
		nm->n_found++;
}

/* One query's answer (A or AAAA). A name with records of one family only
 * gets "no data" for the other: only the first real error is kept. */
static void on_answer(int result, char type, int count, int ttl,
		      void *addresses, void *arg)
{
	struct pdx_dns_name *nm = arg;

	if (result == DNS_ERR_NONE) {
		for (int k = 0; k < count; k++)
			found_add(nm, type == DNS_IPv6_AAAA ? AF_INET6 : AF_INET,
				  type == DNS_IPv6_AAAA
				      ? (const void *)((const struct in6_addr *)
							   addresses + k)
				      : (const void *)((const uint32_t *)
							   addresses + k));
		if (count && ttl < nm->ttl)
			nm->ttl = ttl;
	} else if (!nm->err || nm->err == DNS_ERR_NODATA) {
		nm->err = result;
	}
	if (--nm->pending == 0)
		round_end(nm);
}

/* A round: both families asked at once. A query that cannot be sent
 * counts as answered with an error (evdns never calls back for it). */
static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_dns_name *nm = arg;
	struct evdns_base *dns = nm->d->dns;

	nm->pending = 2;
	nm->err = DNS_ERR_NONE;
	nm->ttl = (int)nm->d->interval_s;
	nm->n_found = 0;
	if (!evdns_base_resolve_ipv4(dns, nm->host, 0, on_answer, nm))
		on_answer(DNS_ERR_UNKNOWN, DNS_IPv4_A, 0, 0, NULL, nm);
	if (!evdns_base_resolve_ipv6(dns, nm->host, 0, on_answer, nm))
		on_answer(DNS_ERR_UNKNOWN, DNS_IPv6_AAAA, 0, 0, NULL, nm);
}

int pdx_discovery_start(struct pdx_discovery *d, struct event_base *base,
			const char *server, unsigned interval_s, char *err,
			size_t errlen)
{
	int rc;

	d->base = base;
	d->interval_s = interval_s;
	/* its own sockets and timers do not keep the loop alive */
	d->dns = evdns_base_new(base, EVDNS_BASE_DISABLE_WHEN_INACTIVE);
	if (!d->dns) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	if (server) {
		if (evdns_base_nameserver_ip_add(d->dns, server)) {
			snprintf(err, errlen,
				 "--dns-server: '%s' is not IP[:PORT]", server);
			return -1;
		}
		return 0;
	}
	/* 6: no nameserver listed, evdns asks 127.0.0.1 */
	rc = evdns_base_resolv_conf_parse(d->dns, DNS_OPTIONS_ALL, RESOLV_CONF);
	if (rc && rc != 6) {
		snprintf(err, errlen, "%s: cannot read it (evdns error %d)",
			 RESOLV_CONF, rc);
		return -1;
	}
	return 0;
}

int pdx_discovery_add(struct pdx_discovery *d, struct pdx_pool *pool,
		      const char *spec, char *err, size_t errlen)
{
	struct pdx_dns_name *nm;

	if (d->n == PDX_DISCOVERY_NAMES) {
		snprintf(err, errlen, "at most %d DNS names",
			 PDX_DISCOVERY_NAMES);
		return -1;
	}
	nm = calloc(1, sizeof(*nm));
	if (!nm) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	nm->d = d;
	nm->pool = pool;
	nm->spec = spec;
	nm->last_err = DNS_ERR_NONE;
	if (pdx_pool_addr_parse(spec, nm->host, sizeof(nm->host), &nm->port,
				err, errlen))
		goto bad;
	nm->timer = evtimer_new(d->base, on_timer, nm);
	if (!nm->timer) {
		snprintf(err, errlen, "out of memory");
		goto bad;
	}
	d->names[d->n++] = nm;
	arm(nm, 0);
	return 0;
bad:
	free(nm);
	return -1;
}

void pdx_discovery_stats(const struct pdx_discovery *d, unsigned k,
			 struct pdx_dns_name_stats *out)
{
	const struct pdx_dns_name *nm = d->names[k];

	out->name = nm->spec;
	out->role = nm->pool->role;
	out->instances = nm->n_owned;
	out->failures = nm->failures;
}

void pdx_discovery_stop(struct pdx_discovery *d)
{
	/* first: a query in flight is dropped without its callback */
	if (d->dns)
		evdns_base_free(d->dns, 0);
	d->dns = NULL;
	while (d->n) {
		struct pdx_dns_name *nm = d->names[--d->n];

		event_free(nm->timer);
		free(nm);
	}
}
