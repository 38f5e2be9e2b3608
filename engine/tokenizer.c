/* Pieces, their ids and the words of ids; the rules are in tokenizer.h. */
#include "engine/tokenizer.h"

#include "common/fnv.h"

static const char consonants[16] = "bdfghjklmnprstvz";
static const char vowels[4] = "aeio";

static bool is_space(unsigned char c)
{
	return c == ' ' || (c >= '\t' && c <= '\r');
}

static bool is_word(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9') || c == '_' || c >= 0x80;
}

static int index_of(const char *set, int n, char c)
{
	for (int i = 0; i < n; i++)
		if (set[i] == c)
			return i;
	return -1;
}

/* The id a piece spells as a word, or -1 when it is not a word of an id
 * below vocab. */
static long long word_id(const char *s, size_t len, uint32_t vocab)
{
	unsigned long long v = 0, scale = 1;

	if (len == 0 || len % 2 || len >= PDX_TOK_WORD_MAX)
		return -1;
	for (size_t i = 0; i < len; i += 2) {
		int c = index_of(consonants, 16, s[i]);
		int w = index_of(vowels, 4, s[i + 1]);

		if (c < 0 || w < 0)
			return -1;
		v += (unsigned long long)(c * 4 + w + 1) * scale;
		scale *= 64;
	}
	return v - 1 < vocab ? (long long)(v - 1) : -1;
}

static uint32_t piece_id(const char *s, size_t len, uint32_t vocab)
{
	long long id = word_id(s, len, vocab);

	if (id >= 0)
		return (uint32_t)id;
	return (uint32_t)(pdx_fnv1a64(PDX_FNV1A64_INIT, s, len) % vocab);
}

size_t pdx_tok_encode(const char *text, size_t len, uint32_t vocab,
		      uint32_t *out, size_t cap)
{
	size_t n = 0, i = 0;

	while (i < len) {
		unsigned char c = (unsigned char)text[i];
		size_t start = i;

		if (is_space(c)) {
			i++;
			continue;
		}
		i++;
		if (is_word(c))
			while (i < len && is_word((unsigned char)text[i]))
				i++;
		if (n < cap)
			out[n] = piece_id(text + start, i - start, vocab);
		n++;
	}
	return n;
}

size_t pdx_tok_word(uint32_t id, char *out)
{
	uint64_t v = (uint64_t)id + 1;
	size_t len = 0;

	while (v) {
		unsigned d = (unsigned)((v - 1) % 64);

		out[len++] = consonants[d / 4];
		out[len++] = vowels[d % 4];
		v = (v - 1 - d) / 64;
	}
	out[len] = '\0';
	return len;
}
