/* free_race: pdx_engine_free() while the agent's side of the link goes
 * away at the same moment (every process of a deployment stopped at
 * once, as scripts/demo does). The link's monitor reports the disconnect
 * from ZeroMQ's I/O thread; freed in the wrong order the client closed
 * the monitor's reader first, the I/O thread then blocked for ever on
 * the monitor's send holding the monitor's lock, and free waited on that
 * lock: the engine hung at exit (seen once in ~35 demo runs). Here the
 * race is run many times with a scripted agent (a ROUTER in this
 * process); a hang is a failure by the alarm. Needs no pdx-agent.
 */
#include <signal.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include <pdx/engine.h>

#include "tests/check.h"

#define ROUNDS 400

static void hung(int sig)
{
	static const char msg[] = "FAIL pdx_engine_free hung (deadlock)\n";

	(void)sig;
	if (write(1, msg, sizeof(msg) - 1) < 0)
		_exit(2);
	_exit(1);
}

static void pause_us(long us)
{
	struct timespec ts = {0, us * 1000};

	nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
	char dir[] = "/tmp/pdx-free-race.XXXXXX", addr[256];
	void *ctx = zmq_ctx_new();
	int linger = 0;

	(void)argc, (void)argv;
	signal(SIGALRM, hung);
	alarm(60);
	CHECK(mkdtemp(dir) != NULL);
	snprintf(addr, sizeof(addr), "ipc://%s/agent", dir);
	for (int i = 0; i < ROUNDS; i++) {
		struct pdx_engine_params p = {.agent = addr};
		struct pdx_engine *e = NULL;
		void *router = zmq_socket(ctx, ZMQ_ROUTER);

		zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof(linger));
		if (zmq_bind(router, addr) != 0) {
			CHECK_FAIL("bind %s: %s", addr, zmq_strerror(errno));
			break;
		}
		if (pdx_engine_connect(&p, &e) != PDX_OK) {
			CHECK_FAIL("connect");
			break;
		}
		pause_us(300 + (i % 7) * 150); /* connected, handshake done */
		zmq_close(router);             /* the agent goes ... */
		pause_us((i % 5) * 20);        /* ... about when we free */
		pdx_engine_free(e);
	}
	CHECK(1, "the engine link is freed while its agent goes away, "
		 "%d times, without hanging", ROUNDS);
	zmq_ctx_term(ctx);
	/* a socket bound while the one before still closed: ZeroMQ's
	 * unlink of the path can come after the next bind, or never */
	unlink(addr + strlen("ipc://"));
	rmdir(dir);
	CHECK_DONE();
}
