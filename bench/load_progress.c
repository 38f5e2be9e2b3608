#include "bench/load_progress.h"

#include <math.h>
#include <stdio.h>

#define BAR_WIDTH 20

void pdx_load_progress_time(double s, char *buf, size_t len)
{
	long t, h, m;

	if (!(s >= 0.0) || isinf(s) || s > 1e9) {
		snprintf(buf, len, "?");
		return;
	}
	t = (long)s;
	h = t / 3600;
	m = t / 60 % 60;
	if (h)
		snprintf(buf, len, "%ld:%02ld:%02ld", h, m, t % 60);
	else
		snprintf(buf, len, "%02ld:%02ld", m, t % 60);
}

int pdx_load_progress_format(char *buf, size_t len, size_t done, size_t total,
			     double elapsed_s)
{
	char bar[BAR_WIDTH + 1], el[32], left[32], rate[32];
	double r = elapsed_s > 0.0 ? (double)done / elapsed_s : 0.0;
	size_t fill, i, digits = 1, t;

	if (done > total)
		done = total;
	fill = total ? done * BAR_WIDTH / total : BAR_WIDTH;
	for (i = 0; i < BAR_WIDTH; i++)
		bar[i] = i < fill ? '#' : ' ';
	bar[BAR_WIDTH] = '\0';
	for (t = total; t >= 10; t /= 10)
		digits++;
	pdx_load_progress_time(elapsed_s, el, sizeof(el));
	if (done && r > 0.0) {
		pdx_load_progress_time((double)(total - done) / r, left,
				       sizeof(left));
		snprintf(rate, sizeof(rate), r >= 1.0 ? "%.1f" : "%.2f", r);
	} else {
		snprintf(left, sizeof(left), "?");
		snprintf(rate, sizeof(rate), "?");
	}
	return snprintf(buf, len, "%3d%%|%s| %*zu/%zu [%s<%s, %s req/s]",
			total ? (int)(done * 100 / total) : 100, bar,
			(int)digits, done, total, el, left, rate);
}
