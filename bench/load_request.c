/* One synthetic request of a dataset: its ids (random, or copied from a
 * prefix and a body) and its text, each id a word of syllables
 * (bench/load_dataset.h). The builders of load_dataset.c and
 * load_lmcache.c both make their requests here, so neither calls the
 * other back. */
#include "bench/load_dataset.h"
#include "bench/load_dataset_int.h"
#include "bench/load_rng.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const char consonants[] = "bdfgklmnprstvz"; /* 14 */
static const char vowels[] = "aeiou";		   /* 5 */
#define N_SYLLABLES 70


size_t pdx_load_word(uint32_t id, char *buf)
{
	char rev[PDX_LOAD_WORD_MAX];
	size_t n = 0, i;
	unsigned s;

	do {
		s = id % N_SYLLABLES;
		rev[n++] = vowels[s % 5];
		rev[n++] = consonants[s / 5];
		id /= N_SYLLABLES;
	} while (id);
	for (i = 0; i < n; i++)
		buf[i] = rev[n - 1 - i];
	buf[n] = '\0';
	return n;
}

char *pdx_load_ids_to_text(const uint32_t *ids, size_t n)
{
	char *s = malloc(n * (PDX_LOAD_WORD_MAX + 1) + 1), *p;
	size_t i;

	if (!s)
		return NULL;
	p = s;
	for (i = 0; i < n; i++) {
		if (i)
			*p++ = ' ';
		p += pdx_load_word(ids[i], p);
	}
	*p = '\0';
	return s;
}

int pdx_load_count_words(const char *text)
{
	int n = 0;
	bool in = false;

	for (; *text; text++) {
		if (isspace((unsigned char)*text)) {
			in = false;
		} else if (!in) {
			in = true;
			n++;
		}
	}
	return n;
}

int pdx__load_req_make(struct pdx_load_request *r, const uint32_t *prefix,
		       size_t np, const uint32_t *body, size_t nb,
		       int output_len, bool text)
{
	r->ids = malloc((np + nb + 1) * sizeof(*r->ids));
	if (!r->ids)
		return -1;
	if (np)
		memcpy(r->ids, prefix, np * sizeof(*prefix));
	if (nb)
		memcpy(r->ids + np, body, nb * sizeof(*body));
	r->prompt_len = (int)(np + nb);
	r->output_len = output_len;
	r->text = NULL;
	if (text) {
		r->text = pdx_load_ids_to_text(r->ids, np + nb);
		if (!r->text)
			return -1;
	}
	return 0;
}

void pdx__load_random_ids(struct pdx_load_rng *rng, uint32_t *ids, size_t n,
			  uint32_t vocab)
{
	size_t i;

	for (i = 0; i < n; i++)
		ids[i] = (uint32_t)pdx_load_rng_range(rng, 0, vocab - 1);
}
