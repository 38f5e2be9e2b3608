/* The tokenizer: the documented rules, pinned by known values. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/tokenizer.h"
#include "tests/check.h"

#define V 128256

static size_t enc(const char *s, uint32_t *out, size_t cap)
{
	return pdx_tok_encode(s, strlen(s), V, out, cap);
}

/* Pieces: words, single punctuation, whitespace dropped; ids by FNV-1a. */
static void pieces(void)
{
	uint32_t a[8], b[8];

	/* FNV-1a 64 test vectors: "a" and "foobar" */
	CHECK_EQ(enc("a", a, 8), 1);
	CHECK_EQ(a[0], 0xaf63dc4c8601ec8cULL % V);
	CHECK_EQ(enc("foobar", a, 8), 1);
	CHECK_EQ(a[0], 0x85944171f73967e8ULL % V);

	CHECK_EQ(enc("Hello, world!", a, 8), 4);
	CHECK_EQ(enc("Hello", b, 8), 1);
	CHECK_EQ(a[0], b[0]);
	CHECK_EQ(enc(",", b, 8), 1);
	CHECK_EQ(a[1], b[0]);
	CHECK_EQ(enc("world", b, 8), 1);
	CHECK_EQ(a[2], b[0]);
	CHECK_EQ(enc("hello", b, 8), 1);
	CHECK(a[0] != b[0]); /* case matters */

	CHECK_EQ(enc("x_1 y", a, 8), 2);
	CHECK_EQ(enc("  x_1\n\t y\r\n", b, 8), 2);
	CHECK(!memcmp(a, b, 2 * sizeof(a[0])));
	CHECK_EQ(enc("a--b", a, 8), 4);
	CHECK_EQ(enc("", a, 8), 0);
	CHECK_EQ(enc(" \n\t", a, 8), 0);
}

/* A UTF-8 character is never split: non-ASCII bytes are word bytes. */
static void utf8(void)
{
	uint32_t a[8];

	CHECK_EQ(enc("h\xc3\xa9llo w\xc3\xb6rld", a, 8), 2);
	CHECK_EQ(enc("\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", a, 8), 1);
	CHECK_EQ(enc("\xe6\x97\xa5.\xe6\x9c\xac", a, 8), 3);
}

/* snprintf-like: the count is the whole; only cap ids are written. */
static void counting(void)
{
	uint32_t a[4] = { 7, 7, 7, 7 }, all[8];
	const char *s = "one two three four five six";

	CHECK_EQ(pdx_tok_encode(s, strlen(s), V, NULL, 0), 6);
	CHECK_EQ(enc(s, a, 2), 6);
	CHECK_EQ(a[2], 7);
	enc(s, all, 8);
	CHECK(!memcmp(a, all, 2 * sizeof(a[0])));
	/* a length shorter than the string stops there */
	CHECK_EQ(pdx_tok_encode(s, 3, V, a, 4), 1);
	/* ids below the vocabulary, however small */
	CHECK_EQ(pdx_tok_encode(s, strlen(s), 7, a, 4), 6);
	for (int i = 0; i < 4; i++)
		CHECK(a[i] < 7);
}

static void words(void)
{
	char w[PDX_TOK_WORD_MAX];

	CHECK_EQ(pdx_tok_word(0, w), 2);
	CHECK(!strcmp(w, "ba"));
	pdx_tok_word(1, w);
	CHECK(!strcmp(w, "be"));
	pdx_tok_word(63, w);
	CHECK(!strcmp(w, "zo"));
	pdx_tok_word(64, w);
	CHECK(!strcmp(w, "baba"));
	pdx_tok_word(65, w);
	CHECK(!strcmp(w, "beba"));
	pdx_tok_word(128255, w);
	CHECK(!strcmp(w, "zohili"));
	CHECK_EQ(pdx_tok_word(UINT32_MAX, w), PDX_TOK_WORD_MAX - 1);
}

/* The words of ids encode back to the ids: generated text fed back in
 * meets the same tokens. */
static void round_trip(void)
{
	static const uint32_t big[] = { 4159, 4160, 100000, V - 1 };
	char text[64 * PDX_TOK_WORD_MAX], w[PDX_TOK_WORD_MAX];
	uint32_t ids[64], back[64], t;
	size_t len = 0;

	for (uint32_t id = 0; id < 20000; id++) {
		pdx_tok_word(id, w);
		if (enc(w, &t, 1) != 1 || t != id) {
			CHECK_EQ(t, id);
			break;
		}
	}
	for (size_t i = 0; i < 4; i++) {
		pdx_tok_word(big[i], w);
		CHECK_EQ(enc(w, &t, 1), 1);
		CHECK_EQ(t, big[i]);
	}
	for (uint32_t i = 0; i < 64; i++) {
		ids[i] = (i * 2654435761u) % V;
		len += pdx_tok_word(ids[i], text + len);
		text[len++] = ' ';
	}
	text[len] = '\0';
	CHECK_EQ(enc(text, back, 64), 64);
	CHECK(!memcmp(ids, back, sizeof(ids)));
	/* a word of an id outside the vocabulary is hashed like any piece */
	CHECK_EQ(pdx_tok_encode("baba", 4, 64, &t, 1), 1);
	CHECK_EQ(t, 0x9a42e19baa234a31ULL % 64);
}

static void client_ids(void)
{
	CHECK(pdx_tok_id_valid(0, V));
	CHECK(pdx_tok_id_valid(V - 1, V));
	CHECK(!pdx_tok_id_valid(V, V));
	CHECK(!pdx_tok_id_valid(-1, V));
	CHECK(!pdx_tok_id_valid(1LL << 40, V));
}

int main(void)
{
	pieces();
	utf8();
	counting();
	words();
	round_trip();
	client_ids();
	CHECK_DONE();
}
