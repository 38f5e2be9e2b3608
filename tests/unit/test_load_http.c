/* pdx-bench's HTTP path without a server: a refused connection and a
 * listener that never answers (the per-request timeout, the client
 * queue under --max-concurrency). Both end as failed requests, never a
 * hang. The success path awaits pdx-engine (e2e suite). */
#include "bench/load_http.h"
#include "tests/check.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* A bound loopback socket; listening when 'listen_it'. Returns the fd. */
static int loopback(bool listen_it, int *port)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) ||
	    getsockname(fd, (struct sockaddr *)&a, &len) ||
	    (listen_it && listen(fd, 64)))
		return -1;
	*port = ntohs(a.sin_port);
	return fd;
}

static char body[] = "{\"model\":\"m\",\"prompt\":\"a\",\"stream\":true}";

static void params(struct pdx_load_run_params *p, int port, size_t n,
		   char **bodies, size_t *lens, int *plens, double *arr)
{
	size_t i;

	memset(p, 0, sizeof(*p));
	for (i = 0; i < n; i++) {
		bodies[i] = body;
		lens[i] = strlen(body);
		plens[i] = 1;
		arr[i] = 0.0;
	}
	p->host = "127.0.0.1";
	p->port = port;
	p->path = "/v1/completions";
	p->bodies = bodies;
	p->body_lens = lens;
	p->prompt_lens = plens;
	p->arrivals = arr;
	p->n = n;
}

int main(void)
{
	struct pdx_load_run_params p;
	struct pdx_load_run_stats st;
	struct pdx_load_result res[4];
	char *bodies[4], err[128];
	size_t lens[4], i;
	int plens[4], port, fd;
	double arr[4];

	/* Refused: a port bound but not listening. */
	fd = loopback(false, &port);
	CHECK(fd >= 0);
	params(&p, port, 3, bodies, lens, plens, arr);
	CHECK_EQ(pdx_load_run(&p, res, &st, err, sizeof(err)), 0);
	for (i = 0; i < 3; i++) {
		CHECK(!res[i].success);
		CHECK(res[i].error && res[i].error[0]);
		pdx_load_result_clear(&res[i]);
	}
	CHECK(st.duration_s < 5.0);
	close(fd);

	/* Accepted by the kernel, never answered: each request times out
	 * 0.2 s after its intended send. With 2 slots, the last two wait
	 * for the first two (client queue ~0.2 s) and the run lasts ~0.4 s. */
	fd = loopback(true, &port);
	CHECK(fd >= 0);
	params(&p, port, 4, bodies, lens, plens, arr);
	p.timeout_s = 0.2;
	p.max_concurrency = 2;
	CHECK_EQ(pdx_load_run(&p, res, &st, err, sizeof(err)), 0);
	for (i = 0; i < 4; i++) {
		CHECK(!res[i].success);
		CHECK(res[i].error && strstr(res[i].error, "timed out"));
		CHECK(res[i].queue >= (i < 2 ? 0.0 : 0.19));
		CHECK(res[i].queue < (i < 2 ? 0.05 : 0.35));
		pdx_load_result_clear(&res[i]);
	}
	CHECK(st.duration_s >= 0.39 && st.duration_s < 2.0);
	close(fd);
	CHECK_DONE();
}
