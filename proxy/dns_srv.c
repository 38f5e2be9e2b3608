/* DNS SRV queries and answers on the wire (see dns_srv.h). */
#include "proxy/dns_srv.h"

#include <stdbool.h>
#include <string.h>

#define HEADER 12
#define TYPE_SRV 33
#define TYPE_OPT 41
#define CLASS_IN 1
#define FLAG_QR 0x8000
#define FLAG_TC 0x0200
#define FLAG_RD 0x0100
#define LABEL_MAX 63
#define WIRE_NAME_MAX 255
#define POINTER_HOPS 16 /* more is a loop */

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = v >> 8;
	p[1] = v & 0xff;
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)get16(p) << 16 | get16(p + 2);
}

int pdx_dns_srv_query(uint16_t id, const char *name, uint8_t *buf, size_t len)
{
	size_t nlen = strlen(name), off = HEADER, wire;
	const char *s = name;

	if (nlen && name[nlen - 1] == '.')
		nlen--;
	wire = nlen + 2; /* a length byte before each label, the root's 0 */
	if (!nlen || wire > WIRE_NAME_MAX || len < HEADER + wire + 4 + 11)
		return -1;
	memset(buf, 0, HEADER);
	put16(buf, id);
	put16(buf + 2, FLAG_RD);
	put16(buf + 4, 1);  /* a question */
	put16(buf + 10, 1); /* and EDNS(0)'s OPT record */
	while (s < name + nlen) {
		size_t l = strcspn(s, ".");

		if (s + l > name + nlen)
			l = name + nlen - s;
		if (!l || l > LABEL_MAX)
			return -1;
		buf[off++] = (uint8_t)l;
		memcpy(buf + off, s, l);
		off += l;
		s += l + 1;
	}
	buf[off++] = 0;
	put16(buf + off, TYPE_SRV);
	put16(buf + off + 2, CLASS_IN);
	off += 4;
	/* OPT: the root name, its type, the UDP size offered as its class,
	 * a zero TTL (extended rcode, version, flags) and no data */
	buf[off++] = 0;
	put16(buf + off, TYPE_OPT);
	put16(buf + off + 2, PDX_DNS_UDP_MAX);
	memset(buf + off + 4, 0, 6);
	return (int)(off + 10);
}

/* The name at off, dotted into out (NULL: only skipped); *next: the
 * offset after it where it lies (not where its pointers led). */
static int name_read(const uint8_t *msg, size_t len, size_t off, char *out,
		     size_t *next)
{
	bool jumped = false;
	unsigned hops = 0;
	size_t w = 0;

	for (;;) {
		uint8_t l;

		if (off >= len)
			return -1;
		l = msg[off];
		if ((l & 0xc0) == 0xc0) {
			if (off + 1 >= len || ++hops > POINTER_HOPS)
				return -1;
			if (!jumped)
				*next = off + 2;
			jumped = true;
			off = (size_t)(l & 0x3f) << 8 | msg[off + 1];
			continue;
		}
		if (l & 0xc0)
			return -1;
		if (!l)
			break;
		if (off + 1 + l > len || w + l + 1 >= PDX_DNS_NAME_MAX)
			return -1;
		if (out) {
			if (w)
				out[w] = '.';
			memcpy(out + w + !!w, msg + off + 1, l);
		}
		w += l + !!w;
		off += 1 + l;
	}
	if (!jumped)
		*next = off + 1;
	if (out)
		out[w] = '\0';
	return 0;
}

int pdx_dns_srv_parse(const uint8_t *msg, size_t len, uint16_t id,
		      struct pdx_dns_srv *out, unsigned max, int *err)
{
	unsigned qd, an, n = 0;
	size_t off = HEADER;
	uint16_t flags;

	if (len < HEADER || get16(msg) != id)
		return -1;
	flags = get16(msg + 2);
	if (!(flags & FLAG_QR))
		return -1;
	if (flags & 0xf) {
		*err = flags & 0xf;
		return -2;
	}
	if (flags & FLAG_TC) {
		*err = PDX_DNS_TRUNCATED;
		return -2;
	}
	qd = get16(msg + 4);
	an = get16(msg + 6);
	while (qd--) {
		if (name_read(msg, len, off, NULL, &off) || off + 4 > len)
			return -1;
		off += 4;
	}
	while (an--) {
		uint16_t type, class, rdlen;
		uint32_t ttl;
		size_t rd, end;

		if (name_read(msg, len, off, NULL, &off) || off + 10 > len)
			return -1;
		type = get16(msg + off);
		class = get16(msg + off + 2);
		ttl = get32(msg + off + 4);
		rdlen = get16(msg + off + 8);
		rd = off + 10;
		if (rd + rdlen > len)
			return -1;
		off = rd + rdlen;
		if (type != TYPE_SRV || class != CLASS_IN || n == max)
			continue;
		/* priority, weight, port, target: every target is used, as
		 * Kubernetes gives all one priority and weight */
		if (rdlen < 7 ||
		    name_read(msg, len, rd + 6, out[n].target, &end) ||
		    end != rd + rdlen)
			return -1;
		/* target ".": no such service */
		if (!out[n].target[0] || !get16(msg + rd + 4))
			continue;
		out[n].port = get16(msg + rd + 4);
		out[n].ttl = ttl;
		n++;
	}
	return (int)n;
}
