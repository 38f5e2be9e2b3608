/* pdx-bench's reading of a streamed answer (bench/load_sse.c,
 * bench/load_openai.c): the bytes of a text/event-stream fed in pieces
 * (the first byte seeds where they are cut, and picks chat or not), each
 * event's data read as an OpenAI stream chunk. Cutting the stream anywhere
 * must give the same events as feeding it whole. */
#include <stdlib.h>
#include <string.h>

#include "bench/load_openai.h"
#include "bench/load_sse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct seen {
	bool chat;
	uint64_t hash; /* of every event's data, in order */
	size_t events;
	char *text;
	size_t text_len;
};

static int on_event(void *arg, const char *d, size_t len)
{
	struct seen *s = arg;
	struct pdx_load_chunk c;

	if (d[len] != '\0')
		abort();
	for (size_t i = 0; i < len; i++)
		s->hash = (s->hash ^ (uint8_t)d[i]) * 0x100000001b3ULL;
	s->hash = (s->hash ^ 0x1ff) * 0x100000001b3ULL;
	s->events++;
	pdx_load_openai_chunk(d, len, s->chat, &c, &s->text, &s->text_len);
	if (s->text && strlen(s->text) > s->text_len)
		abort();
	return 0;
}

static int run(const char *buf, size_t len, uint32_t cut, struct seen *s)
{
	struct pdx_sse p;
	size_t off = 0;
	int rc = 0;

	pdx_sse_init(&p, 4096);
	while (off < len && !rc) {
		size_t n = cut ? 1 + cut % 17 : len - off;

		n = n < len - off ? n : len - off;
		rc = pdx_sse_feed(&p, buf + off, n, on_event, s);
		off += n;
		cut = cut * 1103515245u + 12345u;
	}
	if (!rc)
		rc = pdx_sse_finish(&p, on_event, s);
	pdx_sse_free(&p);
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct seen whole = {0}, cut = {0};
	int a, b;

	if (size < 1)
		return 0;
	whole.chat = cut.chat = data[0] & 1;
	a = run((const char *)data + 1, size - 1, 0, &whole);
	b = run((const char *)data + 1, size - 1, data[0] | 1, &cut);
	/* an over-long event fails either way, maybe after other events */
	if (a != b ||
	    (!a && (whole.hash != cut.hash || whole.events != cut.events)))
		abort();
	free(whole.text);
	free(cut.text);
	return 0;
}
