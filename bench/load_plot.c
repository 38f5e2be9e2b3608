#include "bench/load_plot.h"
#include "common/errbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define GNUPLOT "gnuplot"

extern char **environ;

/* The data files, the script and gnuplot's stderr, in the temp dir. */
static const char *const tmp_files[] = {"ttft.dat", "itl.dat", "tput.dat",
					"plot.gp", "gnuplot.log"};

static bool in_path(const char *prog)
{
	const char *path = getenv("PATH"), *p, *end;
	char full[4096];
	size_t len;

	for (p = path ? path : "/usr/bin:/bin"; *p; p = *end ? end + 1 : end) {
		end = strchr(p, ':');
		if (!end)
			end = p + strlen(p);
		len = (size_t)(end - p);
		if (len)
			snprintf(full, sizeof(full), "%.*s/%s", (int)len, p,
				 prog);
		else
			snprintf(full, sizeof(full), "./%s", prog);
		if (access(full, X_OK) == 0)
			return true;
	}
	return false;
}

int pdx_load_plot_check(const char *png, char *err, size_t errlen)
{
	char dir[4096];
	const char *slash = strrchr(png, '/');
	struct stat st;

	if (!in_path(GNUPLOT)) {
		pdx_errbuf_set(err, errlen,
			       "--plot needs gnuplot, which is not in PATH "
			       "(Debian: apt-get install gnuplot-nox)");
		return -1;
	}
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == png)
		snprintf(dir, sizeof(dir), "/");
	else
		snprintf(dir, sizeof(dir), "%.*s", (int)(slash - png), png);
	if (stat(dir, &st) || !S_ISDIR(st.st_mode) || access(dir, W_OK)) {
		pdx_errbuf_set(err, errlen,
			       "--plot %s: %s is not a writable directory", png,
			       dir);
		return -1;
	}
	return 0;
}

void pdx_load_plot_cdf(FILE *f, const double *sorted, size_t n)
{
	size_t m = n < PDX_LOAD_PLOT_CDF_POINTS ? n : PDX_LOAD_PLOT_CDF_POINTS;
	size_t k, i;

	for (k = 0; k < m; k++) {
		i = m == 1 ? n - 1 : k * (n - 1) / (m - 1);
		fprintf(f, "%.6g %.6g\n", sorted[i] * 1e3,
			(double)(i + 1) / (double)n);
	}
}

double pdx_load_plot_bucket_s(double duration_s)
{
	return duration_s < 10.0 ? 0.1 : 1.0;
}

size_t pdx_load_plot_buckets(FILE *f, const struct pdx_load_result *res,
			     size_t n, double duration_s)
{
	double w = pdx_load_plot_bucket_s(duration_s), t;
	size_t nb = 0, i, j;
	long *tokens, *done, b;

	/* The last bucket is the one the run's end falls in. */
	if (duration_s > 0.0)
		nb = (size_t)floor(duration_s / w) + 1;
	if (!nb)
		return 0;
	tokens = calloc(nb, sizeof(*tokens));
	done = calloc(nb, sizeof(*done));
	if (!tokens || !done) {
		free(tokens);
		free(done);
		return 0;
	}
	for (i = 0; i < n; i++) {
		if (!res[i].success)
			continue;
		t = res[i].start + res[i].ttft;
		for (j = 0;; j++) {
			b = (long)floor(t / w);
			if (b >= 0 && (size_t)b < nb)
				tokens[b]++;
			if (j == res[i].n_itl)
				break;
			t += res[i].itl[j];
		}
		b = (long)floor((res[i].start + res[i].latency) / w);
		if (b >= 0 && (size_t)b < nb)
			done[b]++;
	}
	for (i = 0; i < nb; i++)
		fprintf(f, "%.6g %.6g %.6g\n", (double)i * w,
			(double)tokens[i] / w, (double)done[i] / w);
	free(tokens);
	free(done);
	return nb;
}

/* A gnuplot single-quoted string: a quote is doubled, control
 * characters become spaces. */
static void put_quoted(FILE *f, const char *s)
{
	fputc('\'', f);
	for (; *s; s++) {
		if (*s == '\'')
			fputs("''", f);
		else
			fputc((unsigned char)*s < ' ' ? ' ' : *s, f);
	}
	fputc('\'', f);
}

/* A panel without data: an empty frame that says so. */
static void no_data(FILE *f)
{
	fputs("set label 1 'no data' at graph 0.5, graph 0.5 center\n"
	      "plot [0:1] [0:1] NaN notitle\n"
	      "unset label 1\n",
	      f);
}

/* 'dir/file', quoted. */
static void put_path(FILE *f, const char *dir, const char *file)
{
	char path[4200];

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	put_quoted(f, path);
}

static void cdf_panel(FILE *f, const char *dir, const char *file,
		      const char *title, const char *xlabel, const char *ylabel,
		      size_t n, bool log_x, const char *color)
{
	fputs("set title ", f);
	put_quoted(f, title);
	fputs("\nset xlabel ", f);
	put_quoted(f, xlabel);
	fputs("\nset ylabel ", f);
	put_quoted(f, ylabel);
	fputs(log_x ? "\nset logscale x\nset xrange [*:*]"
		    : "\nunset logscale x\nset xrange [0:*]",
	      f);
	fputs("\nset yrange [0:1]\n", f);
	if (!n) {
		no_data(f);
		return;
	}
	fputs("plot ", f);
	put_path(f, dir, file);
	fprintf(f, " using 1:2 with steps lw 2 lc rgb '%s' title 'CDF'\n",
		color);
}

/* "TTFT of 12 requests: median 3.1 ms, p99 9 ms"; no numbers for none. */
static void stat_title(char *buf, size_t len, const char *what, size_t n,
		       const char *unit, double p50_ms, double p99_ms)
{
	if (n)
		snprintf(buf, len, "%s %zu %s: median %.4g ms, p99 %.4g ms",
			 what, n, unit, p50_ms, p99_ms);
	else
		snprintf(buf, len, "%s 0 %s", what, unit);
}

void pdx_load_plot_script(FILE *f, const struct pdx_load_plot_script_params *sp)
{
	char title[160];

	fputs("set terminal pngcairo size 1000,1200 noenhanced "
	      "font 'sans,10'\nset output ",
	      f);
	put_quoted(f, sp->png);
	fputs("\nset multiplot layout 3,1 title ", f);
	put_quoted(f, sp->title);
	fputs(" font ',12'\nset grid\nset key bottom right\n", f);

	stat_title(title, sizeof(title), "TTFT of", sp->n_ttft, "requests",
		   sp->ttft_p50_ms, sp->ttft_p99_ms);
	cdf_panel(f, sp->dir, "ttft.dat", title, "time to first token (ms)",
		  "fraction of requests", sp->n_ttft, sp->ttft_log, "#1f77b4");
	stat_title(title, sizeof(title), "ITL of", sp->n_itl,
		   "gaps between token chunks", sp->itl_p50_ms, sp->itl_p99_ms);
	cdf_panel(f, sp->dir, "itl.dat", title, "inter-token latency (ms)",
		  "fraction of gaps", sp->n_itl, sp->itl_log, "#ff7f0e");

	fprintf(f, "set title 'Throughput over the run, in %g s buckets'\n",
		sp->bucket_s);
	fputs("unset logscale x\n"
	      "set xlabel 'time since the start (s)'\n"
	      "set ylabel 'output tokens/s'\n"
	      "set y2label 'requests completed/s'\n"
	      "set xrange [0:*]\nset yrange [0:*]\nset y2range [0:*]\n"
	      "set ytics nomirror\nset y2tics\n"
	      "set key tmargin center horizontal\n"
	      "set offsets 0, 0, graph 0.1, 0\n"
	      "set style fill transparent solid 0.3 noborder\n",
	      f);
	fprintf(f, "set boxwidth %g\n", sp->bucket_s);
	if (sp->n_buckets) {
		fputs("plot ", f);
		put_path(f, sp->dir, "tput.dat");
		fprintf(f,
			" using ($1+%g):3 axes x1y2 with boxes "
			"lc rgb '#2ca02c' title 'requests completed/s', "
			"'' using ($1+%g):2 axes x1y1 with linespoints lw 2 "
			"pt 7 ps 0.5 lc rgb '#1f77b4' "
			"title 'output tokens/s'\n",
			sp->bucket_s / 2, sp->bucket_s / 2);
	} else {
		no_data(f);
	}
	fputs("unset multiplot\nset output\n", f);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Whether sorted values span orders of magnitude (a long tail): their
 * CDF then reads better on a log scale. */
static bool wide(const double *sorted, size_t n)
{
	return n > 1 && sorted[0] > 0.0 &&
	       sorted[n - 1] > 20.0 * pdx_load_percentile(sorted, n, 50);
}

/* ttft.dat, itl.dat and tput.dat in dir; the counts into sp. */
static int write_data(const char *dir, const struct pdx_load_result *res,
		      size_t n, double duration_s,
		      struct pdx_load_plot_script_params *sp)
{
	double *ttft = NULL, *itl = NULL;
	size_t n_itl = 0, i, j;
	char path[4200];
	FILE *f;
	int rc = -1;

	for (i = 0; i < n; i++)
		if (res[i].success)
			n_itl += res[i].n_itl;
	ttft = malloc((n + 1) * sizeof(*ttft));
	itl = malloc((n_itl + 1) * sizeof(*itl));
	if (!ttft || !itl)
		goto out;
	sp->n_ttft = sp->n_itl = 0;
	for (i = 0; i < n; i++) {
		if (!res[i].success)
			continue;
		ttft[sp->n_ttft++] = res[i].ttft;
		for (j = 0; j < res[i].n_itl; j++)
			itl[sp->n_itl++] = res[i].itl[j];
	}
	qsort(ttft, sp->n_ttft, sizeof(*ttft), cmp_double);
	qsort(itl, sp->n_itl, sizeof(*itl), cmp_double);
	sp->ttft_p50_ms = pdx_load_percentile(ttft, sp->n_ttft, 50) * 1e3;
	sp->ttft_p99_ms = pdx_load_percentile(ttft, sp->n_ttft, 99) * 1e3;
	sp->itl_p50_ms = pdx_load_percentile(itl, sp->n_itl, 50) * 1e3;
	sp->itl_p99_ms = pdx_load_percentile(itl, sp->n_itl, 99) * 1e3;
	sp->ttft_log = wide(ttft, sp->n_ttft);
	sp->itl_log = wide(itl, sp->n_itl);
	sp->bucket_s = pdx_load_plot_bucket_s(duration_s);
	snprintf(path, sizeof(path), "%s/ttft.dat", dir);
	f = fopen(path, "w");
	if (!f)
		goto out;
	pdx_load_plot_cdf(f, ttft, sp->n_ttft);
	if (fclose(f))
		goto out;
	snprintf(path, sizeof(path), "%s/itl.dat", dir);
	f = fopen(path, "w");
	if (!f)
		goto out;
	pdx_load_plot_cdf(f, itl, sp->n_itl);
	if (fclose(f))
		goto out;
	snprintf(path, sizeof(path), "%s/tput.dat", dir);
	f = fopen(path, "w");
	if (!f)
		goto out;
	sp->n_buckets = pdx_load_plot_buckets(f, res, n, duration_s);
	if (fclose(f))
		goto out;
	rc = 0;
out:
	free(ttft);
	free(itl);
	return rc;
}

/* The last non-empty line of gnuplot's stderr (its error), into err. */
static void gnuplot_error(const char *dir, int status, char *err, size_t errlen)
{
	char path[4200], line[512], last[512] = "";
	FILE *f;

	snprintf(path, sizeof(path), "%s/gnuplot.log", dir);
	f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		if (line[strspn(line, " \t^")])
			snprintf(last, sizeof(last), "%s", line);
	}
	if (f)
		fclose(f);
	if (WIFEXITED(status))
		pdx_errbuf_set(err, errlen, "gnuplot exited with %d: %s",
			       WEXITSTATUS(status), last);
	else
		pdx_errbuf_set(err, errlen, "gnuplot died (status %d): %s",
			       status, last);
}

/* Runs gnuplot on dir/plot.gp, stdout to /dev/null, stderr to
 * dir/gnuplot.log; returns its wait status, or -1 when it did not run. */
static int run_gnuplot(const char *dir)
{
	posix_spawn_file_actions_t fa;
	char script[4200], log[4200];
	char *argv[] = {GNUPLOT, script, NULL};
	pid_t pid;
	int status = -1, rc;

	snprintf(script, sizeof(script), "%s/plot.gp", dir);
	snprintf(log, sizeof(log), "%s/gnuplot.log", dir);
	if (posix_spawn_file_actions_init(&fa))
		return -1;
	posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null",
					 O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null",
					 O_WRONLY, 0);
	posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, log,
					 O_WRONLY | O_CREAT | O_TRUNC, 0600);
	rc = posix_spawnp(&pid, GNUPLOT, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc)
		return -1;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	return status;
}

static void remove_dir(const char *dir)
{
	char path[4200];
	size_t i;

	for (i = 0; i < sizeof(tmp_files) / sizeof(tmp_files[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, tmp_files[i]);
		unlink(path);
	}
	rmdir(dir);
}

int pdx_load_plot_write(const char *png, const char *title,
			const struct pdx_load_result *res, size_t n,
			double duration_s, char *err, size_t errlen)
{
	struct pdx_load_plot_script_params sp = {0};
	const char *tmp = getenv("TMPDIR");
	char dir[4096], path[4200];
	struct stat st;
	FILE *f;
	int status, rc = -1;

	snprintf(dir, sizeof(dir), "%s/pdx-bench-plot-XXXXXX",
		 tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir)) {
		pdx_errbuf_set(err, errlen, "cannot make a directory %s: %s",
			       dir, strerror(errno));
		return -1;
	}
	if (write_data(dir, res, n, duration_s, &sp)) {
		pdx_errbuf_set(err, errlen, "cannot write the data in %s", dir);
		goto out;
	}
	sp.png = png;
	sp.dir = dir;
	sp.title = title;
	snprintf(path, sizeof(path), "%s/plot.gp", dir);
	f = fopen(path, "w");
	if (!f) {
		pdx_errbuf_set(err, errlen, "%s: %s", path, strerror(errno));
		goto out;
	}
	pdx_load_plot_script(f, &sp);
	if (fclose(f)) {
		pdx_errbuf_set(err, errlen, "cannot write %s", path);
		goto out;
	}
	status = run_gnuplot(dir);
	if (status == -1) {
		pdx_errbuf_set(err, errlen, "cannot run " GNUPLOT);
		goto out;
	}
	if (status) {
		gnuplot_error(dir, status, err, errlen);
		goto out;
	}
	if (stat(png, &st) || st.st_size == 0) {
		pdx_errbuf_set(err, errlen, "gnuplot wrote no %s", png);
		goto out;
	}
	rc = 0;
out:
	remove_dir(dir);
	return rc;
}
