/* pdx-bench --plot: the data and the gnuplot script it writes and the
 * check for gnuplot; with the argument "png", a real PNG with its
 * temporary directory gone afterwards, skipped (77) when gnuplot cannot
 * be run. */
#include "bench/load_plot.h"
#include "tests/check.h"

#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

/* What fn wrote into a memory stream; malloc'd. */
#define CAPTURE(buf, len, call)                                                \
	do {                                                                   \
		FILE *_f = open_memstream(&(buf), &(len));                     \
		call;                                                          \
		fclose(_f);                                                    \
	} while (0)

static size_t count_lines(const char *s, const char *start)
{
	size_t n = 0, k = strlen(start);
	const char *p = s;

	while (p && *p) {
		n += !strncmp(p, start, k);
		p = strchr(p, '\n');
		p = p ? p + 1 : NULL;
	}
	return n;
}

static void test_cdf(void)
{
	double v[] = {0.001, 0.002, 0.004}, *many;
	char *buf = NULL;
	size_t len, i;

	CAPTURE(buf, len, pdx_load_plot_cdf(_f, v, 3));
	CHECK(!strcmp(buf, "1 0.333333\n2 0.666667\n4 1\n"));
	free(buf);
	/* 5000 values: 2000 points, the first and the last kept. */
	many = malloc(5000 * sizeof(*many));
	for (i = 0; i < 5000; i++)
		many[i] = (double)(i + 1) / 1e3;
	CAPTURE(buf, len, pdx_load_plot_cdf(_f, many, 5000));
	CHECK_EQ(count_lines(buf, ""), PDX_LOAD_PLOT_CDF_POINTS);
	CHECK(!strncmp(buf, "1 0.0002\n", 9));
	CHECK_STR_CONTAINS(buf, "\n5000 1\n");
	free(buf);
	free(many);
	CAPTURE(buf, len, pdx_load_plot_cdf(_f, NULL, 0));
	CHECK_EQ(len, 0);
	free(buf);
}

static void test_buckets(void)
{
	double itl[] = {0.1, 0.1};
	struct pdx_load_result res[2] = {0};
	char *buf = NULL;
	size_t len;

	/* Chunks at 0.15, 0.25 and 0.35 s, ending at 0.35 s; the failed
	 * request counts nowhere. Under 10 s: 0.1 s buckets, per second. */
	res[0].success = true;
	res[0].start = 0.05;
	res[0].ttft = 0.1;
	res[0].latency = 0.3;
	res[0].itl = itl;
	res[0].n_itl = 2;
	res[1].start = 0.0;
	res[1].ttft = 0.2;
	CHECK(pdx_load_plot_bucket_s(2.5) == 0.1);
	CHECK(pdx_load_plot_bucket_s(10.0) == 1.0);
	CAPTURE(buf, len, CHECK_EQ(pdx_load_plot_buckets(_f, res, 2, 0.45), 5));
	CHECK(!strcmp(buf, "0 0 0\n0.1 10 0\n0.2 10 0\n0.3 10 10\n0.4 0 0\n"));
	free(buf);
	/* 1 s buckets from 10 s on. */
	CAPTURE(buf, len,
		CHECK_EQ(pdx_load_plot_buckets(_f, res, 2, 12.0), 13));
	CHECK(!strncmp(buf, "0 3 1\n1 0 0\n", 12));
	free(buf);
	CAPTURE(buf, len, CHECK_EQ(pdx_load_plot_buckets(_f, res, 2, 0.0), 0));
	free(buf);
}

static void test_script(void)
{
	struct pdx_load_plot_script_params sp = {0};
	char *buf = NULL;
	size_t len;

	sp.png = "/tmp/it's.png";
	sp.dir = "/tmp/d";
	sp.title = "a 'quoted'\ntitle";
	sp.n_ttft = 3;
	sp.n_itl = 0;
	sp.n_buckets = 5;
	sp.bucket_s = 0.1;
	sp.ttft_log = true;
	CAPTURE(buf, len, pdx_load_plot_script(_f, &sp));
	CHECK_STR_CONTAINS(buf, "set terminal pngcairo");
	CHECK_STR_CONTAINS(buf, "set output '/tmp/it''s.png'\n");
	CHECK_STR_CONTAINS(buf, "layout 3,1 title 'a ''quoted'' title'");
	/* Three panels: TTFT (log scale), ITL without data, throughput. */
	CHECK_EQ(count_lines(buf, "plot "), 3);
	CHECK_STR_CONTAINS(buf, "set logscale x\n");
	CHECK_STR_CONTAINS(buf, "plot '/tmp/d/ttft.dat' using 1:2");
	CHECK(!strstr(buf, "itl.dat"));
	CHECK_EQ(count_lines(buf, "set label 1 'no data'"), 1);
	CHECK_STR_CONTAINS(buf, "plot '/tmp/d/tput.dat' using ($1+0.05):3");
	CHECK_STR_CONTAINS(buf, "unset multiplot\n");
	free(buf);
}

#define SKIP 77

/* A real PNG through gnuplot: SKIP when it is not installed. */
static int test_write(void)
{
	struct pdx_load_result res[3] = {0};
	double itl[] = {0.01, 0.02};
	char tmp[] = "/tmp/pdx_plot_test_XXXXXX", png[64], err[256], magic[4];
	struct dirent *e;
	DIR *d;
	FILE *f;
	size_t i;

	if (pdx_load_plot_check("/tmp/x.png", err, sizeof(err))) {
		printf("skip: no PNG: %s\n", err);
		return SKIP;
	}
	CHECK(mkdtemp(tmp) != NULL);
	snprintf(png, sizeof(png), "%s/run.png", tmp);
	setenv("TMPDIR", tmp, 1);
	for (i = 0; i < 3; i++) {
		res[i].success = i < 2;
		res[i].start = 0.1 * (double)i;
		res[i].ttft = 0.05 * (double)(i + 1);
		res[i].latency = res[i].ttft + 0.03;
		res[i].itl = itl;
		res[i].n_itl = 2;
	}
	CHECK_EQ(
	    pdx_load_plot_write(png, "test", res, 3, 0.5, err, sizeof(err)), 0);
	f = fopen(png, "rb");
	CHECK(f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "\x89PNG", 4));
	if (f)
		fclose(f);
	/* Only the PNG is left: the temporary directory is gone. */
	d = opendir(tmp);
	while (d && (e = readdir(d)))
		CHECK(e->d_name[0] == '.' || !strcmp(e->d_name, "run.png"));
	if (d)
		closedir(d);
	/* No successful request at all still draws (empty panels). */
	for (i = 0; i < 3; i++)
		res[i].success = false;
	CHECK_EQ(
	    pdx_load_plot_write(png, "none", res, 3, 0.5, err, sizeof(err)), 0);
	unlink(png);
	rmdir(tmp);
	return 0;
}

/* The check refuses a PNG in a directory that does not exist, gnuplot
 * or not. */
static void test_check(void)
{
	char err[256];

	CHECK_EQ(
	    pdx_load_plot_check("/nonexistent-dir/x.png", err, sizeof(err)),
	    -1);
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "png")) {
		if (test_write() == SKIP)
			return SKIP;
		CHECK_DONE();
	}
	test_cdf();
	test_buckets();
	test_script();
	test_check();
	CHECK_DONE();
}
