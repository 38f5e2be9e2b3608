/* Prometheus text exposition (see prom.h). */
#include "common/prom.h"

#include "common/version.h"

static const double prom_le[PDX_PROM_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
};

int pdx_prom_family(struct evbuffer *out, const char *name, const char *type,
		    const char *help)
{
	if (evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help,
				name, type) < 0)
		return -1;
	return 0;
}

int pdx_prom_sample(struct evbuffer *out, const char *name, const char *labels,
		    uint64_t v)
{
	if (evbuffer_add_printf(out, "%s%s%s%s %llu\n", name,
				*labels ? "{" : "", labels, *labels ? "}" : "",
				(unsigned long long)v) < 0)
		return -1;
	return 0;
}

int pdx_prom_build_info(struct evbuffer *out, const char *name,
			const char *labels)
{
	if (pdx_prom_family(out, name, "gauge",
			    "1; version: this build's, as --version says") ||
	    evbuffer_add_printf(out, "%s{version=\"%s\"%s} 1\n", name,
				pdx_version(), labels) < 0)
		return -1;
	return 0;
}

void pdx_prom_hist_observe(struct pdx_prom_hist *h, double seconds)
{
	h->count++;
	h->sum += seconds;
	for (int i = 0; i < PDX_PROM_BUCKETS; i++) {
		if (seconds <= prom_le[i]) {
			h->bucket[i]++;
			break;
		}
	}
}

int pdx_prom_hist_render(struct evbuffer *out, const char *name,
			 const char *labels, const struct pdx_prom_hist *h)
{
	const char *sep = *labels ? "," : "";
	const char *open = *labels ? "{" : "", *close = *labels ? "}" : "";
	uint64_t cum = 0;
	int bad = 0;

	for (int i = 0; i < PDX_PROM_BUCKETS; i++) {
		cum += h->bucket[i];
		bad |= evbuffer_add_printf(
			   out, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels,
			   sep, prom_le[i], (unsigned long long)cum) < 0;
	}
	bad |= evbuffer_add_printf(out,
				   "%s_bucket{%s%sle=\"+Inf\"} %llu\n"
				   "%s_sum%s%s%s %.9g\n%s_count%s%s%s %llu\n",
				   name, labels, sep,
				   (unsigned long long)h->count, name, open,
				   labels, close, h->sum, name, open, labels,
				   close, (unsigned long long)h->count) < 0;
	return bad ? -1 : 0;
}
