/* Refusing a body over the limit before "100 Continue" (see
 * http_expect.h). */
#include "common/http_expect.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* a longer head is one evhttp refuses itself (HTTP_MAX_HEADERS) */
#define HEAD_MAX (64u << 10)

static uint64_t watch_limit;
/* The connection whose request was rewritten, until its route asks.
 * Cleared at the next input of any connection, which comes first for
 * every request evhttp parses later: a connection freed before its
 * route ran cannot pass its mark to another allocated at its address. */
static struct {
	struct evhttp_connection *evcon;
	uint64_t declared;
} marked;
static bool rewriting;

/* s (n bytes) is word, ASCII case aside, between optional blanks. */
static bool value_is(const char *s, size_t n, const char *word)
{
	size_t w = strlen(word);

	while (n && (*s == ' ' || *s == '\t')) {
		s++;
		n--;
	}
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
		n--;
	return n == w && !strncasecmp(s, word, w);
}

/* The request line's version is HTTP/1.1 or later (evhttp answers 100
 * only then). */
static bool line_http11(const char *s, size_t n)
{
	const char *v = n >= 8 ? s + n - 8 : NULL;

	return v && !memcmp(v, "HTTP/", 5) && v[5] >= '1' && v[5] <= '9' &&
	       v[6] == '.' && (v[5] > '1' || v[7] >= '1') && v[7] <= '9';
}

/* One Content-Length's digits from s (n bytes): the offset and length
 * of the value within the line; false when it is not a number. */
static bool length_parse(const char *s, size_t n, size_t *off, size_t *len,
			 uint64_t *v)
{
	size_t i = 0, d;

	while (i < n && (s[i] == ' ' || s[i] == '\t'))
		i++;
	for (d = i; d < n && s[d] >= '0' && s[d] <= '9'; d++)
		;
	if (d == i)
		return false;
	*off = i;
	*len = d - i;
	for (; d < n; d++)
		if (s[d] != ' ' && s[d] != '\t')
			return false;
	/* 19 digits fit in 64 bits */
	*v = *len > 19 ? UINT64_MAX : 0;
	for (d = i; *len <= 19 && d < i + *len; d++)
		*v = *v * 10 + (uint64_t)(s[d] - '0');
	return true;
}

bool pdx_http_expect_over(const char *head, size_t len, uint64_t limit,
			  struct pdx_http_expect *out)
{
	struct pdx_http_expect e = {0};
	bool expect = false, first = true, ended = false;
	unsigned lengths = 0;
	size_t at = 0;

	while (at < len) {
		const char *line = head + at, *eol, *colon;
		size_t n, name;

		eol = memchr(line, '\n', len - at);
		if (!eol || eol == line || eol[-1] != '\r')
			return false;
		n = (size_t)(eol - line) - 1;
		at += n + 2;
		if (!n) { /* the empty line: the head's end */
			ended = true;
			break;
		}
		if (first) {
			first = false;
			if (!line_http11(line, n))
				return false;
			continue;
		}
		if (*line == ' ' || *line == '\t') /* folded: not ours */
			return false;
		colon = memchr(line, ':', n);
		if (!colon)
			return false;
		name = (size_t)(colon - line);
		n -= name + 1;
		if (name == 14 && !strncasecmp(line, "Content-Length", 14)) {
			if (lengths++ ||
			    !length_parse(colon + 1, n, &e.value_off,
					  &e.value_len, &e.declared))
				return false;
			e.value_off += (size_t)(colon + 1 - head);
		} else if (name == 6 && !strncasecmp(line, "Expect", 6)) {
			expect = value_is(colon + 1, n, "100-continue");
		} else if (name == 17 &&
			   !strncasecmp(line, "Transfer-Encoding", 17)) {
			return false;
		}
	}
	if (!ended || !expect || lengths != 1 || e.declared <= limit)
		return false;
	*out = e;
	return true;
}

/* The head in buf (n bytes) with its Content-Length's value made 0;
 * false (left as it was: evhttp's own way) when out of memory. */
static bool head_rewrite(struct evbuffer *buf, size_t n,
			 const struct pdx_http_expect *e)
{
	char *copy = malloc(n);

	if (!copy || evbuffer_copyout(buf, copy, n) != (ev_ssize_t)n) {
		free(copy);
		return false;
	}
	copy[e->value_off] = '0';
	memmove(copy + e->value_off + 1, copy + e->value_off + e->value_len,
		n - e->value_off - e->value_len);
	evbuffer_drain(buf, n);
	evbuffer_prepend(buf, copy, n - e->value_len + 1);
	free(copy);
	return true;
}

/* Bytes came in on a connection, before evhttp reads them. */
static void on_input(struct evbuffer *buf, const struct evbuffer_cb_info *info,
		     void *arg)
{
	size_t n = evbuffer_get_length(buf);
	struct pdx_http_expect e;
	struct evbuffer_ptr end;
	const char *head;
	char tail[4];
	void *evcon;

	if (rewriting || !info->n_added)
		return;
	marked.evcon = NULL;
	if (n < 16 || n > HEAD_MAX)
		return;
	/* the buffer holds one head and nothing after it: the client
	 * waits (the last four bytes first, as bodies stream in) */
	evbuffer_ptr_set(buf, &end, n - 4, EVBUFFER_PTR_SET);
	if (evbuffer_copyout_from(buf, &end, tail, 4) != 4 ||
	    memcmp(tail, "\r\n\r\n", 4))
		return;
	end = evbuffer_search(buf, "\r\n\r\n", 4, NULL);
	if (end.pos < 0 || (size_t)end.pos + 4 != n)
		return;
	head = (const char *)evbuffer_pullup(buf, -1);
	if (!head || !pdx_http_expect_over(head, n, watch_limit, &e))
		return;
	/* evhttp's callback argument is its connection */
	bufferevent_getcb(arg, NULL, NULL, NULL, &evcon);
	rewriting = true;
	if (head_rewrite(buf, n, &e)) {
		marked.evcon = evcon;
		marked.declared = e.declared;
	}
	rewriting = false;
}

/* evhttp's own bufferevent for a connection, the input watched. */
static struct bufferevent *on_connection(struct event_base *base, void *arg)
{
	struct bufferevent *bev =
	    bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);

	if (bev)
		evbuffer_add_cb(bufferevent_get_input(bev), on_input, bev);
	return bev;
}

void pdx_http_expect_watch(struct evhttp *http, uint64_t limit)
{
	watch_limit = limit;
	evhttp_set_bevcb(http, on_connection, NULL);
}

bool pdx_http_expect_refused(struct evhttp_request *req, uint64_t *declared)
{
	if (!marked.evcon || marked.evcon != evhttp_request_get_connection(req))
		return false;
	*declared = marked.declared;
	marked.evcon = NULL;
	return true;
}
