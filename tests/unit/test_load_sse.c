/* The SSE parser: events split anywhere, several per chunk, [DONE],
 * comments, malformed lines, limits. */
#include "bench/load_sse.h"
#include "tests/check.h"

#include <stdlib.h>

struct got {
	char ev[16][128];
	int n;
	int stop_after; /* 0: never */
};

static int on_event(void *arg, const char *data, size_t len)
{
	struct got *g = arg;

	CHECK_EQ(strlen(data), len);
	if (g->n < 16)
		snprintf(g->ev[g->n], sizeof(g->ev[0]), "%s", data);
	g->n++;
	return g->stop_after && g->n == g->stop_after ? 7 : 0;
}

static const char stream[] = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
			     ": keep-alive comment\n\n"
			     "data: {\"choices\":[{\"text\":\"b\"}]}\r\n\r\n"
			     "event: message\nid: 4\ndata:{\"x\":1}\n\n"
			     "data: line1\ndata: line2\n\n"
			     "garbage line\n\n"
			     "data: [DONE]\n\n";

static const char *const want[] = {
    "{\"choices\":[{\"text\":\"a\"}]}",
    "{\"choices\":[{\"text\":\"b\"}]}",
    "{\"x\":1}",
    "line1\nline2",
    "[DONE]",
};

static void check_events(const struct got *g)
{
	int i;

	CHECK_EQ(g->n, 5);
	for (i = 0; i < 5 && i < g->n; i++)
		if (strcmp(g->ev[i], want[i])) {
			fprintf(stderr, "event %d: '%s' != '%s'\n", i, g->ev[i],
				want[i]);
			check_failures++;
		}
}

/* Feeds the stream in three pieces cut at every pair of positions, each
 * piece from its own heap buffer so ASan catches a read past it. */
static void test_splits(void)
{
	size_t len = strlen(stream), i, j;
	struct pdx_sse p;
	struct got g;
	char *a, *b, *c;
	int bad = 0;

	for (i = 0; i <= len; i++) {
		for (j = i; j <= len; j++) {
			memset(&g, 0, sizeof(g));
			pdx_sse_init(&p, 0);
			a = malloc(i + 1);
			b = malloc(j - i + 1);
			c = malloc(len - j + 1);
			memcpy(a, stream, i);
			memcpy(b, stream + i, j - i);
			memcpy(c, stream + j, len - j);
			CHECK_EQ(pdx_sse_feed(&p, a, i, on_event, &g), 0);
			CHECK_EQ(pdx_sse_feed(&p, b, j - i, on_event, &g), 0);
			CHECK_EQ(pdx_sse_feed(&p, c, len - j, on_event, &g), 0);
			CHECK_EQ(pdx_sse_finish(&p, on_event, &g), 0);
			free(a);
			free(b);
			free(c);
			pdx_sse_free(&p);
			if (g.n != 5 || strcmp(g.ev[4], "[DONE]"))
				bad++;
		}
	}
	CHECK_EQ(bad, 0);
	/* And byte by byte. */
	memset(&g, 0, sizeof(g));
	pdx_sse_init(&p, 0);
	for (i = 0; i < len; i++)
		pdx_sse_feed(&p, stream + i, 1, on_event, &g);
	check_events(&g);
	pdx_sse_free(&p);
}

static void test_whole_and_edges(void)
{
	struct pdx_sse p;
	struct got g = {0};
	static const char cr[] = "data: x\r\rdata: y\r\r";
	static const char tail[] = "data: {\"a\":1}\n\ndata: [DONE]";
	char big[300];

	/* Several events in one chunk. */
	pdx_sse_init(&p, 0);
	CHECK_EQ(pdx_sse_feed(&p, stream, strlen(stream), on_event, &g), 0);
	check_events(&g);
	pdx_sse_free(&p);

	/* Bare "\r" line ends. */
	memset(&g, 0, sizeof(g));
	pdx_sse_init(&p, 0);
	CHECK_EQ(pdx_sse_feed(&p, cr, strlen(cr), on_event, &g), 0);
	CHECK_EQ(g.n, 2);
	CHECK(!strcmp(g.ev[1], "y"));
	pdx_sse_free(&p);

	/* A stream that ends without the final blank line: finish() still
	 * delivers the last event (vllm accepts it too). */
	memset(&g, 0, sizeof(g));
	pdx_sse_init(&p, 0);
	CHECK_EQ(pdx_sse_feed(&p, tail, strlen(tail), on_event, &g), 0);
	CHECK_EQ(g.n, 1);
	CHECK_EQ(pdx_sse_finish(&p, on_event, &g), 0);
	CHECK_EQ(g.n, 2);
	CHECK(!strcmp(g.ev[1], "[DONE]"));
	pdx_sse_free(&p);

	/* "data" without a colon is an empty data line; blank lines alone
	 * deliver nothing. */
	memset(&g, 0, sizeof(g));
	pdx_sse_init(&p, 0);
	CHECK_EQ(pdx_sse_feed(&p, "\n\n\ndata\n\n", 9, on_event, &g), 0);
	CHECK_EQ(g.n, 1);
	CHECK(!strcmp(g.ev[0], ""));
	pdx_sse_free(&p);

	/* The callback can stop the parser. */
	memset(&g, 0, sizeof(g));
	g.stop_after = 2;
	pdx_sse_init(&p, 0);
	CHECK_EQ(pdx_sse_feed(&p, stream, strlen(stream), on_event, &g), 7);
	CHECK_EQ(g.n, 2);
	pdx_sse_free(&p);

	/* An event over the limit fails rather than growing forever. */
	memset(&g, 0, sizeof(g));
	memset(big, 'x', sizeof(big));
	memcpy(big, "data: ", 6);
	pdx_sse_init(&p, 100);
	CHECK_EQ(pdx_sse_feed(&p, big, sizeof(big), on_event, &g), -1);
	pdx_sse_free(&p);
	pdx_sse_free(NULL);
}

int main(void)
{
	test_splits();
	test_whole_and_edges();
	CHECK_DONE();
}
