/* Instances found through DNS (--prefill-dns, --decode-dns NAME:PORT):
 * each name's A and AAAA records (a Kubernetes headless Service's, one
 * per ready pod) are the addresses of its instances, all on PORT.
 *
 * A name is resolved on the proxy's loop with libevent's own resolver
 * (evdns: no blocking resolver call), at start and again after its
 * records' smallest TTL, at least 1 s and at most --dns-interval later.
 * An address that appears is added to the role's pool, one that vanishes
 * is removed from it: the admin API's pdx_pool_add() and
 * pdx_pool_remove(), so a removed instance takes no new requests and
 * those on it finish. A name touches only the instances it added:
 * those given by flags or added by the admin API stay (an address both
 * in the records and already in the pool is left to its owner).
 *
 * A round that finds no address (a timeout, a server failure, NXDOMAIN,
 * no records), or in which any query went unanswered (a timeout, a
 * server failure, an answer truncated), keeps the last set found,
 * counts a failure, and is logged once per change of the outcome; the
 * next round comes --dns-interval later. evdns (libevent 2.1) asks
 * without EDNS and never over TCP, so a NAME:PORT whose A answer
 * exceeds 512 bytes (about 28 IPv4 addresses) is truncated: a failed
 * round; an SRV name's query offers 4096 bytes and asks each target
 * apart.
 *
 * Nameservers: --dns-server IP[:PORT], else /etc/resolv.conf (its
 * search domains and ndots too, so a Service's short name works inside
 * a cluster). A NAME:PORT is asked under its expansions in glibc's
 * order (pdx-decode.NS.svc.cluster.local, ..., pdx-decode), one at a
 * time, both families at once; the first under which either family has
 * an address is the round's: the names after it are not asked, so what
 * the cluster's DNS says of the bare name (forwarded out of the
 * cluster, perhaps refused) does not fail a round.
 *
 * One thread (the proxy's loop). A zero-initialised struct is off;
 * pdx_discovery_stop() is NULL-safe on one never started.
 */
#ifndef PDX_PROXY_DISCOVERY_H
#define PDX_PROXY_DISCOVERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "proxy/dns_srv.h"
#include "proxy/pool.h"

struct event_base;
struct evdns_base;
struct pdx_dns_name;

#define PDX_DISCOVERY_NAMES 16 /* --prefill-dns and --decode-dns in all */
#define PDX_DISCOVERY_SEARCH 6 /* resolv.conf's search domains used */

struct pdx_discovery {
	struct event_base *base;
	struct evdns_base *dns;
	unsigned interval_s;	    /* the most between two rounds of a name */
	struct sockaddr_storage ns; /* where SRV queries go */
	int ns_len;		    /* 0: nowhere known */
	/* resolv.conf's search list and ndots (none with --dns-server) */
	char search[PDX_DISCOVERY_SEARCH][PDX_DNS_NAME_MAX];
	unsigned n_search;
	unsigned ndots;
	unsigned n;
	struct pdx_dns_name *names[PDX_DISCOVERY_NAMES];
};

/* What /metrics shows of one name. */
struct pdx_dns_name_stats {
	const char *name; /* as given, "NAME:PORT" */
	enum pdx_pool_role role;
	unsigned instances; /* in the pool now through this name */
	uint64_t failures;  /* rounds that found no address */
};

/* Starts the resolver (server: "IP[:PORT]", NULL: /etc/resolv.conf);
 * -1 with the reason in err. */
int pdx_discovery_start(struct pdx_discovery *d, struct event_base *base,
			const char *server, unsigned interval_s, char *err,
			size_t errlen);

/* Adds a name ("NAME:PORT") feeding pool, resolved at once (its first
 * round runs on the loop); -1 with the reason in err. */
int pdx_discovery_add(struct pdx_discovery *d, struct pdx_pool *pool,
		      const char *name, char *err, size_t errlen);

void pdx_discovery_stats(const struct pdx_discovery *d, unsigned k,
			 struct pdx_dns_name_stats *out);

/* Stops every round (a query in flight is dropped, its callback never
 * runs); the instances found stay in their pools. */
void pdx_discovery_stop(struct pdx_discovery *d);

#endif
