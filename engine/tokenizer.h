/* The reference engine's tokenizer: deterministic, no vocabulary file.
 *
 * Text to pieces: ASCII whitespace separates pieces and is dropped; a
 * maximal run of word bytes (ASCII letters, digits, '_', and every byte
 * >= 0x80, so a UTF-8 character is never split) is one piece; every other
 * byte (punctuation, control characters) is a piece of its own.
 *
 * Piece to id: a piece spelled exactly like the word of an id < vocab (see
 * below) is that id; any other piece is its FNV-1a 64-bit hash modulo
 * vocab. Case matters.
 *
 * Id to word: id + 1 written in bijective base 64, least significant digit
 * first, each digit one syllable: a consonant of "bdfghjklmnprstvz" then a
 * vowel of "aeio" (0 is "ba", 63 is "zo", 64 is "baba"). Every id has one
 * word and every such word one id, so the text of generated tokens joined
 * by spaces encodes back to the same ids: a chat's next round, which sends
 * the answer back as text, meets the KV blocks of its earlier tokens.
 *
 * Pure functions; any thread may call them.
 */
#ifndef PDX_ENGINE_TOKENIZER_H
#define PDX_ENGINE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest word plus its NUL: six syllables cover every uint32_t id. */
#define PDX_TOK_WORD_MAX 13

/* Tokenizes text[0..len) for a vocabulary of vocab (> 0) ids. Returns the
 * number of tokens; writes the first min(that, cap) of them to out (out
 * may be NULL when cap is 0, to count). */
size_t pdx_tok_encode(const char *text, size_t len, uint32_t vocab,
		      uint32_t *out, size_t cap);

/* Writes the word of id, NUL-terminated, to out (at least
 * PDX_TOK_WORD_MAX bytes). Returns its length. */
size_t pdx_tok_word(uint32_t id, char *out);

/* Whether v, a token id given by a client (e.g. a JSON integer), is one
 * of the vocabulary's. */
static inline bool pdx_tok_id_valid(long long v, uint32_t vocab)
{
	return v >= 0 && (unsigned long long)v < vocab;
}

#endif
