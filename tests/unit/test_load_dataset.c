/* pdx-bench datasets: lengths, determinism, shared prefixes, files, and
 * the LMCache shapes (multi-round sessions, long-document repeats). */
#include "bench/load_dataset.h"
#include "tests/check.h"

#include <stdlib.h>
#include <unistd.h>

static int build(struct pdx_load_dataset_params *dp,
		 struct pdx_load_dataset *ds)
{
	char err[256];
	int rc = pdx_load_dataset_build(dp, ds, err, sizeof(err));

	if (rc)
		fprintf(stderr, "build: %s\n", err);
	return rc;
}

static struct pdx_load_dataset_params random_params(void)
{
	struct pdx_load_dataset_params dp = {0};

	dp.kind = PDX_LOAD_DS_RANDOM;
	dp.num_prompts = 50;
	dp.seed = 7;
	dp.text = true;
	dp.random_input_len = 64;
	dp.random_output_len = 16;
	return dp;
}

static bool same_set(const struct pdx_load_dataset *a,
		     const struct pdx_load_dataset *b)
{
	size_t i;

	if (a->n != b->n)
		return false;
	for (i = 0; i < a->n; i++) {
		if (a->reqs[i].prompt_len != b->reqs[i].prompt_len ||
		    a->reqs[i].output_len != b->reqs[i].output_len ||
		    memcmp(a->reqs[i].ids, b->reqs[i].ids,
			   a->reqs[i].prompt_len * sizeof(uint32_t)) ||
		    strcmp(a->reqs[i].text, b->reqs[i].text))
			return false;
	}
	return true;
}

static void test_words(void)
{
	char a[PDX_LOAD_WORD_MAX], b[PDX_LOAD_WORD_MAX];
	uint32_t ids[] = {0, 69, 70, 4899, 4900, 31999, 4294967295u};
	size_t i, j;
	char *t;

	/* Distinct ids, distinct words; never a space inside a word. */
	for (i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
		pdx_load_word(ids[i], a);
		CHECK(strlen(a) > 0 && !strchr(a, ' '));
		for (j = i + 1; j < sizeof(ids) / sizeof(ids[0]); j++) {
			pdx_load_word(ids[j], b);
			CHECK(strcmp(a, b) != 0);
		}
	}
	for (i = 0; i < 5000; i++) {
		pdx_load_word((uint32_t)i, a);
		pdx_load_word((uint32_t)i + 1, b);
		CHECK(strcmp(a, b) != 0);
	}
	t = pdx_load_ids_to_text(ids, 7);
	CHECK_EQ(pdx_load_count_words(t), 7);
	free(t);
	CHECK_EQ(pdx_load_count_words("  a b\tc\n d  "), 4);
	CHECK_EQ(pdx_load_count_words(""), 0);
}

static void test_random(void)
{
	struct pdx_load_dataset_params dp = random_params();
	struct pdx_load_dataset a, b;
	size_t i;

	/* Range ratio 0: exact lengths; text has one word per token. */
	CHECK_EQ(build(&dp, &a), 0);
	CHECK_EQ(a.n, 50);
	for (i = 0; i < a.n; i++) {
		CHECK_EQ(a.reqs[i].prompt_len, 64);
		CHECK_EQ(a.reqs[i].output_len, 16);
		CHECK_EQ(pdx_load_count_words(a.reqs[i].text), 64);
	}
	/* Deterministic for a seed, different for another. */
	CHECK_EQ(build(&dp, &b), 0);
	CHECK(same_set(&a, &b));
	pdx_load_dataset_free(&b);
	dp.seed = 8;
	CHECK_EQ(build(&dp, &b), 0);
	CHECK(!same_set(&a, &b));
	pdx_load_dataset_free(&b);
	pdx_load_dataset_free(&a);

	/* Range ratio 0.5: [floor(64*.5), ceil(64*1.5)] and [8, 24], with
	 * the ends reached over many prompts. */
	dp = random_params();
	dp.random_range_ratio = 0.5;
	dp.num_prompts = 2000;
	dp.text = false;
	CHECK_EQ(build(&dp, &a), 0);
	{
		int lo = 1 << 30, hi = 0, olo = 1 << 30, ohi = 0;

		for (i = 0; i < a.n; i++) {
			int p = a.reqs[i].prompt_len, o = a.reqs[i].output_len;

			lo = p < lo ? p : lo;
			hi = p > hi ? p : hi;
			olo = o < olo ? o : olo;
			ohi = o > ohi ? o : ohi;
			CHECK(a.reqs[i].text == NULL);
		}
		CHECK_EQ(lo, 32);
		CHECK_EQ(hi, 96);
		CHECK_EQ(olo, 8);
		CHECK_EQ(ohi, 24);
		CHECK_EQ(a.input_lo, 32);
		CHECK_EQ(a.input_hi, 96);
	}
	pdx_load_dataset_free(&a);

	/* A random prefix shared by every prompt, before the input tokens;
	 * the rest differs between prompts. */
	dp = random_params();
	dp.random_prefix_len = 20;
	CHECK_EQ(build(&dp, &a), 0);
	for (i = 0; i < a.n; i++) {
		CHECK_EQ(a.reqs[i].prompt_len, 84);
		CHECK(!memcmp(a.reqs[i].ids, a.reqs[0].ids, 20 * 4));
	}
	CHECK(memcmp(a.reqs[1].ids + 20, a.reqs[0].ids + 20, 64 * 4) != 0);
	{
		/* The same prefix in text: the first 20 words agree. */
		const char *t0 = a.reqs[0].text, *t1 = a.reqs[1].text;
		size_t k = 0;
		int words = 0;

		while (t0[k] && t0[k] == t1[k] && words < 20)
			if (t0[k++] == ' ')
				words++;
		CHECK_EQ(words, 20);
	}
	pdx_load_dataset_free(&a);

	/* Output lengths never drop to 0; bad ratios are refused. */
	dp = random_params();
	dp.random_output_len = 1;
	dp.random_range_ratio = 0.9;
	CHECK_EQ(build(&dp, &a), 0);
	for (i = 0; i < a.n; i++)
		CHECK(a.reqs[i].output_len >= 1);
	pdx_load_dataset_free(&a);
	dp.random_range_ratio = 1.0;
	CHECK_EQ(pdx_load_dataset_build(&dp, &a, NULL, 0), -1);
}

static void test_prefix_repetition(void)
{
	struct pdx_load_dataset_params dp = {0};
	struct pdx_load_dataset a, b;
	size_t i, j, same;

	dp.kind = PDX_LOAD_DS_PREFIX_REPETITION;
	dp.num_prompts = 23; /* 23 / 4 = 5 per prefix: 20 prompts */
	dp.seed = 1;
	dp.text = true;
	dp.pr_prefix_len = 16;
	dp.pr_suffix_len = 8;
	dp.pr_num_prefixes = 4;
	dp.pr_output_len = 5;
	CHECK_EQ(build(&dp, &a), 0);
	CHECK_EQ(a.n, 20);
	for (i = 0; i < a.n; i++) {
		CHECK_EQ(a.reqs[i].prompt_len, 24);
		CHECK_EQ(a.reqs[i].output_len, 5);
		CHECK_EQ(pdx_load_count_words(a.reqs[i].text), 24);
		/* Each prompt shares its 16-token prefix with exactly 4
		 * others, and never its suffix. */
		same = 0;
		for (j = 0; j < a.n; j++) {
			if (j == i)
				continue;
			if (!memcmp(a.reqs[i].ids, a.reqs[j].ids, 16 * 4)) {
				same++;
				CHECK(memcmp(a.reqs[i].ids + 16,
					     a.reqs[j].ids + 16, 8 * 4) != 0);
			}
		}
		CHECK_EQ(same, 4);
	}
	/* Shuffled: the first five are not all of one prefix. */
	same = 0;
	for (i = 1; i < 5; i++)
		same += !memcmp(a.reqs[0].ids, a.reqs[i].ids, 16 * 4);
	CHECK(same < 4);
	CHECK_EQ(build(&dp, &b), 0);
	CHECK(same_set(&a, &b));
	pdx_load_dataset_free(&b);
	pdx_load_dataset_free(&a);
	/* Fewer prompts than prefixes is refused, as in vllm. */
	dp.num_prompts = 3;
	CHECK_EQ(pdx_load_dataset_build(&dp, &a, NULL, 0), -1);
}

static char *write_tmp(const char *content)
{
	static char path[64];
	int fd;

	snprintf(path, sizeof(path), "/tmp/pdx_load_ds_XXXXXX");
	fd = mkstemp(path);
	if (fd < 0)
		return NULL;
	if (write(fd, content, strlen(content)) < 0)
		path[0] = '\0';
	close(fd);
	return path;
}

static void test_file(void)
{
	struct pdx_load_dataset_params dp = {0};
	struct pdx_load_dataset a;
	char err[256], *path;

	dp.kind = PDX_LOAD_DS_FILE;
	dp.num_prompts = 5;
	dp.file_output_len = 9;
	path = write_tmp("{\"prompt\": \"one two three\", \"output_len\": 4}\n"
			 "\n"
			 "{\"prompt\": [5, 6, 7, 8]}\n");
	dp.path = path;
	CHECK_EQ(build(&dp, &a), 0);
	CHECK_EQ(a.n, 5);
	CHECK(!strcmp(a.reqs[0].text, "one two three"));
	CHECK_EQ(a.reqs[0].prompt_len, 3);
	CHECK_EQ(a.reqs[0].output_len, 4);
	CHECK(a.reqs[1].text == NULL && a.reqs[1].ids[3] == 8);
	CHECK_EQ(a.reqs[1].prompt_len, 4);
	CHECK_EQ(a.reqs[1].output_len, 9);
	/* Cycled to num_prompts. */
	CHECK(!strcmp(a.reqs[2].text, "one two three"));
	CHECK_EQ(a.reqs[3].ids[0], 5);
	pdx_load_dataset_free(&a);
	unlink(path);

	path = write_tmp("hello world\n  a longer prompt here  \n");
	dp.path = path;
	dp.num_prompts = 2;
	CHECK_EQ(build(&dp, &a), 0);
	CHECK_EQ(a.reqs[0].prompt_len, 2);
	CHECK_EQ(a.reqs[1].prompt_len, 4);
	CHECK_EQ(a.reqs[1].output_len, 9);
	pdx_load_dataset_free(&a);
	unlink(path);

	path = write_tmp("{\"prompt\": \"ok\"}\n{\"text\": 1}\n");
	dp.path = path;
	CHECK_EQ(pdx_load_dataset_build(&dp, &a, err, sizeof(err)), -1);
	CHECK_STR_CONTAINS(err, "line 2");
	unlink(path);

	dp.path = "/nonexistent/prompts.jsonl";
	CHECK_EQ(pdx_load_dataset_build(&dp, &a, err, sizeof(err)), -1);
}

/* Whether text is longer and starts with the words of prefix. */
static bool extends(const char *text, const char *prefix)
{
	size_t n = strlen(prefix);

	return !strncmp(text, prefix, n) && text[n] == ' ';
}

static struct pdx_load_dataset_params multi_round_params(void)
{
	struct pdx_load_dataset_params dp = {0};

	dp.kind = PDX_LOAD_DS_MULTI_ROUND;
	dp.seed = 5;
	dp.text = true;
	dp.mr_num_users = 3;
	dp.mr_num_rounds = 4;
	dp.mr_shared_prefix_len = 5;
	dp.mr_user_prefix_len = 7;
	dp.mr_question_len = 3;
	dp.mr_output_len = 2;
	return dp;
}

static void test_multi_round(void)
{
	struct pdx_load_dataset_params dp = multi_round_params();
	struct pdx_load_dataset a, b;
	const struct pdx_load_request *r, *q;
	size_t u, k;
	char err[256];

	/* Laid out user by user; round k has 5 + 7 + k * (3 + 2) + 3
	 * tokens, asks for 2, and follows the round before it. */
	CHECK_EQ(build(&dp, &a), 0);
	CHECK_EQ(a.n, 12);
	CHECK_EQ(a.input_lo, 15);
	CHECK_EQ(a.input_hi, 30);
	for (u = 0; u < 3; u++) {
		for (k = 0; k < 4; k++) {
			r = &a.reqs[u * 4 + k];
			CHECK_EQ(r->prompt_len, 15 + 5 * (int)k);
			CHECK_EQ(r->output_len, 2);
			CHECK_EQ(r->follows, k > 0);
			CHECK_EQ(pdx_load_count_words(r->text), r->prompt_len);
			/* Every user shares the system prefix... */
			CHECK(!memcmp(r->ids, a.reqs[0].ids, 5 * 4));
			if (!k)
				continue;
			/* ...and each round extends the one before. */
			q = &a.reqs[u * 4 + k - 1];
			CHECK(!memcmp(r->ids, q->ids, q->prompt_len * 4));
			CHECK(extends(r->text, q->text));
		}
	}
	/* Users' own prefixes differ. */
	CHECK(memcmp(a.reqs[0].ids + 5, a.reqs[4].ids + 5, 7 * 4) != 0);
	CHECK(!extends(a.reqs[5].text, a.reqs[0].text));
	CHECK(memcmp(a.reqs[4].ids + 5, a.reqs[8].ids + 5, 7 * 4) != 0);
	/* Deterministic for a seed. */
	CHECK_EQ(build(&dp, &b), 0);
	CHECK(same_set(&a, &b));
	pdx_load_dataset_free(&b);
	dp.seed = 6;
	CHECK_EQ(build(&dp, &b), 0);
	CHECK(!same_set(&a, &b));
	pdx_load_dataset_free(&b);

	/* num_prompts 7 keeps rounds in sending order, round by round:
	 * users 0, 1, 2 get 3, 2 and 2 rounds, the same prompts as in the
	 * whole set. */
	dp = multi_round_params();
	dp.num_prompts = 7;
	CHECK_EQ(build(&dp, &b), 0);
	CHECK_EQ(b.n, 7);
	{
		static const size_t from[] = {0, 1, 2, 4, 5, 8, 9};

		for (k = 0; k < 7; k++) {
			CHECK(!strcmp(b.reqs[k].text, a.reqs[from[k]].text));
			CHECK_EQ(b.reqs[k].follows, a.reqs[from[k]].follows);
		}
	}
	pdx_load_dataset_free(&b);
	pdx_load_dataset_free(&a);

	/* More than users * rounds, and an empty first prompt, are
	 * refused. */
	dp.num_prompts = 13;
	CHECK_EQ(pdx_load_dataset_build(&dp, &a, err, sizeof(err)), -1);
	CHECK_STR_CONTAINS(err, "more than the 12");
	dp = multi_round_params();
	dp.mr_shared_prefix_len = dp.mr_user_prefix_len = 0;
	dp.mr_question_len = 0;
	CHECK_EQ(pdx_load_dataset_build(&dp, &a, err, sizeof(err)), -1);
}

static struct pdx_load_dataset_params long_doc_params(void)
{
	struct pdx_load_dataset_params dp = {0};

	dp.kind = PDX_LOAD_DS_LONG_DOC_QA;
	dp.seed = 9;
	dp.text = true;
	dp.ld_num_documents = 4;
	dp.ld_doc_len = 30;
	dp.ld_repeat_count = 3;
	dp.ld_output_len = 11;
	return dp;
}

/* Which of the first requests' documents request i asks about, -1 when
 * none: documents are told apart by their 30 ids. */
static int doc_of(const struct pdx_load_dataset *ds, size_t i,
		  const uint32_t *const *docs, int ndocs)
{
	int d;

	for (d = 0; d < ndocs; d++)
		if (!memcmp(ds->reqs[i].ids, docs[d], 30 * 4))
			return d;
	return -1;
}

/* The document of each request, numbered in order of first use. */
static void doc_sequence(const struct pdx_load_dataset *ds, int *seq)
{
	const uint32_t *docs[16];
	int nd = 0;
	size_t i;

	for (i = 0; i < ds->n; i++) {
		seq[i] = doc_of(ds, i, docs, nd);
		if (seq[i] < 0 && nd < 16) {
			docs[nd] = ds->reqs[i].ids;
			seq[i] = nd++;
		}
	}
}

static void test_long_doc(void)
{
	struct pdx_load_dataset_params dp = long_doc_params();
	struct pdx_load_dataset a, b;
	int seq[12], count[4] = {0}, tiled = 1;
	size_t i, j;
	char err[256];

	/* random: each of 4 documents asked 3 times, shuffled; every
	 * request ends in its own 8-token question. */
	CHECK_EQ(build(&dp, &a), 0);
	CHECK_EQ(a.n, 12);
	doc_sequence(&a, seq);
	for (i = 0; i < a.n; i++) {
		CHECK_EQ(a.reqs[i].prompt_len, 38);
		CHECK_EQ(a.reqs[i].output_len, 11);
		CHECK(!a.reqs[i].follows);
		CHECK_EQ(pdx_load_count_words(a.reqs[i].text), 38);
		CHECK(seq[i] >= 0 && seq[i] < 4);
		count[seq[i] & 3]++;
		tiled &= seq[i] == (int)(i % 4);
		for (j = 0; j < i; j++)
			CHECK(memcmp(a.reqs[i].ids + 30, a.reqs[j].ids + 30,
				     8 * 4) != 0);
	}
	for (i = 0; i < 4; i++)
		CHECK_EQ(count[i], 3);
	CHECK(!tiled);
	CHECK_EQ(build(&dp, &b), 0);
	CHECK(same_set(&a, &b));
	pdx_load_dataset_free(&b);
	pdx_load_dataset_free(&a);

	/* tile: d0 d1 d2 d3 d0 ...; interleave: d0 d0 d0 d1 ... */
	dp.ld_repeat_mode = PDX_LOAD_REPEAT_TILE;
	CHECK_EQ(build(&dp, &a), 0);
	doc_sequence(&a, seq);
	for (i = 0; i < a.n; i++)
		CHECK_EQ(seq[i], (int)(i % 4));
	pdx_load_dataset_free(&a);
	dp.ld_repeat_mode = PDX_LOAD_REPEAT_INTERLEAVE;
	CHECK_EQ(build(&dp, &a), 0);
	doc_sequence(&a, seq);
	for (i = 0; i < a.n; i++)
		CHECK_EQ(seq[i], (int)(i / 3));
	pdx_load_dataset_free(&a);

	/* num_prompts keeps the first ones; more than all is refused. */
	dp.num_prompts = 5;
	CHECK_EQ(build(&dp, &a), 0);
	CHECK_EQ(a.n, 5);
	doc_sequence(&a, seq);
	CHECK_EQ(seq[4], 1);
	pdx_load_dataset_free(&a);
	dp.num_prompts = 13;
	CHECK_EQ(pdx_load_dataset_build(&dp, &a, err, sizeof(err)), -1);
	CHECK_STR_CONTAINS(err, "more than the 12");
	dp = long_doc_params();
	dp.ld_doc_len = 0;
	CHECK_EQ(pdx_load_dataset_build(&dp, &a, err, sizeof(err)), -1);
}

int main(void)
{
	enum pdx_load_dataset_kind k;
	enum pdx_load_repeat_mode rm;

	test_words();
	test_random();
	test_prefix_repetition();
	test_file();
	test_multi_round();
	test_long_doc();
	CHECK_EQ(pdx_load_dataset_kind_parse("prefix-repetition", &k), 0);
	CHECK_EQ(k, PDX_LOAD_DS_PREFIX_REPETITION);
	CHECK_EQ(pdx_load_dataset_kind_parse("custom", &k), 0);
	CHECK_EQ(k, PDX_LOAD_DS_FILE);
	CHECK_EQ(pdx_load_dataset_kind_parse("sharegpt", &k), -1);
	CHECK_EQ(pdx_load_dataset_kind_parse("multi-round", &k), 0);
	CHECK_EQ(k, PDX_LOAD_DS_MULTI_ROUND);
	CHECK_EQ(pdx_load_dataset_kind_parse("long_doc_qa", &k), 0);
	CHECK_EQ(k, PDX_LOAD_DS_LONG_DOC_QA);
	CHECK_EQ(pdx_load_repeat_mode_parse("interleave", &rm), 0);
	CHECK_EQ(rm, PDX_LOAD_REPEAT_INTERLEAVE);
	CHECK_EQ(pdx_load_repeat_mode_parse("tile", &rm), 0);
	CHECK_EQ(rm, PDX_LOAD_REPEAT_TILE);
	CHECK_EQ(pdx_load_repeat_mode_parse("shuffle", &rm), -1);
	CHECK_DONE();
}
