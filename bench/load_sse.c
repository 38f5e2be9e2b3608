#include "bench/load_sse.h"

#include <stdlib.h>
#include <string.h>

#define SSE_DEFAULT_MAX (16u << 20)

void pdx_sse_init(struct pdx_sse *p, size_t max_event)
{
	memset(p, 0, sizeof(*p));
	p->max = max_event ? max_event : SSE_DEFAULT_MAX;
}

void pdx_sse_free(struct pdx_sse *p)
{
	if (!p)
		return;
	free(p->line);
	free(p->data);
	p->line = p->data = NULL;
	p->line_len = p->line_cap = p->data_len = p->data_cap = 0;
}

/* Grows *buf so that it holds need bytes plus a NUL. */
static int reserve(char **buf, size_t *cap, size_t need, size_t max)
{
	size_t ncap;
	char *nb;

	if (need > max)
		return -1;
	if (need + 1 <= *cap)
		return 0;
	ncap = *cap ? *cap : 256;
	while (ncap < need + 1)
		ncap *= 2;
	nb = realloc(*buf, ncap);
	if (!nb)
		return -1;
	*buf = nb;
	*cap = ncap;
	return 0;
}

static int dispatch(struct pdx_sse *p, pdx_sse_event_cb cb, void *arg)
{
	int rc = 0;

	if (p->has_data) {
		if (reserve(&p->data, &p->data_cap, p->data_len, p->max))
			return -1;
		p->data[p->data_len] = '\0';
		rc = cb(arg, p->data, p->data_len);
	}
	p->data_len = 0;
	p->has_data = false;
	return rc;
}

/* One complete line (without its terminator). */
static int line_done(struct pdx_sse *p, pdx_sse_event_cb cb, void *arg)
{
	const char *l = p->line, *colon, *val;
	size_t n = p->line_len, flen, vlen;

	p->line_len = 0;
	if (n == 0)
		return dispatch(p, cb, arg);
	if (l[0] == ':')
		return 0;
	colon = memchr(l, ':', n);
	flen = colon ? (size_t)(colon - l) : n;
	if (flen != 4 || memcmp(l, "data", 4) != 0)
		return 0;
	val = colon ? colon + 1 : l + n;
	vlen = (size_t)(l + n - val);
	if (vlen && val[0] == ' ') {
		val++;
		vlen--;
	}
	if (reserve(&p->data, &p->data_cap, p->data_len + vlen + 1, p->max))
		return -1;
	if (p->has_data)
		p->data[p->data_len++] = '\n';
	memcpy(p->data + p->data_len, val, vlen);
	p->data_len += vlen;
	p->has_data = true;
	return 0;
}

int pdx_sse_feed(struct pdx_sse *p, const char *buf, size_t len,
		 pdx_sse_event_cb cb, void *arg)
{
	size_t i = 0, run;
	const char *end;
	int rc;

	while (i < len) {
		if (p->after_cr) {
			p->after_cr = false;
			if (buf[i] == '\n') {
				i++;
				continue;
			}
		}
		/* Copy up to the next line terminator in one go. */
		for (end = buf + i; end < buf + len; end++)
			if (*end == '\n' || *end == '\r')
				break;
		run = (size_t)(end - (buf + i));
		if (run) {
			if (reserve(&p->line, &p->line_cap, p->line_len + run,
				    p->max))
				return -1;
			memcpy(p->line + p->line_len, buf + i, run);
			p->line_len += run;
			i += run;
		}
		if (i == len)
			break;
		p->after_cr = buf[i] == '\r';
		i++;
		rc = line_done(p, cb, arg);
		if (rc)
			return rc;
	}
	return 0;
}

int pdx_sse_finish(struct pdx_sse *p, pdx_sse_event_cb cb, void *arg)
{
	int rc = 0;

	if (p->line_len)
		rc = line_done(p, cb, arg);
	if (!rc)
		rc = dispatch(p, cb, arg);
	p->after_cr = false;
	return rc;
}
