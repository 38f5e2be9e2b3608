/* Which request heads are refused before "100 Continue"
 * (common/http_expect.c): only one that waits for it with one
 * Content-Length over the limit; every other head is left to evhttp. */
#include <string.h>

#include "common/http_expect.h"
#include "tests/check.h"

#define LIMIT 1000

static const struct row {
	const char *head;
	bool over;
	unsigned long long declared;
} rows[] = {
    {"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
     "Expect: 100-continue\r\nContent-Length: 1001\r\n\r\n",
     true, 1001},
    /* the header names and the expectation in any case, blanks around */
    {"POST / HTTP/1.1\r\ncontent-length:\t5000 \r\n"
     "EXPECT:  100-Continue \r\n\r\n",
     true, 5000},
    {"PUT / HTTP/1.2\r\nExpect: 100-continue\r\n"
     "Content-Length: 99999999999999999999999\r\n\r\n",
     true, 18446744073709551615ull},
    /* within the limit: evhttp's 100 Continue */
    {"POST / HTTP/1.1\r\nExpect: 100-continue\r\n"
     "Content-Length: 1000\r\n\r\n",
     false, 0},
    /* no expectation: the client sends its body, evhttp reads it */
    {"POST / HTTP/1.1\r\nContent-Length: 5000\r\n\r\n", false, 0},
    {"POST / HTTP/1.1\r\nExpect: 200-ok\r\nContent-Length: 5000\r\n\r\n", false,
     0},
    /* HTTP/1.0: evhttp sends no 100, the client does not wait */
    {"POST / HTTP/1.0\r\nExpect: 100-continue\r\n"
     "Content-Length: 5000\r\n\r\n",
     false, 0},
    /* framed otherwise, or ambiguously: evhttp's and the route's */
    {"POST / HTTP/1.1\r\nExpect: 100-continue\r\n"
     "Transfer-Encoding: chunked\r\nContent-Length: 5000\r\n\r\n",
     false, 0},
    {"POST / HTTP/1.1\r\nExpect: 100-continue\r\n"
     "Content-Length: 5000\r\nContent-Length: 5000\r\n\r\n",
     false, 0},
    {"POST / HTTP/1.1\r\nExpect: 100-continue\r\n"
     "Content-Length: 5000x\r\n\r\n",
     false, 0},
    {"POST / HTTP/1.1\r\nExpect: 100-continue\r\n"
     "Content-Length: \r\n\r\n",
     false, 0},
    /* a folded line, a bare LF, a line with no colon */
    {"POST / HTTP/1.1\r\nExpect: 100-continue\r\n"
     "Content-Length: 5000\r\n x\r\n\r\n",
     false, 0},
    {"POST / HTTP/1.1\nExpect: 100-continue\n"
     "Content-Length: 5000\n\n",
     false, 0},
    {"POST / HTTP/1.1\r\nExpect: 100-continue\r\nnocolon\r\n"
     "Content-Length: 5000\r\n\r\n",
     false, 0},
    {"POST / HTTP/1.1\r\nExpect: 100-continue\r\n"
     "Content-Length: 5000\r\n",
     false, 0},
};

int main(void)
{
	for (size_t i = 0; i < sizeof(rows) / sizeof(*rows); i++) {
		const struct row *r = &rows[i];
		struct pdx_http_expect e = {0};
		size_t n = strlen(r->head);
		bool over = pdx_http_expect_over(r->head, n, LIMIT, &e);

		CHECK_EQ(over, r->over, "head %zu: refused before 100 or not",
			 i);
		if (!over || !r->over)
			continue;
		CHECK(e.declared == r->declared,
		      "head %zu: the length declared", i);
		/* the value is where the rewrite puts its 0 */
		CHECK(e.value_off + e.value_len < n &&
			  r->head[e.value_off] >= '1' &&
			  r->head[e.value_off] <= '9' &&
			  (r->head[e.value_off + e.value_len] == '\r' ||
			   r->head[e.value_off + e.value_len] == ' '),
		      "head %zu: the value's place", i);
	}
	CHECK_DONE();
}
