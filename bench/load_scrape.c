#include "bench/load_scrape.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/load_http.h"

double pdx_load_prom_sum(const char *text, const char *name)
{
	size_t n = strlen(name);
	double sum = 0;
	const char *l;

	for (l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
		const char *v = l + n;

		if (strncmp(l, name, n) != 0 || (*v != ' ' && *v != '{'))
			continue;
		if (*v == '{') {
			v = strchr(v, '}');
			if (!v)
				continue;
			v++;
		}
		sum += strtod(v, NULL);
	}
	return sum;
}

int pdx_load_scrape_prefix(const char *hostport, struct pdx_load_prefix *acc,
			   char *err, size_t errlen)
{
	char host[256], *body = NULL;
	const char *colon = strrchr(hostport, ':');
	int port, status;

	if (!colon || colon == hostport ||
	    (size_t)(colon - hostport) >= sizeof(host) ||
	    (port = atoi(colon + 1)) <= 0 || port > 65535) {
		snprintf(err, errlen,
			 "--engine-metrics: want HOST:PORT, got '%s'",
			 hostport);
		return -1;
	}
	memcpy(host, hostport, (size_t)(colon - hostport));
	host[colon - hostport] = '\0';
	if (pdx_load_http_get(host, port, "/metrics", 10, &body, &status) ||
	    status != 200) {
		snprintf(err, errlen, "engine metrics at %s: %s", hostport,
			 body ? "not HTTP 200" : "cannot connect");
		free(body);
		return -1;
	}
	acc->hit_tokens +=
	    pdx_load_prom_sum(body, "pdx_engine_prefix_hit_tokens_total");
	acc->hit_bytes +=
	    pdx_load_prom_sum(body, "pdx_engine_prefix_hit_bytes_total");
	acc->query_tokens +=
	    pdx_load_prom_sum(body, "pdx_engine_prefix_query_tokens_total");
	free(body);
	return 0;
}
