/* transport/ucx_ep.c with real UCX workers in two processes over shared
 * memory (no agent): two users of the endpoint to one peer worker share
 * it, and when the peer dies before its rendezvous message is read (a CMA
 * read of the peer's memory, as an agent reads a pushed layer), the user
 * still open hears it, after the first one made closed (UCX's error
 * handler was that first user's alone: the second heard nothing). */
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "tests/check.h"
#include "transport/ucx.h"

#define MSG_BYTES (1 << 20) /* past UCX's eager sizes: a rendezvous */
#define AM_ID 1
#define WAIT_NS 10000000000ULL

struct address {
	size_t len;
	uint8_t bytes[4096];
};

static void put_all(int fd, const void *p, size_t n)
{
	for (const char *c = p; n;) {
		ssize_t w = write(fd, c, n);

		if (w <= 0)
			_exit(3);
		c += w;
		n -= (size_t)w;
	}
}

static bool get_all(int fd, void *p, size_t n)
{
	for (char *c = p; n;) {
		ssize_t r = read(fd, c, n);

		if (r <= 0)
			return false;
		c += r;
		n -= (size_t)r;
	}
	return true;
}

static void sent(void *arg, pdx_status_t st)
{
	(void)arg;
	(void)st;
}

/* The peer: a worker that tells the parent its address, reads the
 * parent's, sends it two rendezvous messages of bytes i * 7 and
 * progresses until it is killed. */
static void peer(int in, int out)
{
	static struct address mine, theirs;
	static const char hdr[] = "msg";
	uint8_t *buf = malloc(MSG_BYTES);
	struct pdx_ucx_ep *ep;
	struct pdx_ucx *u;
	const void *addr;

	if (!buf || pdx_ucx_new(&u))
		_exit(2);
	pdx_ucx_address(u, &addr, &mine.len);
	if (mine.len > sizeof(mine.bytes))
		_exit(2);
	memcpy(mine.bytes, addr, mine.len);
	put_all(out, &mine, sizeof(mine));
	if (!get_all(in, &theirs, sizeof(theirs)) ||
	    pdx_ucx_ep_new(u, theirs.bytes, theirs.len, false, NULL, NULL, &ep))
		_exit(2);
	for (size_t i = 0; i < MSG_BYTES; i++)
		buf[i] = (uint8_t)(i * 7);
	for (int i = 0; i < 2; i++)
		if (pdx_ucx_am_send_rndv(ep, AM_ID, hdr, sizeof(hdr), buf,
					 MSG_BYTES, NULL, sent, NULL))
			_exit(2);
	for (;;) {
		pdx_ucx_progress(u, 0, 0);
		poll(NULL, 0, 1);
	}
}

struct inbox {
	void *desc[2];
	int n;
};

static void on_message(void *arg, const void *hdr, size_t hdr_len,
		       void *data, size_t len, bool rndv)
{
	struct inbox *in = arg;

	(void)hdr;
	(void)hdr_len;
	(void)len;
	if (rndv && in->n < 2)
		in->desc[in->n++] = data;
}

struct told {
	int n;
	pdx_status_t st;
};

static void on_error(void *arg, pdx_status_t st)
{
	struct told *t = arg;

	t->n++;
	t->st = st;
}

struct done {
	bool done;
	pdx_status_t st;
};

static void on_done(void *arg, pdx_status_t st)
{
	struct done *d = arg;

	d->done = true;
	d->st = st;
}

/* Progress until *flag is set, or WAIT_NS. */
static void progress_until(struct pdx_ucx *u, const bool *flag)
{
	uint64_t start = pdx_now_ns();

	while (!*flag && pdx_now_ns() - start < WAIT_NS) {
		pdx_ucx_progress(u, 0, 0);
		poll(NULL, 0, 1);
	}
}

int main(void)
{
	static struct address mine, theirs;
	struct told told1 = {0}, told2 = {0};
	struct done d1 = {0}, d2 = {0};
	uint8_t *dst = calloc(1, MSG_BYTES);
	struct pdx_ucx_ep *e1, *e2;
	struct inbox inbox = {0};
	int to_peer[2], from_peer[2], status;
	bool same = true, two = false, told = false;
	struct pdx_ucx *u;
	const void *addr;
	pid_t pid;

	/* shared memory, and CMA for the reads (a same-host agent's lanes) */
	setenv("UCX_TLS", "sm,self", 0);
	if (!dst || pipe(to_peer) || pipe(from_peer))
		return 1;
	pid = fork();
	if (pid == 0) {
		close(to_peer[1]);
		close(from_peer[0]);
		peer(to_peer[0], from_peer[1]);
	}
	close(to_peer[0]);
	close(from_peer[1]);
	CHECK_EQ(pdx_ucx_new(&u), PDX_OK);
	CHECK_EQ(pdx_ucx_am_handler(u, AM_ID, on_message, &inbox), PDX_OK);
	pdx_ucx_address(u, &addr, &mine.len);
	memcpy(mine.bytes, addr, mine.len);
	put_all(to_peer[1], &mine, sizeof(mine));
	if (!get_all(from_peer[0], &theirs, sizeof(theirs))) {
		CHECK_FAIL("the peer process did not start its worker");
		CHECK_DONE();
	}
	CHECK_EQ(pdx_ucx_ep_new(u, theirs.bytes, theirs.len, false, on_error,
				&told1, &e1), PDX_OK);
	CHECK_EQ(pdx_ucx_ep_new(u, theirs.bytes, theirs.len, false, on_error,
				&told2, &e2), PDX_OK);
	CHECK(pdx_ucx_ep_same(e1, e2),
	      "two users of a same-host peer worker share one endpoint");
	CHECK(!pdx_ucx_ep_reports_errors(e2),
	      "made without peer error handling (UCX 1.13 cannot close those)");

	for (uint64_t start = pdx_now_ns();
	     inbox.n < 2 && pdx_now_ns() - start < WAIT_NS;
	     poll(NULL, 0, 1))
		pdx_ucx_progress(u, 0, 0);
	two = inbox.n == 2;
	CHECK(two, "the peer's two rendezvous messages arrive");
	if (!two)
		CHECK_DONE();
	CHECK_EQ(pdx_ucx_am_recv(u, inbox.desc[0], dst, MSG_BYTES, on_done, &d1),
		 PDX_OK);
	progress_until(u, &d1.done);
	CHECK(d1.done && d1.st == PDX_OK, "the first is read from the live peer");
	for (size_t i = 0; i < MSG_BYTES; i++)
		same = same && dst[i] == (uint8_t)(i * 7);
	CHECK(same, "byte for byte");

	pdx_ucx_ep_close(e1); /* the first user made goes */
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	CHECK_EQ(pdx_ucx_am_recv(u, inbox.desc[1], dst, MSG_BYTES, on_done, &d2),
		 PDX_OK);
	progress_until(u, &d2.done);
	for (uint64_t start = pdx_now_ns();
	     !told2.n && pdx_now_ns() - start < WAIT_NS; poll(NULL, 0, 1))
		pdx_ucx_progress(u, 0, 0);
	CHECK(d2.done && d2.st != PDX_OK,
	      "the second, read after the peer was killed, fails (status %d)",
	      (int)d2.st);
	told = told2.n == 1 && told2.st != PDX_OK;
	CHECK(told, "the user still open is told the peer failed (told %d times, status %d)",
	      told2.n, (int)told2.st);
	CHECK_EQ(told1.n, 0, "the user that closed is not told");

	pdx_ucx_ep_close(e2);
	pdx_ucx_free(u);
	free(dst);
	CHECK_DONE();
}
