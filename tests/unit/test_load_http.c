/* pdx-bench's HTTP path without a real server: a refused connection and
 * a listener that never answers (the per-request timeout, the client
 * queue under --max-concurrency) both end as failed requests, never a
 * hang; and a one-thread server that answers slowly shows the rounds of
 * a multi-round session going one after the other. The rest of the
 * success path is tested against pdx-engine (e2e suite). */
#include "bench/load_http.h"
#include "tests/check.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
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

/* A server that answers n requests, one connection at a time, each
 * after 20 ms, with two token chunks, then closes the connection. */
struct slow_server {
	int fd, n;
};

static const char sse_reply[] =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    "Connection: close\r\n\r\n"
    "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
    "data: {\"choices\":[{\"text\":\"b\"}]}\n\n"
    "data: [DONE]\n\n";

/* Reads a request: headers, then Content-Length bytes of body. */
static void read_request(int c)
{
	char buf[4096], *end, *cl;
	size_t got = 0, want = 0;
	ssize_t k;

	while (got < sizeof(buf) - 1) {
		k = read(c, buf + got, sizeof(buf) - 1 - got);
		if (k <= 0)
			return;
		got += (size_t)k;
		buf[got] = '\0';
		end = strstr(buf, "\r\n\r\n");
		if (!end)
			continue;
		cl = strstr(buf, "Content-Length:");
		want = (size_t)(end + 4 - buf) +
		       (cl ? strtoul(cl + 15, NULL, 10) : 0);
		if (got >= want)
			return;
	}
}

static void *slow_serve(void *arg)
{
	struct slow_server *s = arg;
	struct timespec ms20 = {0, 20000000};
	int i, c;

	for (i = 0; i < s->n; i++) {
		c = accept(s->fd, NULL, NULL);
		if (c < 0)
			break;
		read_request(c);
		nanosleep(&ms20, NULL);
		if (write(c, sse_reply, strlen(sse_reply)) < 0)
			i = s->n;
		close(c);
	}
	return NULL;
}

/* Two users of three rounds, all arriving at 0: each round starts only
 * after the one before ended (timed from then: no client queue), while
 * the two users run side by side. */
static void test_sessions(void)
{
	struct pdx_load_run_params p;
	struct pdx_load_run_stats st;
	struct pdx_load_result res[6];
	struct slow_server srv = {.n = 6};
	bool follows[6] = {false, true, true, false, true, true};
	char *bodies[6], err[128];
	size_t lens[6], i;
	int plens[6], port;
	double arr[6];
	pthread_t th;

	srv.fd = loopback(true, &port);
	CHECK(srv.fd >= 0);
	CHECK_EQ(pthread_create(&th, NULL, slow_serve, &srv), 0);
	params(&p, port, 6, bodies, lens, plens, arr);
	p.follows = follows;
	p.timeout_s = 10.0;
	CHECK_EQ(pdx_load_run(&p, res, &st, err, sizeof(err)), 0);
	pthread_join(th, NULL);
	for (i = 0; i < 6; i++) {
		CHECK(res[i].success);
		CHECK(res[i].queue < 1e-3);
		if (follows[i])
			CHECK(res[i].start >=
			      res[i - 1].start + res[i - 1].latency);
	}
	CHECK(res[0].start < 0.01 && res[3].start < 0.01);
	CHECK(st.duration_s >= 6 * 0.02);
	for (i = 0; i < 6; i++)
		pdx_load_result_clear(&res[i]);
	close(srv.fd);
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

	test_sessions();
	CHECK_DONE();
}
