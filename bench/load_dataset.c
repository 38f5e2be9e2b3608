#include "common/errbuf.h"
#include "bench/load_dataset.h"
#include "bench/load_dataset_int.h"
#include "bench/load_rng.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_VOCAB 32000
/* Sequences drawn from one --seed; separate from the arrival times'. */
#define RNG_STREAM_DATASET 1

int pdx_load_dataset_kind_parse(const char *name,
				enum pdx_load_dataset_kind *out)
{
	if (!strcmp(name, "random"))
		*out = PDX_LOAD_DS_RANDOM;
	else if (!strcmp(name, "prefix_repetition") ||
		 !strcmp(name, "prefix-repetition"))
		*out = PDX_LOAD_DS_PREFIX_REPETITION;
	else if (!strcmp(name, "file") || !strcmp(name, "custom"))
		*out = PDX_LOAD_DS_FILE;
	else if (!strcmp(name, "multi-round") || !strcmp(name, "multi_round"))
		*out = PDX_LOAD_DS_MULTI_ROUND;
	else if (!strcmp(name, "long-doc-qa") || !strcmp(name, "long_doc_qa"))
		*out = PDX_LOAD_DS_LONG_DOC_QA;
	else
		return -1;
	return 0;
}

int pdx_load_repeat_mode_parse(const char *name, enum pdx_load_repeat_mode *out)
{
	if (!strcmp(name, "random"))
		*out = PDX_LOAD_REPEAT_RANDOM;
	else if (!strcmp(name, "tile"))
		*out = PDX_LOAD_REPEAT_TILE;
	else if (!strcmp(name, "interleave"))
		*out = PDX_LOAD_REPEAT_INTERLEAVE;
	else
		return -1;
	return 0;
}

void pdx_load_dataset_free(struct pdx_load_dataset *ds)
{
	size_t i;

	if (!ds)
		return;
	for (i = 0; i < ds->n; i++) {
		free(ds->reqs[i].ids);
		free(ds->reqs[i].text);
	}
	free(ds->reqs);
	ds->reqs = NULL;
	ds->n = 0;
}

/* vllm's RandomDataset: lengths uniform over [floor(L(1-r)), ceil(L(1+r))]
 * (output at least 1), a shared random prefix, then the sequence
 * (offset + i + k) % vocab for request i. */
static int build_random(const struct pdx_load_dataset_params *dp,
			uint32_t vocab, struct pdx_load_rng *rng,
			struct pdx_load_dataset *ds, char *err, size_t errlen)
{
	double r = dp->random_range_ratio;
	int in_len = dp->random_input_len, out_len = dp->random_output_len;
	int plen = dp->random_prefix_len;
	int *ilens = NULL, *olens = NULL;
	uint32_t *prefix = NULL, *body = NULL, *offs = NULL;
	size_t n = dp->num_prompts, i, k;
	int rc = -1;

	if (!(r >= 0.0 && r < 1.0)) {
		pdx_errbuf_set(err, errlen, "--random-range-ratio must be in [0, 1)");
		return -1;
	}
	if (in_len < 0 || out_len < 0 || plen < 0) {
		pdx_errbuf_set(err, errlen, "random dataset lengths must be >= 0");
		return -1;
	}
	ds->input_lo = (int)floor(in_len * (1.0 - r));
	ds->input_hi = (int)ceil(in_len * (1.0 + r));
	ds->output_lo = (int)floor(out_len * (1.0 - r));
	ds->output_hi = (int)ceil(out_len * (1.0 + r));
	if (ds->output_lo < 1)
		ds->output_lo = 1;
	if (ds->output_hi < 1)
		ds->output_hi = 1;
	if (plen + ds->input_lo < 1) {
		pdx_errbuf_set(err, errlen,
			"--random-input-len is too small: the shortest prompt "
			"would have %d tokens",
			plen + ds->input_lo);
		return -1;
	}
	ilens = calloc(n + 1, sizeof(*ilens));
	olens = calloc(n + 1, sizeof(*olens));
	offs = calloc(n + 1, sizeof(*offs));
	prefix = calloc((size_t)plen + 1, sizeof(*prefix));
	body = calloc((size_t)ds->input_hi + 1, sizeof(*body));
	ds->reqs = calloc(n + 1, sizeof(*ds->reqs));
	if (!ilens || !olens || !offs || !prefix || !body || !ds->reqs)
		goto out;
	/* Same order of draws as vllm: prefix, input lengths, output
	 * lengths, offsets. */
	pdx__load_random_ids(rng, prefix, (size_t)plen, vocab);
	for (i = 0; i < n; i++)
		ilens[i] =
		    (int)pdx_load_rng_range(rng, ds->input_lo, ds->input_hi);
	for (i = 0; i < n; i++)
		olens[i] =
		    (int)pdx_load_rng_range(rng, ds->output_lo, ds->output_hi);
	for (i = 0; i < n; i++)
		offs[i] = (uint32_t)pdx_load_rng_range(rng, 0, vocab - 1);
	for (i = 0; i < n; i++) {
		for (k = 0; k < (size_t)ilens[i]; k++)
			body[k] =
			    (uint32_t)(((uint64_t)offs[i] + i + k) % vocab);
		if (pdx__load_req_make(&ds->reqs[i], prefix, (size_t)plen, body,
				       (size_t)ilens[i], olens[i], dp->text))
			goto out;
		ds->n = i + 1;
	}
	rc = 0;
out:
	if (rc && err && errlen && !err[0])
		pdx_errbuf_set(err, errlen, "out of memory");
	free(ilens);
	free(olens);
	free(offs);
	free(prefix);
	free(body);
	return rc;
}

/* vllm's PrefixRepetitionRandomDataset: num_prefixes random prefixes,
 * num_prompts / num_prefixes random suffixes each, then a shuffle. */
static int build_prefix_rep(const struct pdx_load_dataset_params *dp,
			    uint32_t vocab, struct pdx_load_rng *rng,
			    struct pdx_load_dataset *ds, char *err,
			    size_t errlen)
{
	size_t np = dp->pr_num_prefixes > 0 ? (size_t)dp->pr_num_prefixes : 0;
	size_t per, p, j, total;
	size_t plen = (size_t)dp->pr_prefix_len,
	       slen = (size_t)dp->pr_suffix_len;
	uint32_t *prefix = NULL, *suffix = NULL;
	int rc = -1;

	if (np == 0 || dp->pr_prefix_len < 0 || dp->pr_suffix_len < 0 ||
	    dp->pr_output_len < 1 || plen + slen == 0) {
		pdx_errbuf_set(err, errlen,
			"prefix repetition: need num-prefixes >= 1, "
			"output-len >= 1 and a non-empty prompt");
		return -1;
	}
	per = dp->num_prompts / np;
	if (per == 0) {
		pdx_errbuf_set(err, errlen,
			"num_requests (%zu) must be greater than or equal to "
			"num_prefixes (%zu)",
			dp->num_prompts, np);
		return -1;
	}
	total = per * np;
	ds->input_lo = ds->input_hi = (int)(plen + slen);
	ds->output_lo = ds->output_hi = dp->pr_output_len;
	prefix = calloc(plen + 1, sizeof(*prefix));
	suffix = calloc(slen + 1, sizeof(*suffix));
	ds->reqs = calloc(total, sizeof(*ds->reqs));
	if (!prefix || !suffix || !ds->reqs)
		goto out;
	for (p = 0; p < np; p++) {
		pdx__load_random_ids(rng, prefix, plen, vocab);
		for (j = 0; j < per; j++) {
			pdx__load_random_ids(rng, suffix, slen, vocab);
			if (pdx__load_req_make(&ds->reqs[ds->n], prefix, plen,
					       suffix, slen, dp->pr_output_len,
					       dp->text))
				goto out;
			ds->n++;
		}
	}
	pdx_load_rng_shuffle(rng, ds->reqs, ds->n, sizeof(*ds->reqs));
	rc = 0;
out:
	if (rc && err && errlen && !err[0])
		pdx_errbuf_set(err, errlen, "out of memory");
	free(prefix);
	free(suffix);
	return rc;
}

/* One line of a prompt file into r; 1 if the line holds no prompt. */
static int parse_line(char *line, bool jsonl, int default_out,
		      struct pdx_load_request *r, char *err, size_t errlen,
		      size_t lineno)
{
	json_t *root, *pr, *ol, *v;
	size_t n, i;
	char *e;
	int rc = -1;

	for (e = line + strlen(line);
	     e > line && isspace((unsigned char)e[-1]);)
		*--e = '\0';
	if (!*line)
		return 1;
	memset(r, 0, sizeof(*r));
	r->output_len = default_out;
	if (!jsonl) {
		r->text = strdup(line);
		r->prompt_len = pdx_load_count_words(line);
		return r->text ? 0 : -1;
	}
	root = json_loads(line, 0, NULL);
	pr = json_object_get(root, "prompt");
	ol = json_object_get(root, "output_len");
	if (json_is_integer(ol) && json_integer_value(ol) > 0)
		r->output_len = (int)json_integer_value(ol);
	if (json_is_string(pr)) {
		r->text = strdup(json_string_value(pr));
		if (r->text) {
			r->prompt_len = pdx_load_count_words(r->text);
			rc = 0;
		}
	} else if (json_is_array(pr) && json_array_size(pr) > 0) {
		n = json_array_size(pr);
		r->ids = malloc(n * sizeof(*r->ids));
		rc = r->ids ? 0 : -1;
		json_array_foreach(pr, i, v)
		{
			if (rc || !json_is_integer(v) ||
			    json_integer_value(v) < 0 ||
			    json_integer_value(v) > UINT32_MAX) {
				rc = -1;
				break;
			}
			r->ids[i] = (uint32_t)json_integer_value(v);
		}
		r->prompt_len = (int)n;
	}
	json_decref(root);
	if (rc) {
		free(r->ids);
		free(r->text);
		r->ids = NULL;
		r->text = NULL;
		pdx_errbuf_set(err, errlen,
			"line %zu: want {\"prompt\": \"text\" or [token ids], "
			"\"output_len\": N}",
			lineno);
	}
	return rc;
}

static int copy_req(struct pdx_load_request *dst,
		    const struct pdx_load_request *src)
{
	*dst = *src;
	dst->ids = NULL;
	dst->text = NULL;
	if (src->ids) {
		dst->ids = malloc((size_t)src->prompt_len * sizeof(*dst->ids));
		if (!dst->ids)
			return -1;
		memcpy(dst->ids, src->ids,
		       (size_t)src->prompt_len * sizeof(*dst->ids));
	}
	if (src->text) {
		dst->text = strdup(src->text);
		if (!dst->text)
			return -1;
	}
	return 0;
}

static int build_file(const struct pdx_load_dataset_params *dp,
		      struct pdx_load_dataset *ds, char *err, size_t errlen)
{
	FILE *f;
	char *line = NULL;
	size_t cap = 0, lineno = 0, got = 0, i;
	const char *q;
	bool jsonl = false, first = true;
	ssize_t nread;
	int rc = -1, pr;

	if (!dp->path) {
		pdx_errbuf_set(err, errlen, "the file dataset needs --dataset-path");
		return -1;
	}
	f = fopen(dp->path, "r");
	if (!f) {
		pdx_errbuf_set(err, errlen, "%s: %s", dp->path, strerror(errno));
		return -1;
	}
	ds->reqs = calloc(dp->num_prompts + 1, sizeof(*ds->reqs));
	if (!ds->reqs)
		goto out;
	while (got < dp->num_prompts &&
	       (nread = getline(&line, &cap, f)) >= 0) {
		lineno++;
		for (q = line; isspace((unsigned char)*q); q++)
			;
		if (!*q)
			continue;
		if (first) {
			jsonl = *q == '{';
			first = false;
		}
		pr = parse_line(line, jsonl, dp->file_output_len,
				&ds->reqs[got], err, errlen, lineno);
		if (pr < 0)
			goto out;
		if (pr == 0)
			ds->n = ++got;
	}
	if (got == 0) {
		pdx_errbuf_set(err, errlen, "%s: no prompts", dp->path);
		goto out;
	}
	for (i = got; i < dp->num_prompts; i++) {
		if (copy_req(&ds->reqs[i], &ds->reqs[i % got]))
			goto out;
		ds->n = i + 1;
	}
	ds->input_lo = ds->output_lo = 0;
	ds->input_hi = ds->output_hi = 0;
	rc = 0;
out:
	if (rc && err && errlen && !err[0])
		pdx_errbuf_set(err, errlen, "out of memory");
	free(line);
	fclose(f);
	return rc;
}

int pdx_load_dataset_build(const struct pdx_load_dataset_params *dp,
			   struct pdx_load_dataset *out, char *err,
			   size_t errlen)
{
	struct pdx_load_dataset ds = {0};
	struct pdx_load_rng rng;
	uint32_t vocab = dp->vocab_size ? dp->vocab_size : DEFAULT_VOCAB;
	int rc = -1;

	if (err && errlen)
		err[0] = '\0';
	if (dp->num_prompts == 0 && dp->kind != PDX_LOAD_DS_MULTI_ROUND &&
	    dp->kind != PDX_LOAD_DS_LONG_DOC_QA) {
		pdx_errbuf_set(err, errlen, "--num-prompts must be >= 1");
		return -1;
	}
	pdx_load_rng_seed(&rng, dp->seed, RNG_STREAM_DATASET);
	switch (dp->kind) {
	case PDX_LOAD_DS_RANDOM:
		rc = build_random(dp, vocab, &rng, &ds, err, errlen);
		break;
	case PDX_LOAD_DS_PREFIX_REPETITION:
		rc = build_prefix_rep(dp, vocab, &rng, &ds, err, errlen);
		break;
	case PDX_LOAD_DS_FILE:
		rc = build_file(dp, &ds, err, errlen);
		break;
	case PDX_LOAD_DS_MULTI_ROUND:
		rc = pdx__load_build_multi_round(dp, vocab, &rng, &ds, err,
						 errlen);
		break;
	case PDX_LOAD_DS_LONG_DOC_QA:
		rc = pdx__load_build_long_doc(dp, vocab, &rng, &ds, err,
					      errlen);
		break;
	}
	if (rc) {
		pdx_load_dataset_free(&ds);
		return -1;
	}
	*out = ds;
	return 0;
}
