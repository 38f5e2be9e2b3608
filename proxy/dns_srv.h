/* DNS SRV records on the wire (RFC 1035, RFC 2782): a query for a name's
 * SRV records, and the records of an answer. libevent's resolver (evdns)
 * asks only A, AAAA and PTR; discovery.c sends this query over UDP on
 * the proxy's loop itself.
 *
 * Pure: no I/O, no allocation, no logging; a malformed answer is refused
 * without reading past its end.
 */
#ifndef PDX_PROXY_DNS_SRV_H
#define PDX_PROXY_DNS_SRV_H

#include <stddef.h>
#include <stdint.h>

#define PDX_DNS_NAME_MAX 256 /* a name in text, dotted, with its NUL */
/* the answer size offered through EDNS(0): a Service of a few hundred
 * pods fits; a larger answer is truncated (DNS over TCP is not spoken) */
#define PDX_DNS_UDP_MAX 4096
#define PDX_DNS_TRUNCATED 65 /* evdns's DNS_ERR_TRUNCATED */

struct pdx_dns_srv {
	uint16_t port;
	uint32_t ttl;
	char target[PDX_DNS_NAME_MAX];
};

/* Writes a recursive query for name's SRV records (class IN) with this id
 * into buf; its length, or -1 if name is not a valid name or buf too
 * small (512 bytes always suffice). */
int pdx_dns_srv_query(uint16_t id, const char *name, uint8_t *buf, size_t len);

/* Reads an answer to the query with this id: the SRV records of its
 * answer section, at most max of them into out (others are skipped), and
 * their count. -1: not an answer to that query (another id, malformed):
 * wait for another. -2: the server's error, *err its DNS rcode (3: no
 * such name) or PDX_DNS_TRUNCATED. A name without SRV records gives 0. */
int pdx_dns_srv_parse(const uint8_t *msg, size_t len, uint16_t id,
		      struct pdx_dns_srv *out, unsigned max, int *err);

#endif
