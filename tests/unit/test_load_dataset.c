/* pdx-bench datasets: lengths, determinism, shared prefixes, files. */
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

int main(void)
{
	enum pdx_load_dataset_kind k;

	test_words();
	test_random();
	test_prefix_repetition();
	test_file();
	CHECK_EQ(pdx_load_dataset_kind_parse("prefix-repetition", &k), 0);
	CHECK_EQ(k, PDX_LOAD_DS_PREFIX_REPETITION);
	CHECK_EQ(pdx_load_dataset_kind_parse("custom", &k), 0);
	CHECK_EQ(k, PDX_LOAD_DS_FILE);
	CHECK_EQ(pdx_load_dataset_kind_parse("sharegpt", &k), -1);
	CHECK_DONE();
}
