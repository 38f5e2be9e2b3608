/* SRV queries and answers on the wire (proxy/dns_srv.c), as pdx-proxy's
 * DNS discovery sends and reads them: the query asks the name's SRV
 * records with EDNS(0); an answer's records give each target and port,
 * compressed names included; the server's errors and truncation are
 * told apart from a packet that is not the answer; a malformed or cut
 * answer (every prefix of a good one, a pointer loop) is refused without
 * reading past its end (each one is its own allocation, for ASan). */
#include <stdlib.h>
#include <string.h>

#include "proxy/dns_srv.h"
#include "tests/check.h"

static const uint8_t want_query[] = {
    0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 1,
    5, '_', 'h', 't', 't', 'p', 4, '_', 't', 'c', 'p', 1, 'a', 2, 'b', 'c', 0,
    0, 33, 0, 1,
    0, 0, 41, 0x10, 0x00, 0, 0, 0, 0, 0, 0};

static void query_wire(void)
{
	uint8_t q[512];
	int n = pdx_dns_srv_query(0x1234, "_http._tcp.a.bc", q, sizeof(q));
	char label[80];

	CHECK_EQ(n, (int)sizeof(want_query));
	CHECK(n > 0 && !memcmp(q, want_query, sizeof(want_query)),
	      "the query asks the name's SRV records, recursively, with EDNS(0)");
	CHECK_EQ(pdx_dns_srv_query(0x1234, "_http._tcp.a.bc.", q, sizeof(q)), n,
		 "a trailing dot names the same name");
	memset(label, 'x', 64);
	label[64] = '\0';
	CHECK(pdx_dns_srv_query(1, "", q, sizeof(q)) < 0 &&
		  pdx_dns_srv_query(1, "a..b", q, sizeof(q)) < 0 &&
		  pdx_dns_srv_query(1, label, q, sizeof(q)) < 0 &&
		  pdx_dns_srv_query(1, "a.b", q, 20) < 0,
	      "an empty label, one over 63 bytes or too small a buffer is refused");
}

/* An answer to want_query: two SRV records (the second's target ends in
 * a pointer to the question's "a.bc"), an A record between them, and
 * one with target "." (no service). */
static size_t answer(uint8_t *m, uint16_t flags)
{
	size_t n = 0;

	memcpy(m, want_query, 29 + 4); /* header and question */
	m[2] = flags >> 8;
	m[3] = flags & 0xff;
	m[7] = 4; /* answers */
	m[11] = 0; /* no OPT back */
	n = 33;
	{
		static const uint8_t rr[] = {
		    0xc0, 12, 0, 33, 0, 1, 0, 0, 0, 30, 0, 14,
		    0, 0, 0, 10, 0x20, 0x08, 2, 'd', '1', 3, 's', 'v', 'c', 0,
		    0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 127, 0, 0, 2,
		    0xc0, 12, 0, 33, 0, 1, 0, 0, 0, 7, 0, 11,
		    0, 0, 0, 10, 0x20, 0x09, 2, 'd', '2', 0xc0, 23,
		    0xc0, 12, 0, 33, 0, 1, 0, 0, 0, 30, 0, 7,
		    0, 0, 0, 10, 0x20, 0x0a, 0};

		memcpy(m + n, rr, sizeof(rr));
		n += sizeof(rr);
	}
	return n;
}

static int parse(const uint8_t *m, size_t len, uint16_t id,
		 struct pdx_dns_srv *out, unsigned max, int *err)
{
	uint8_t *copy = malloc(len ? len : 1);
	int n;

	memcpy(copy, m, len);
	n = pdx_dns_srv_parse(copy, len, id, out, max, err);
	free(copy);
	return n;
}

static void answer_records(void)
{
	struct pdx_dns_srv r[4];
	uint8_t m[512];
	size_t len = answer(m, 0x8180);
	int err = 0;

	CHECK_EQ(parse(m, len, 0x1234, r, 4, &err), 2,
		 "an answer's SRV records are read, others skipped");
	CHECK(!strcmp(r[0].target, "d1.svc") && r[0].port == 8200 &&
		  r[0].ttl == 30,
	      "a record's target, port and TTL");
	CHECK(!strcmp(r[1].target, "d2.a.bc") && r[1].port == 8201 &&
		  r[1].ttl == 7,
	      "a compressed target is followed");
	CHECK_EQ(parse(m, len, 0x1234, r, 1, &err), 1,
		 "records past the room given are skipped");
	CHECK_EQ(parse(m, len, 0x4321, r, 4, &err), -1,
		 "an answer to another query is not the answer");
	len = answer(m, 0x0180);
	CHECK_EQ(parse(m, len, 0x1234, r, 4, &err), -1,
		 "a query is not an answer");
}

static void server_errors(void)
{
	struct pdx_dns_srv r[4];
	uint8_t m[512];
	size_t len = answer(m, 0x8183);
	int err = 0;

	CHECK(parse(m, len, 0x1234, r, 4, &err) == -2 && err == 3,
	      "NXDOMAIN is the server's error 3");
	len = answer(m, 0x8380);
	CHECK(parse(m, len, 0x1234, r, 4, &err) == -2 &&
		  err == PDX_DNS_TRUNCATED,
	      "a truncated answer is told");
	len = answer(m, 0x8180);
	m[7] = 0;
	CHECK_EQ(parse(m, len, 0x1234, r, 4, &err), 0,
		 "a name with no SRV records gives none");
}

static void malformed(void)
{
	struct pdx_dns_srv r[4];
	uint8_t m[512];
	size_t len = answer(m, 0x8180);
	int err = 0, bad = 0;

	for (size_t k = 0; k < len; k++)
		bad += parse(m, k, 0x1234, r, 4, &err) != -1;
	CHECK_EQ(bad, 0, "every cut of an answer is refused");
	m[33] = 0xc0;
	m[34] = 33; /* the first answer's name points at itself */
	CHECK_EQ(parse(m, len, 0x1234, r, 4, &err), -1,
		 "a loop of name pointers is refused");
	len = answer(m, 0x8180);
	m[33 + 11] = 13; /* the first record's data one byte short */
	CHECK_EQ(parse(m, len, 0x1234, r, 4, &err), -1,
		 "a target that overruns its record is refused");
}

int main(void)
{
	query_wire();
	answer_records();
	server_errors();
	malformed();
	CHECK_DONE();
}
