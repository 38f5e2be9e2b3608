/* The prompts pdx-bench sends: vllm bench serve's "random" and
 * "prefix_repetition" datasets, a file of prompts, and the shapes of
 * LMCache's multi-round QA and long-document QA benchmarks
 * (bench/load_lmcache.c). Deterministic for a given seed.
 *
 * Synthetic prompts are token ids in [0, vocab_size); in text form each
 * id becomes one word of pdx_load_word() and words are joined by single
 * spaces, so an engine that splits on whitespace (one word = one token)
 * sees exactly prompt_len tokens, and two prompts that share a prefix of
 * ids share the same prefix of text. */
#ifndef PDX_BENCH_LOAD_DATASET_H
#define PDX_BENCH_LOAD_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum pdx_load_dataset_kind {
	PDX_LOAD_DS_RANDOM,
	PDX_LOAD_DS_PREFIX_REPETITION,
	PDX_LOAD_DS_FILE,
	PDX_LOAD_DS_MULTI_ROUND,
	PDX_LOAD_DS_LONG_DOC_QA,
};

/* The order of a long-document QA set's repeats (LMCache's names). */
enum pdx_load_repeat_mode {
	PDX_LOAD_REPEAT_RANDOM,	    /* every repeat, shuffled */
	PDX_LOAD_REPEAT_TILE,	    /* d0 d1 d2 d0 d1 d2 */
	PDX_LOAD_REPEAT_INTERLEAVE, /* d0 d0 d1 d1 d2 d2 */
};

struct pdx_load_request {
	uint32_t *ids;	/* token ids, or NULL (a text prompt from a file) */
	char *text;	/* the prompt as text, or NULL (ids only) */
	int prompt_len; /* tokens: ids, or whitespace-separated words */
	int output_len; /* max_tokens to ask for */
	/* Multi-round: the previous request (index - 1) is the same user's
	 * previous round, and this one is sent only after it has ended. */
	bool follows;
};

struct pdx_load_dataset_params {
	enum pdx_load_dataset_kind kind;
	size_t num_prompts;
	uint64_t seed;
	bool text;	     /* render synthetic prompts as text too */
	uint32_t vocab_size; /* synthetic token ids; 0: 32000 */
	/* random (vllm's defaults: 1024, 128, 0.0, 0) */
	int random_input_len, random_output_len, random_prefix_len;
	double random_range_ratio;
	/* prefix_repetition (vllm's defaults: 256, 256, 10, 128) */
	int pr_prefix_len, pr_suffix_len, pr_num_prefixes, pr_output_len;
	/* file: JSON lines {"prompt": "..." or [ids], "output_len": N}, or
	 * plain lines, one prompt each; output_len defaults to
	 * file_output_len. Cycled when it holds fewer than num_prompts. */
	const char *path;
	int file_output_len;
	/* multi-round (defaults 10, 5, 1000, 2000, 50, 100): num_users chat
	 * sessions of num_rounds requests. Round r of user u (from 0) is a
	 * shared system prefix, the user's own prefix, then r questions and
	 * answers of the rounds before, then its question: prompts grow by
	 * question_len + output_len a round and each is a prefix of the
	 * next. Laid out user by user; rounds after the first follow. */
	int mr_num_users, mr_num_rounds, mr_shared_prefix_len;
	int mr_user_prefix_len, mr_question_len, mr_output_len;
	/* long-doc-qa (defaults 20, 10000, 2, random, 100): num_documents
	 * documents of doc_len tokens, each asked repeat_count times; every
	 * request ends in its own PDX_LOAD_LONG_DOC_QUESTION_LEN-token
	 * question. */
	int ld_num_documents, ld_doc_len, ld_repeat_count, ld_output_len;
	enum pdx_load_repeat_mode ld_repeat_mode;
};

#define PDX_LOAD_LONG_DOC_QUESTION_LEN 8

struct pdx_load_dataset {
	struct pdx_load_request *reqs;
	size_t n;
	/* Synthetic sets: the lengths were drawn from these ranges. */
	int input_lo, input_hi, output_lo, output_hi;
};

/* Fills *out; on failure returns -1 and writes the reason into err. The
 * prefix-repetition set holds num_prompts / num_prefixes prompts per
 * prefix (as vllm), so possibly fewer than num_prompts, shuffled.
 * Multi-round and long-doc-qa take num_prompts 0 as all their requests
 * (users * rounds, documents * repeats); a smaller num_prompts keeps the
 * first ones in sending order (multi-round: round by round, so the last
 * round reached may be cut short), a larger one is refused. */
int pdx_load_dataset_build(const struct pdx_load_dataset_params *dp,
			   struct pdx_load_dataset *out, char *err,
			   size_t errlen);
void pdx_load_dataset_free(struct pdx_load_dataset *ds); /* NULL-safe */

/* Parses "random", "prefix_repetition" (or "prefix-repetition"), "file"
 * (or vllm's "custom"), "multi-round" (or "multi_round"), "long-doc-qa"
 * (or "long_doc_qa"); -1 if unknown. */
int pdx_load_dataset_kind_parse(const char *name,
				enum pdx_load_dataset_kind *out);

/* Parses "random", "tile", "interleave"; -1 if unknown. */
int pdx_load_repeat_mode_parse(const char *name,
			       enum pdx_load_repeat_mode *out);

/* The word for a token id: syllables of a fixed 70-entry list, one per
 * base-70 digit, so distinct ids give distinct words. buf holds at least
 * PDX_LOAD_WORD_MAX bytes; returns the length. */
#define PDX_LOAD_WORD_MAX 16
size_t pdx_load_word(uint32_t id, char *buf);

/* Renders ids as words joined by single spaces; malloc'd. */
char *pdx_load_ids_to_text(const uint32_t *ids, size_t n);

/* Tokens of a text the way the engine counts them: whitespace-separated
 * words. */
int pdx_load_count_words(const char *text);

#endif
