/* Instances found through DNS (see discovery.h). */
#define PDX_LOG_TOPIC "dns"
#include "proxy/discovery.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "proxy/dns_srv.h"

#define RESOLV_CONF "/etc/resolv.conf"
#define MIN_PERIOD_S 1	/* the soonest a name is asked again */
#define SRV_TIMEOUT_S 3 /* an SRV query's answer, else the round failed */
#define SRV_TARGETS 64	/* targets of one SRV name used */

/* "host:port" as pdx_pool_add() takes it: brackets around IPv6 */
#define ADDR_LEN (INET6_ADDRSTRLEN + 8)

/* A name whose A and AAAA records are asked, and the port of the
 * instances at its addresses. */
struct target {
	struct pdx_dns_name *nm;
	char name[PDX_DNS_NAME_MAX];
	uint16_t port;
};

struct pdx_dns_name {
	struct pdx_discovery *d;
	struct pdx_pool *pool;
	const char *spec; /* "NAME:PORT" or an SRV "NAME", as given */
	bool srv;	  /* no port given: spec names SRV records */
	char name[PDX_DNS_NAME_MAX]; /* a NAME:PORT's NAME */
	unsigned cand;		     /* its expansion asked this round */
	struct event *timer;
	/* an SRV name's query: its connected UDP socket and the id asked */
	evutil_socket_t sock;
	struct event *srv_ev;
	uint16_t srv_id;
	/* this round: the names whose A and AAAA records are asked (the
	 * name itself, or an SRV name's targets with their ports), queries
	 * in flight, the first error, the smallest TTL, the addresses found */
	unsigned n_targets;
	struct target targets[SRV_TARGETS];
	unsigned pending;
	int err;
	const char *why; /* the SRV query's error when not a DNS one */
	int ttl;
	unsigned n_found;
	char found[PDX_POOL_MAX][ADDR_LEN];
	/* the instances this name added and its pool still holds */
	unsigned n_owned;
	char owned[PDX_POOL_MAX][ADDR_LEN];
	int last_err;	 /* the last round's outcome (logged when it changes) */
	bool add_failed; /* an address found could not be added (logged) */
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

/* Vanished addresses out, then new ones in (so a full pool has room for
 * a pod that came back under a new address); each instance this name
 * added is in owned until it leaves again. An address already in the
 * pool (a flag's, the admin API's) is left to its owner. A failed add
 * (the pool full) is logged once until every address found is in. */
static void apply(struct pdx_dns_name *nm)
{
	const char *role = pdx_pool_role_name(nm->pool->role);
	bool all_in = true;
	char err[192];

	for (unsigned k = 0; k < nm->n_owned;) {
		const char *a = nm->owned[k];

		if (listed(nm->found, nm->n_found, a)) {
			k++;
			continue;
		}
		/* the admin API may have removed it already */
		if (!pdx_pool_remove(nm->pool, a))
			log_info("%s: %s instance http://%s left the records: "
				 "removed, its requests in flight finish",
				 nm->spec, role, a);
		memmove(nm->owned[k], nm->owned[k + 1],
			(nm->n_owned - k - 1) * sizeof(nm->owned[0]));
		nm->n_owned--;
	}
	/* owned is now within found, so it has room for the rest of it */
	for (unsigned k = 0; k < nm->n_found; k++) {
		const char *a = nm->found[k];

		if (listed(nm->owned, nm->n_owned, a))
			continue;
		if (pdx_pool_has(nm->pool, a)) {
			log_debug("%s: %s already in the %s pool: left to its "
				  "owner",
				  nm->spec, a, role);
			continue;
		}
		if (pdx_pool_add(nm->pool, a, err, sizeof(err))) {
			if (!nm->add_failed)
				log_warn("%s: %s not added: %s", nm->spec, a,
					 err);
			nm->add_failed = true;
			all_in = false;
			continue;
		}
		/* found's entries are as long as owned's */
		memcpy(nm->owned[nm->n_owned++], a, ADDR_LEN);
		log_info("%s: added %s instance %s", nm->spec, role,
			 nm->pool->inst[nm->pool->n - 1]->url);
	}
	if (all_in)
		nm->add_failed = false;
}

/* An error that tells nothing of the records: no answer, a server's
 * failure, an answer cut short. NXDOMAIN and "no records of this type"
 * do tell: that target has no such address. */
static bool unanswered(int err)
{
	return err != DNS_ERR_NONE && err != DNS_ERR_NODATA &&
	       err != DNS_ERR_NOTEXIST;
}

/* Every query answered: a set found replaces the last one. A round with
 * one query unanswered, or with no address at all, keeps the last set
 * (a timeout on one of an SRV name's targets must not drain that pod's
 * instances). Logged when the outcome changes. */
static bool expansion(const struct pdx_dns_name *nm, unsigned k, char *out,
		      size_t len);
static void targets_ask(struct pdx_dns_name *nm);

static void round_end(struct pdx_dns_name *nm)
{
	int err = unanswered(nm->err) ? nm->err
		  : nm->n_found	      ? DNS_ERR_NONE
		  : nm->err	      ? nm->err
				      : DNS_ERR_NODATA;
	unsigned next;

	/* a NAME:PORT with no address under this expansion, every query
	 * answered (NXDOMAIN, no records): the next one */
	if (!nm->srv && !nm->n_found && !unanswered(nm->err) &&
	    expansion(nm, nm->cand + 1, nm->targets[0].name,
		      sizeof(nm->targets[0].name))) {
		nm->cand++;
		targets_ask(nm);
		return;
	}
	if (err != DNS_ERR_NONE) {
		nm->failures++;
		if (err != nm->last_err)
			log_warn("%s: %s (%s%s); keeping the %u %s instances "
				 "found before",
				 nm->spec,
				 nm->n_found ? "a query went unanswered"
					     : "no address",
				 nm->why ? nm->why : evdns_err_to_string(err),
				 err == DNS_ERR_TRUNCATED
				     ? ": over 512 bytes, about 28 IPv4 "
				       "addresses; give the name without a "
				       "port to follow its SRV records"
				     : "",
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

static void found_add(struct target *t, int family, const void *a)
{
	struct pdx_dns_name *nm = t->nm;
	char ip[INET6_ADDRSTRLEN];

	if (nm->n_found == PDX_POOL_MAX ||
	    !inet_ntop(family, a, ip, sizeof(ip)))
		return;
	snprintf(nm->found[nm->n_found], ADDR_LEN,
		 family == AF_INET6 ? "[%s]:%u" : "%s:%u", ip, t->port);
	if (!listed(nm->found, nm->n_found, nm->found[nm->n_found]))
		nm->n_found++;
}

static void ttl_seen(struct pdx_dns_name *nm, int ttl)
{
	if (ttl < nm->ttl)
		nm->ttl = ttl;
}

/* The error a round reports: the first unanswered query's, else the
 * first other one's (a name with records of one family only gets "no
 * data" for the other). */
static void err_seen(struct pdx_dns_name *nm, int err)
{
	if (!nm->err || (!unanswered(nm->err) && unanswered(err)))
		nm->err = err;
}

/* One query's answer (A or AAAA of one target). */
static void on_answer(int result, char type, int count, int ttl,
		      void *addresses, void *arg)
{
	struct target *t = arg;
	struct pdx_dns_name *nm = t->nm;

	if (result == DNS_ERR_NONE) {
		for (int k = 0; k < count; k++)
			found_add(
			    t, type == DNS_IPv6_AAAA ? AF_INET6 : AF_INET,
			    type == DNS_IPv6_AAAA
				? (const void *)((const struct in6_addr *)
						     addresses +
						 k)
				: (const void *)((const uint32_t *)addresses +
						 k));
		if (count)
			ttl_seen(nm, ttl);
	} else {
		err_seen(nm, result);
	}
	if (--nm->pending == 0)
		round_end(nm);
}

/* The k-th name a NAME:PORT's records are asked under, as the resolver
 * of resolv.conf gives them (glibc's order): a name with fewer dots
 * than ndots under each search domain, then as given; one with as many
 * or more as given first; one ending in a dot, or with no search list
 * (--dns-server), as given only. false past the last. */
static bool expansion(const struct pdx_dns_name *nm, unsigned k, char *out,
		      size_t len)
{
	const struct pdx_discovery *d = nm->d;
	size_t n = strlen(nm->name);
	unsigned dots = 0;
	bool first;

	for (const char *p = nm->name; *p; p++)
		dots += *p == '.';
	first =
	    dots >= d->ndots || !d->n_search || (n && nm->name[n - 1] == '.');
	if (first && k == 0) {
		snprintf(out, len, "%s", nm->name);
		return true;
	}
	if (first && (!d->n_search || nm->name[n - 1] == '.'))
		return false;
	k -= first;
	if (k < d->n_search) {
		/* too long under this domain: asked as given instead */
		if ((size_t)snprintf(out, len, "%s.%s", nm->name,
				     d->search[k]) >= len)
			snprintf(out, len, "%s", nm->name);
		return true;
	}
	if (first || k > d->n_search)
		return false;
	snprintf(out, len, "%s", nm->name);
	return true;
}

/* Asks every target's A and AAAA records, each name as it is: an SRV
 * target is a full name, a NAME:PORT's expansions are walked here
 * (expansion(), round_end()) rather than by evdns, whose search gives
 * up a name only when both families' last expansion did: the AAAA query
 * of a Service with IPv4 records only went on to the name as given,
 * which the cluster's DNS forwards out, and a refusal or timeout there
 * failed every round. A query that cannot be sent counts as answered
 * with an error (evdns never calls back for it). */
static void targets_ask(struct pdx_dns_name *nm)
{
	struct evdns_base *dns = nm->d->dns;
	int flags = DNS_QUERY_NO_SEARCH;
	unsigned n = nm->n_targets;

	nm->pending = 2 * n;
	for (unsigned k = 0; k < n; k++) {
		struct target *t = &nm->targets[k];

		if (!evdns_base_resolve_ipv4(dns, t->name, flags, on_answer, t))
			on_answer(DNS_ERR_UNKNOWN, DNS_IPv4_A, 0, 0, NULL, t);
		if (!evdns_base_resolve_ipv6(dns, t->name, flags, on_answer, t))
			on_answer(DNS_ERR_UNKNOWN, DNS_IPv6_AAAA, 0, 0, NULL,
				  t);
	}
}

/* An SRV name's answer, or its timeout: its targets are asked next. */
static void on_srv(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_dns_name *nm = arg;
	struct pdx_dns_srv rec[SRV_TARGETS];
	uint8_t msg[PDX_DNS_UDP_MAX];
	struct timeval tv = {SRV_TIMEOUT_S, 0};
	int n = -1, err = DNS_ERR_TIMEOUT;
	ssize_t len;

	while (what & EV_READ) {
		len = recv(fd, msg, sizeof(msg), 0);
		if (len < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			/* nothing that answers the query yet */
			event_add(nm->srv_ev, &tv);
			return;
		}
		if (len < 0) { /* e.g. ICMP: nobody listens there */
			err = DNS_ERR_UNKNOWN;
			nm->why = strerror(errno);
			break;
		}
		n = pdx_dns_srv_parse(msg, (size_t)len, nm->srv_id, rec,
				      SRV_TARGETS, &err);
		if (n != -1)
			break;
	}
	event_del(nm->srv_ev);
	if (n <= 0) {
		err_seen(nm, n == 0 ? DNS_ERR_NODATA : err);
		round_end(nm);
		return;
	}
	nm->n_targets = (unsigned)n;
	for (int k = 0; k < n; k++) {
		nm->targets[k].port = rec[k].port;
		ttl_seen(nm,
			 rec[k].ttl > INT32_MAX ? INT32_MAX : (int)rec[k].ttl);
		memcpy(nm->targets[k].name, rec[k].target,
		       sizeof(rec[k].target));
	}
	targets_ask(nm);
}

/* Sends an SRV name's query; a failure to send fails the round. */
static void srv_ask(struct pdx_dns_name *nm)
{
	uint8_t q[512];
	struct timeval tv = {SRV_TIMEOUT_S, 0};
	int len;

	/* a late answer of an earlier round may wait there: dropped */
	while (recv(nm->sock, q, sizeof(q), MSG_DONTWAIT) >= 0)
		;
	evutil_secure_rng_get_bytes(&nm->srv_id, sizeof(nm->srv_id));
	len = pdx_dns_srv_query(nm->srv_id, nm->spec, q, sizeof(q));
	if (len < 0 || send(nm->sock, q, (size_t)len, 0) != len ||
	    event_add(nm->srv_ev, &tv)) {
		nm->why = len < 0 ? "not a valid name" : strerror(errno);
		err_seen(nm, DNS_ERR_UNKNOWN);
		round_end(nm);
	}
}

/* A round: an SRV name's query first, then the A and AAAA records of
 * the name or of its targets, both families at once. */
static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_dns_name *nm = arg;

	nm->err = DNS_ERR_NONE;
	nm->why = NULL;
	nm->ttl = (int)nm->d->interval_s;
	nm->n_found = 0;
	if (nm->srv) {
		srv_ask(nm);
		return;
	}
	nm->n_targets = 1;
	nm->cand = 0;
	expansion(nm, 0, nm->targets[0].name, sizeof(nm->targets[0].name));
	targets_ask(nm);
}

/* resolv.conf's search list (the last `search` or `domain` line) and
 * ndots (default 1), for expansion(): evdns keeps its own to itself. */
static void search_line(struct pdx_discovery *d, char *line)
{
	char *save = NULL, *w = strtok_r(line, " \t\r\n", &save);
	bool list = w && (!strcmp(w, "search") || !strcmp(w, "domain"));
	bool options = w && !strcmp(w, "options");

	if (list)
		d->n_search = 0;
	while ((list || options) && (w = strtok_r(NULL, " \t\r\n", &save))) {
		size_t n = strlen(w);

		/* "cluster.local." is "cluster.local" (the root's dot) */
		if (list && n > 1 && w[n - 1] == '.')
			w[--n] = '\0';
		if (list && !strcmp(w, "."))
			continue;
		if (list && d->n_search < PDX_DISCOVERY_SEARCH &&
		    n < sizeof(d->search[0]))
			memcpy(d->search[d->n_search++], w, n + 1);
		if (options && !strncmp(w, "ndots:", 6))
			d->ndots = (unsigned)strtoul(w + 6, NULL, 10);
	}
}

/* Where SRV queries go: --dns-server, else the first nameserver of
 * resolv.conf (evdns keeps its list to itself), else 127.0.0.1 as evdns
 * does. ns_len stays 0 when that is no IP[:PORT]. With resolv.conf, its
 * search list and ndots too. */
static void ns_set(struct pdx_discovery *d, const char *server)
{
	struct sockaddr_in *in = (struct sockaddr_in *)&d->ns;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&d->ns;
	char line[1024], ip[128] = "127.0.0.1";
	bool ns_seen = false;
	FILE *f;

	d->ndots = 1;
	d->n_search = 0;
	if (!server) {
		f = fopen(RESOLV_CONF, "r");
		while (f && fgets(line, sizeof(line), f)) {
			if (!ns_seen &&
			    sscanf(line, " nameserver %127s", ip) == 1)
				ns_seen = true;
			else
				search_line(d, line);
		}
		if (f)
			fclose(f);
		server = ip;
	}
	d->ns_len = sizeof(d->ns);
	if (evutil_parse_sockaddr_port(server, (struct sockaddr *)&d->ns,
				       &d->ns_len)) {
		d->ns_len = 0;
		return;
	}
	if (d->ns.ss_family == AF_INET && !in->sin_port)
		in->sin_port = htons(53);
	if (d->ns.ss_family == AF_INET6 && !in6->sin6_port)
		in6->sin6_port = htons(53);
}

/* evdns's own messages ("nameserver ... has failed") would go to stderr
 * unformatted; a round's outcome is logged above, so they are detail. */
static void evdns_say(int is_warning, const char *msg)
{
	if (is_warning)
		log_debug("evdns: %s", msg);
}

int pdx_discovery_start(struct pdx_discovery *d, struct event_base *base,
			const char *server, unsigned interval_s, char *err,
			size_t errlen)
{
	int rc;

	d->base = base;
	d->interval_s = interval_s;
	ns_set(d, server);
	evdns_set_log_fn(evdns_say);
	/* its own sockets and timers do not keep the loop alive */
	d->dns = evdns_base_new(base, EVDNS_BASE_DISABLE_WHEN_INACTIVE);
	if (!d->dns) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	if (server) {
		if (!d->ns_len ||
		    evdns_base_nameserver_ip_add(d->dns, server)) {
			snprintf(err, errlen,
				 "--dns-server: '%s' is not IP[:PORT]", server);
			return -1;
		}
	} else {
		/* 6: no nameserver listed, evdns asks 127.0.0.1 */
		rc = evdns_base_resolv_conf_parse(d->dns, DNS_OPTIONS_ALL,
						  RESOLV_CONF);
		if (rc && rc != 6) {
			snprintf(err, errlen,
				 "%s: cannot read it (evdns error %d)",
				 RESOLV_CONF, rc);
			return -1;
		}
	}
	/* a round ends within about SRV_TIMEOUT_S * 2 even when no server
	 * answers (evdns's defaults: 5 s, 3 attempts) */
	evdns_base_set_option(d->dns, "timeout:", "2");
	evdns_base_set_option(d->dns, "attempts:", "2");
	return 0;
}

/* An SRV name's UDP socket, connected to the nameserver (so only its
 * answers arrive). */
static int srv_open(struct pdx_dns_name *nm, char *err, size_t errlen)
{
	struct pdx_discovery *d = nm->d;

	if (strlen(nm->spec) >= PDX_DNS_NAME_MAX) {
		snprintf(err, errlen, "%s: name too long", nm->spec);
		return -1;
	}
	if (!d->ns_len) {
		snprintf(err, errlen,
			 "%s: no nameserver for SRV queries in %s (give "
			 "--dns-server)",
			 nm->spec, RESOLV_CONF);
		return -1;
	}
	nm->sock = socket(d->ns.ss_family,
			  SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (nm->sock < 0 || connect(nm->sock, (struct sockaddr *)&d->ns,
				    (socklen_t)d->ns_len)) {
		snprintf(err, errlen, "%s: a socket to the nameserver: %s",
			 nm->spec, strerror(errno));
		return -1;
	}
	nm->srv_ev = event_new(d->base, nm->sock, EV_READ, on_srv, nm);
	if (!nm->srv_ev) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

static void name_free(struct pdx_dns_name *nm)
{
	if (nm->timer)
		event_free(nm->timer);
	if (nm->srv_ev)
		event_free(nm->srv_ev);
	if (nm->sock >= 0)
		close(nm->sock);
	free(nm);
}

int pdx_discovery_add(struct pdx_discovery *d, struct pdx_pool *pool,
		      const char *spec, char *err, size_t errlen)
{
	struct target *t;
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
	nm->sock = -1;
	nm->last_err = DNS_ERR_NONE;
	for (unsigned k = 0; k < SRV_TARGETS; k++)
		nm->targets[k].nm = nm;
	/* NAME:PORT: its own A and AAAA records; NAME: its SRV records */
	t = &nm->targets[0];
	nm->srv = !strchr(spec, ':');
	if (nm->srv ? srv_open(nm, err, errlen)
		    : pdx_pool_addr_parse(spec, nm->name, sizeof(nm->name),
					  &t->port, err, errlen))
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
	name_free(nm);
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
	while (d->n)
		name_free(d->names[--d->n]);
}
