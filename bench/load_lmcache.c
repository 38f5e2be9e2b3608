/* The shapes of LMCache's two KV-reuse benchmarks as pdx-bench datasets:
 * multi-round QA (benchmarks/multi-round-qa: users in chat sessions whose
 * prompts carry a shared system prefix, their own history, and every
 * earlier question and answer) and long-document QA
 * (benchmarks/long-doc-qa: a few long documents, each asked several
 * times). Prompts are synthetic ids, as in the other datasets; answers
 * in the history are synthetic words of the output length, so a prompt
 * never depends on what the server said and a seed gives the same set. */
#include "bench/load_dataset_int.h"
#include "common/errbuf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The most requests and the longest prompt a set may hold: what
 * --num-prompts and an int prompt_len allow. */
#define MAX_REQUESTS 100000000LL
#define MAX_PROMPT (1LL << 30)

static int out_of_memory(char *err, size_t errlen)
{
	pdx_errbuf_set(err, errlen, "out of memory");
	return -1;
}

/* How many of 'total' requests to build: all for num_prompts 0. */
static int pick_count(size_t num_prompts, long long total, const char *what,
		      size_t *n, char *err, size_t errlen)
{
	if (total > MAX_REQUESTS) {
		pdx_errbuf_set(err, errlen,
			       "%s make %lld requests, more than %lld", what,
			       total, MAX_REQUESTS);
		return -1;
	}
	if (num_prompts > (size_t)total) {
		pdx_errbuf_set(err, errlen,
			       "--num-prompts %zu is more than the %lld "
			       "requests of %s",
			       num_prompts, total, what);
		return -1;
	}
	*n = num_prompts ? num_prompts : (size_t)total;
	return 0;
}

static int check_multi_round(const struct pdx_load_dataset_params *dp,
			     char *err, size_t errlen)
{
	long long s = dp->mr_shared_prefix_len, p = dp->mr_user_prefix_len;
	long long q = dp->mr_question_len, a = dp->mr_output_len;

	if (dp->mr_num_users < 1 || dp->mr_num_rounds < 1) {
		pdx_errbuf_set(err, errlen,
			       "multi-round: need at least 1 user and 1 round");
		return -1;
	}
	if (s < 0 || p < 0 || q < 0 || a < 1 || s + p + q < 1) {
		pdx_errbuf_set(err, errlen,
			       "multi-round: prefix and question lengths must "
			       "be >= 0 with a non-empty first prompt, and the "
			       "output length >= 1");
		return -1;
	}
	if (s + p + (dp->mr_num_rounds - 1) * (q + a) + q > MAX_PROMPT) {
		pdx_errbuf_set(err, errlen,
			       "multi-round: the last round's prompt would "
			       "exceed %lld tokens",
			       MAX_PROMPT);
		return -1;
	}
	return 0;
}

int pdx__load_build_multi_round(const struct pdx_load_dataset_params *dp,
				uint32_t vocab, struct pdx_load_rng *rng,
				struct pdx_load_dataset *ds, char *err,
				size_t errlen)
{
	size_t users = (size_t)dp->mr_num_users, rounds, n, u, r, len;
	size_t s = (size_t)dp->mr_shared_prefix_len;
	size_t p = (size_t)dp->mr_user_prefix_len;
	size_t q = (size_t)dp->mr_question_len;
	size_t a = (size_t)dp->mr_output_len;
	uint32_t *talk = NULL; /* one user's whole conversation */
	struct pdx_load_request *req;

	if (check_multi_round(dp, err, errlen))
		return -1;
	rounds = (size_t)dp->mr_num_rounds;
	if (pick_count(dp->num_prompts, (long long)users * (long long)rounds,
		       "multi-round's users * rounds", &n, err, errlen))
		return -1;
	talk = malloc((s + p + rounds * (q + a) + 1) * sizeof(*talk));
	ds->reqs = calloc(n, sizeof(*ds->reqs));
	if (!talk || !ds->reqs) {
		free(talk);
		return out_of_memory(err, errlen);
	}
	ds->input_lo = ds->input_hi = (int)(s + p + q);
	ds->output_lo = ds->output_hi = (int)a;
	/* Every user's conversation is drawn whole, even when num_prompts
	 * cuts it short, so a shorter run sends a subset of a longer one. */
	pdx__load_random_ids(rng, talk, s, vocab);
	for (u = 0; u < users; u++) {
		pdx__load_random_ids(rng, talk + s, p + rounds * (q + a),
				     vocab);
		/* Sending order is round by round: (u, r) is request
		 * r * users + u of it. */
		for (r = 0; r < rounds && r * users + u < n; r++) {
			len = s + p + r * (q + a) + q;
			req = &ds->reqs[ds->n];
			if (pdx__load_req_make(req, talk, len, NULL, 0, (int)a,
					       dp->text)) {
				free(talk);
				return out_of_memory(err, errlen);
			}
			req->follows = r > 0;
			ds->n++;
			if ((int)len > ds->input_hi)
				ds->input_hi = (int)len;
		}
	}
	free(talk);
	return 0;
}

static int check_long_doc(const struct pdx_load_dataset_params *dp, char *err,
			  size_t errlen)
{
	if (dp->ld_num_documents < 1 || dp->ld_doc_len < 1 ||
	    dp->ld_repeat_count < 1 || dp->ld_output_len < 1) {
		pdx_errbuf_set(err, errlen,
			       "long-doc-qa: documents, document length, "
			       "repeat count and output length must be >= 1");
		return -1;
	}
	if ((long long)dp->ld_doc_len + PDX_LOAD_LONG_DOC_QUESTION_LEN >
	    MAX_PROMPT) {
		pdx_errbuf_set(err, errlen,
			       "long-doc-qa: documents of more than %lld "
			       "tokens",
			       MAX_PROMPT - PDX_LOAD_LONG_DOC_QUESTION_LEN);
		return -1;
	}
	return 0;
}

/* Which document each request asks about, in LMCache's repeat orders. */
static void doc_order(const struct pdx_load_dataset_params *dp,
		      struct pdx_load_rng *rng, size_t *order, size_t total)
{
	size_t docs = (size_t)dp->ld_num_documents;
	size_t reps = (size_t)dp->ld_repeat_count, i;

	for (i = 0; i < total; i++)
		order[i] = dp->ld_repeat_mode == PDX_LOAD_REPEAT_INTERLEAVE
			       ? i / reps
			       : i % docs;
	if (dp->ld_repeat_mode == PDX_LOAD_REPEAT_RANDOM)
		pdx_load_rng_shuffle(rng, order, total, sizeof(*order));
}

int pdx__load_build_long_doc(const struct pdx_load_dataset_params *dp,
			     uint32_t vocab, struct pdx_load_rng *rng,
			     struct pdx_load_dataset *ds, char *err,
			     size_t errlen)
{
	size_t len = (size_t)dp->ld_doc_len, total, n, i;
	uint32_t *docs = NULL, question[PDX_LOAD_LONG_DOC_QUESTION_LEN];
	size_t *order = NULL;
	int rc = -1;

	if (check_long_doc(dp, err, errlen))
		return -1;
	total = (size_t)dp->ld_num_documents * (size_t)dp->ld_repeat_count;
	if (pick_count(dp->num_prompts, (long long)total,
		       "long-doc-qa's documents * repeats", &n, err, errlen))
		return -1;
	docs = malloc((size_t)dp->ld_num_documents * len * sizeof(*docs));
	order = malloc(total * sizeof(*order));
	ds->reqs = calloc(n, sizeof(*ds->reqs));
	if (!docs || !order || !ds->reqs)
		goto out;
	pdx__load_random_ids(rng, docs, (size_t)dp->ld_num_documents * len,
			     vocab);
	doc_order(dp, rng, order, total);
	for (i = 0; i < n; i++) {
		pdx__load_random_ids(rng, question,
				     PDX_LOAD_LONG_DOC_QUESTION_LEN, vocab);
		if (pdx__load_req_make(&ds->reqs[i], docs + order[i] * len, len,
				       question, PDX_LOAD_LONG_DOC_QUESTION_LEN,
				       dp->ld_output_len, dp->text))
			goto out;
		ds->n = i + 1;
	}
	ds->input_lo = ds->input_hi = (int)len + PDX_LOAD_LONG_DOC_QUESTION_LEN;
	ds->output_lo = ds->output_hi = dp->ld_output_len;
	rc = 0;
out:
	if (rc)
		out_of_memory(err, errlen);
	free(docs);
	free(order);
	return rc;
}
