/* pdx-xferbench: KV transfer throughput and latency over the real path.
 *
 * The parent starts two pdx-agent processes and forks two synthetic engines
 * (prefill "P" and decode "D"). Each engine keeps a KV pool in POSIX shared
 * memory shaped like the model and registers it with its agent. Per
 * iteration the parent mints the transfer ids and picks the blocks (written
 * to a shared anonymous mapping both engines see), then drives the engines
 * with fixed-size commands over pipes:
 *
 *   P: FILL      write the pattern into the source blocks
 *   D: RECV      post pdx_engine_recv() for every transfer
 *   D: WAIT      collect the "received" events, then verify every byte
 *   P: SEND      post pdx_engine_send() for every transfer, then per layer
 *                (after --layer-ms of modeled compute) pdx_engine_layer_done()
 *                for all of them; collect the "sent" events
 *
 * Times are CLOCK_MONOTONIC, comparable between the processes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <pdx/engine.h>

#include "bench/pdx_bench.h"
#include "common/clock.h"
#include "common/log.h"

#define READY_TIMEOUT_MS 60000   /* pool creation + agent start + register */
#define EVENT_TIMEOUT_MS 60000   /* all events of one iteration */
#define ACK_TIMEOUT_MS 300000    /* a command, verification included */
#define QUIT_TIMEOUT_MS 5000

struct opts {
	const char *tls;
	const char *ucx_tls;
	const char *model_name;
	const struct pdx_model *model;
	uint32_t tokens;
	uint32_t skip_tokens;
	bool random_blocks;
	uint32_t concurrency;
	double layer_ms;
	uint32_t iters;
	bool json;
	char agent_bin[4096];
	const char *data_path;
	uint32_t xfer_timeout_ms;
	uint64_t seed;
};

/* What the parent and both engines share (a MAP_SHARED anonymous mapping
 * made before the fork, so the pointers are the same everywhere). */
struct plan {
	uint32_t conc;
	uint32_t nblocks;     /* blocks per transfer, skipped ones included */
	uint32_t skip_blocks; /* leading blocks D already holds */
	uint32_t skip_tokens;
	uint32_t pool_blocks;
	struct pdx_xfer_id *ids; /* [conc] */
	uint64_t *seeds;         /* [conc] */
	uint32_t *src;           /* [conc][nblocks], P's blocks */
	uint32_t *dst;           /* [conc][nblocks], D's blocks */
	uint64_t *t_send;        /* [conc] P: send posted */
	uint64_t *t_sent;        /* [conc] P: "sent" read */
	uint64_t *t_recv;        /* [conc] D: "received" read by the engine */
	uint64_t *t_recv_agent;  /* [conc] D: "received" emitted by its agent */
	uint64_t *t_first_ld;    /* P: first layer_done posted */
	uint64_t *t_last_ld;     /* P: last layer_done posted */
	uint64_t *ev_bytes;      /* [conc] D: bytes of the received event */
};

enum cmd_op { CMD_FILL = 1, CMD_RECV, CMD_WAIT, CMD_SEND, CMD_QUIT };

struct cmd {
	uint32_t op;
	int32_t iter;
	double layer_ms;
	char peer[PDX_ADDR_MAX];
};

struct ack {
	int32_t ok;
	uint32_t verified;
	char peer[PDX_ADDR_MAX];
	char reason[1024];
};

struct child {
	const char *role; /* "prefill", "decode" */
	char tag;         /* 'P', 'D' */
	pid_t pid;
	int cmd_fd;
	int ack_fd;
	char peer[PDX_ADDR_MAX];
	char shm_name[64];
	char engine[4200];
	struct pb_agent agent;
};

static struct opts o;
static struct plan plan;
static struct child kids[2]; /* 0: P, 1: D */

/* ---- small helpers ---- */

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void fail(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "pdx-xferbench: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	exit(1); /* the cleanup registry kills and unlinks at exit */
}

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int read_all(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t n = read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int xfer_index(const struct pdx_xfer_id *x)
{
	for (uint32_t c = 0; c < plan.conc; c++)
		if (!memcmp(plan.ids[c].b, x->b, sizeof(x->b)))
			return (int)c;
	return -1;
}

static uint64_t xfer_bytes(void)
{
	const struct pdx_model *m = o.model;

	return (uint64_t)(plan.nblocks - plan.skip_blocks) * m->layers *
	       m->tensors * m->block_tokens * m->kv_heads * m->head_dim *
	       m->dtype_bytes;
}

/* ---- the synthetic engines (children) ---- */

static struct pdx_engine *ch_eng;
static struct pdx_shm_pool ch_pool;

static void ch_ack(int fd, int ok, uint32_t verified, const char *peer,
		   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void ch_ack(int fd, int ok, uint32_t verified, const char *peer,
		   const char *fmt, ...)
{
	struct ack a;
	va_list ap;

	memset(&a, 0, sizeof(a));
	a.ok = ok;
	a.verified = verified;
	if (peer)
		snprintf(a.peer, sizeof(a.peer), "%s", peer);
	if (fmt) {
		va_start(ap, fmt);
		vsnprintf(a.reason, sizeof(a.reason), fmt, ap);
		va_end(ap);
	}
	if (write_all(fd, &a, sizeof(a)))
		_exit(1);
}

/* Collects one event of `want` kind for every transfer; returns 0, or -1
 * with the reason in err. */
static int ch_collect(enum pdx_event_kind want, uint64_t *times, char *err,
		      size_t errlen)
{
	uint64_t deadline = pdx_now_ns() + EVENT_TIMEOUT_MS * 1000000ULL;
	uint32_t got = 0;
	char *seen = calloc(plan.conc, 1);

	if (!seen) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	while (got < plan.conc) {
		struct pdx_engine_event ev;
		uint64_t now = pdx_now_ns();
		pdx_status_t st;
		char hex[33];
		int i;

		if (now >= deadline) {
			snprintf(err, errlen, "%u of %u %s events after %d s", got,
				 plan.conc, want == PDX_EVENT_SENT ? "sent" : "received",
				 EVENT_TIMEOUT_MS / 1000);
			free(seen);
			return -1;
		}
		st = pdx_engine_wait_event(ch_eng, (int)((deadline - now) / 1000000) + 1,
					   &ev);
		if (st == PDX_ETIMEDOUT)
			continue;
		if (st != PDX_OK) {
			snprintf(err, errlen, "waiting for events: %s",
				 pdx_status_str(st));
			free(seen);
			return -1;
		}
		now = pdx_now_ns();
		pdx_xfer_id_hex(&ev.xfer, hex);
		i = xfer_index(&ev.xfer);
		if (ev.kind == PDX_EVENT_FAILED) {
			snprintf(err, errlen, "transfer %s failed: %s (%s)", hex,
				 ev.reason, pdx_status_str(ev.status));
			free(seen);
			return -1;
		}
		if (i < 0 || ev.kind != want || seen[i]) {
			fprintf(stderr, "xferbench: unexpected %s event for %s, ignored\n",
				ev.kind == PDX_EVENT_SENT ? "sent" : "received", hex);
			continue;
		}
		seen[i] = 1;
		times[i] = now;
		if (want == PDX_EVENT_RECEIVED) {
			plan.ev_bytes[i] = ev.bytes;
			plan.t_recv_agent[i] = ev.t_last_ns;
		}
		got++;
	}
	free(seen);
	return 0;
}

static void ch_sleep_until(uint64_t t_ns)
{
	struct timespec ts = { (time_t)(t_ns / 1000000000ULL),
			       (long)(t_ns % 1000000000ULL) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static void ch_do(struct child *k, const struct cmd *c)
{
	uint32_t nb = plan.nblocks;
	char err[1024];
	pdx_status_t st;

	switch (c->op) {
	case CMD_FILL:
		for (uint32_t x = 0; x < plan.conc; x++)
			pb_fill(&ch_pool, plan.seeds[x], plan.src + (size_t)x * nb,
				nb, plan.skip_blocks);
		ch_ack(k->ack_fd, 1, 0, NULL, NULL);
		return;
	case CMD_RECV:
		for (uint32_t x = 0; x < plan.conc; x++) {
			st = pdx_engine_recv(ch_eng, &plan.ids[x], c->peer,
					     plan.dst + (size_t)x * nb, nb,
					     plan.skip_tokens);
			if (st != PDX_OK) {
				ch_ack(k->ack_fd, 0, 0, NULL, "pdx_engine_recv: %s",
				       pdx_status_str(st));
				return;
			}
		}
		ch_ack(k->ack_fd, 1, 0, NULL, NULL);
		return;
	case CMD_WAIT: {
		uint64_t want = xfer_bytes();
		bool bytes_warned = false;

		if (ch_collect(PDX_EVENT_RECEIVED, plan.t_recv, err, sizeof(err))) {
			ch_ack(k->ack_fd, 0, 0, NULL, "%s", err);
			return;
		}
		for (uint32_t x = 0; x < plan.conc; x++) {
			if (plan.ev_bytes[x] != want && !bytes_warned) {
				fprintf(stderr, "xferbench: received event says %" PRIu64
						" bytes, expected %" PRIu64 "\n",
					plan.ev_bytes[x], want);
				bytes_warned = true;
			}
			if (pb_verify(&ch_pool, plan.seeds[x],
				      plan.dst + (size_t)x * nb, nb,
				      plan.skip_blocks, err, sizeof(err))) {
				char hex[33];

				pdx_xfer_id_hex(&plan.ids[x], hex);
				ch_ack(k->ack_fd, 1, 0, NULL,
				       "iteration %d transfer %u (%s): %s", c->iter,
				       x, hex, err);
				return;
			}
		}
		ch_ack(k->ack_fd, 1, 1, NULL, NULL);
		return;
	}
	case CMD_SEND: {
		uint64_t start, layer_ns = (uint64_t)llround(c->layer_ms * 1e6);

		for (uint32_t x = 0; x < plan.conc; x++) {
			plan.t_send[x] = pdx_now_ns();
			st = pdx_engine_send(ch_eng, &plan.ids[x], c->peer,
					     plan.src + (size_t)x * nb, nb);
			if (st != PDX_OK) {
				ch_ack(k->ack_fd, 0, 0, NULL, "pdx_engine_send: %s",
				       pdx_status_str(st));
				return;
			}
		}
		start = pdx_now_ns();
		for (uint32_t l = 0; l < o.model->layers; l++) {
			if (layer_ns)
				ch_sleep_until(start + (l + 1) * layer_ns);
			if (l == 0)
				*plan.t_first_ld = pdx_now_ns();
			st = pdx_engine_layer_done(ch_eng, l, plan.ids, plan.conc);
			if (st != PDX_OK) {
				ch_ack(k->ack_fd, 0, 0, NULL,
				       "pdx_engine_layer_done(%u): %s", l,
				       pdx_status_str(st));
				return;
			}
		}
		*plan.t_last_ld = pdx_now_ns();
		if (ch_collect(PDX_EVENT_SENT, plan.t_sent, err, sizeof(err))) {
			ch_ack(k->ack_fd, 0, 0, NULL, "%s", err);
			return;
		}
		ch_ack(k->ack_fd, 1, 0, NULL, NULL);
		return;
	}
	default:
		ch_ack(k->ack_fd, 0, 0, NULL, "unknown command %u", c->op);
	}
}

static void __attribute__((noreturn)) child_main(struct child *k, pid_t parent)
{
	struct pdx_engine_params ep = { .agent = k->engine, .timeout_ms = 2000 };
	char peer[PDX_ADDR_MAX];
	char logp[32];
	pdx_status_t st;
	struct cmd c;

	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	signal(SIGHUP, SIG_DFL);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(1);
	snprintf(logp, sizeof(logp), "xb-%s", k->role);
	pdx_log_prefix(logp);
	if (pb_pool_create(&ch_pool, k->shm_name, o.model, plan.pool_blocks)) {
		ch_ack(k->ack_fd, 0, 0, NULL, "cannot create the KV pool");
		_exit(1);
	}
	st = pdx_engine_connect(&ep, &ch_eng);
	if (st != PDX_OK) {
		ch_ack(k->ack_fd, 0, 0, NULL, "pdx_engine_connect(%s): %s",
		       k->engine, pdx_status_str(st));
		_exit(1);
	}
	st = pb_register_retry(ch_eng, &ch_pool, peer, sizeof(peer), 10000, NULL);
	if (st != PDX_OK) {
		ch_ack(k->ack_fd, 0, 0, NULL, "register with the agent at %s: %s",
		       k->engine, pdx_status_str(st));
		_exit(1);
	}
	ch_ack(k->ack_fd, 1, 0, peer, NULL);
	while (read_all(k->cmd_fd, &c, sizeof(c)) == 0 && c.op != CMD_QUIT)
		ch_do(k, &c);
	pdx_engine_free(ch_eng);
	pb_pool_destroy(&ch_pool);
	_exit(0);
}

/* ---- the parent ---- */

static void check_alive(void)
{
	for (int i = 0; i < 2; i++) {
		struct child *k = &kids[i];
		int st;

		if (k->agent.pid && !pb_agent_alive(&k->agent))
			fail("the %s agent ended (wait status 0x%x)", k->role,
			     k->agent.status);
		if (k->pid > 0 && waitpid(k->pid, &st, WNOHANG) == k->pid) {
			pb_untrack_pid(k->pid);
			k->pid = 0;
			fail("the %s engine ended (wait status 0x%x)", k->role, st);
		}
	}
}

static void send_cmd(struct child *k, uint32_t op, int iter, double layer_ms,
		     const char *peer)
{
	struct cmd c;

	memset(&c, 0, sizeof(c));
	c.op = op;
	c.iter = iter;
	c.layer_ms = layer_ms;
	if (peer)
		snprintf(c.peer, sizeof(c.peer), "%s", peer);
	if (write_all(k->cmd_fd, &c, sizeof(c)))
		fail("cannot command the %s engine", k->role);
}

/* Waits for one ack from each of the n children in ks (at most 2). */
static void wait_acks(struct child **ks, int n, struct ack *acks, int timeout_ms,
		      const char *what)
{
	uint64_t deadline = pdx_now_ns() + (uint64_t)timeout_ms * 1000000ULL;
	bool got[2] = { false, false };
	int left = n;

	while (left) {
		struct pollfd pf[2];
		int np = 0, map[2];

		for (int i = 0; i < n; i++) {
			if (got[i])
				continue;
			pf[np].fd = ks[i]->ack_fd;
			pf[np].events = POLLIN;
			map[np++] = i;
		}
		if (pdx_now_ns() >= deadline)
			fail("%s: no answer from the %s engine in %d s", what,
			     ks[map[0]]->role, timeout_ms / 1000);
		if (poll(pf, (nfds_t)np, 100) < 0 && errno != EINTR)
			fail("poll: %s", strerror(errno));
		for (int j = 0; j < np; j++) {
			int i = map[j];

			if (!(pf[j].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			if (read_all(ks[i]->ack_fd, &acks[i], sizeof(acks[i]))) {
				check_alive();
				fail("%s: the %s engine went away", what,
				     ks[i]->role);
			}
			if (!acks[i].ok)
				fail("%s: %s engine: %s", what, ks[i]->role,
				     acks[i].reason);
			got[i] = true;
			left--;
		}
		if (left)
			check_alive();
	}
}

static void start_child(struct child *k)
{
	int cmd[2], ackp[2];
	pid_t parent = getpid();

	if (pipe2(cmd, O_CLOEXEC) || pipe2(ackp, O_CLOEXEC))
		fail("pipe: %s", strerror(errno));
	fflush(NULL);
	k->pid = fork();
	if (k->pid < 0)
		fail("fork: %s", strerror(errno));
	if (k->pid == 0) {
		for (int i = 0; i < 2; i++) {
			if (&kids[i] != k && kids[i].pid > 0) {
				close(kids[i].cmd_fd);
				close(kids[i].ack_fd);
			}
		}
		close(cmd[1]);
		close(ackp[0]);
		k->cmd_fd = cmd[0];
		k->ack_fd = ackp[1];
		child_main(k, parent);
	}
	pb_track_pid(k->pid);
	close(cmd[0]);
	close(ackp[1]);
	k->cmd_fd = cmd[1];
	k->ack_fd = ackp[0];
}

static void *shared_alloc(size_t *used, size_t n)
{
	static uint8_t *area;
	static size_t cap;
	void *p;

	if (!area) {
		cap = *used;
		area = mmap(NULL, cap, PROT_READ | PROT_WRITE,
			    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (area == MAP_FAILED)
			fail("mmap shared area: %s", strerror(errno));
		*used = 0;
		return NULL;
	}
	n = (n + 63) & ~(size_t)63;
	if (*used + n > cap)
		fail("shared area too small");
	p = area + *used;
	*used += n;
	return p;
}

static void plan_alloc(void)
{
	size_t c = plan.conc, nb = plan.nblocks;
	size_t need = 64 * 16 + c * (sizeof(struct pdx_xfer_id) + 6 * 8) +
		      2 * c * nb * 4 + 16 * 64;
	size_t used = need;

	shared_alloc(&used, 0);
	plan.ids = shared_alloc(&used, c * sizeof(*plan.ids));
	plan.seeds = shared_alloc(&used, c * 8);
	plan.src = shared_alloc(&used, c * nb * 4);
	plan.dst = shared_alloc(&used, c * nb * 4);
	plan.t_send = shared_alloc(&used, c * 8);
	plan.t_sent = shared_alloc(&used, c * 8);
	plan.t_recv = shared_alloc(&used, c * 8);
	plan.t_recv_agent = shared_alloc(&used, c * 8);
	plan.ev_bytes = shared_alloc(&used, c * 8);
	plan.t_first_ld = shared_alloc(&used, 8);
	plan.t_last_ld = shared_alloc(&used, 8);
}

/* ---- measurement ---- */

#define MAX_ITERS 10000

struct results {
	double *lat_ms;       /* per measured transfer */
	size_t n_lat;
	double wall_s;        /* sum over measured iterations */
	uint64_t bytes;       /* over measured iterations */
	uint64_t ops;         /* UCX operations over measured iterations */
	double layer_sum_ms;  /* layer_xfer samples */
	size_t layer_n;
	/* per measured iteration, reported as medians: one iteration that the
	 * shared machine delays says little about the overlap */
	double exposed_ms[MAX_ITERS];        /* to the decode agent's "received" */
	double engine_exposed_ms[MAX_ITERS]; /* to the decode engine reading it */
	size_t exposed_n;
	bool verified;
	uint32_t xfers;
	double memcpy_s;      /* the paired copy limit */
	uint64_t memcpy_bytes;
};

static struct results res = { .verified = true };
static uint64_t rng;

enum iter_kind { ITER_WARMUP, ITER_CALIBRATE, ITER_MEASURE };

/* The copy limit, paired with the transfers: before each measured
 * iteration, a plain single-threaded memcpy of the same bytes in pieces of
 * that iteration's op size between two pre-faulted buffers of one
 * transfer's size, so both figures see the same machine load. */
static void memcpy_pass(uint64_t bytes, uint64_t piece, uint32_t times,
			bool count)
{
	static uint8_t *a, *b;
	uint64_t t0;

	if (!a) {
		a = malloc(bytes);
		b = malloc(bytes);
		if (!a || !b)
			fail("cannot allocate the memcpy buffers");
		memset(a, 0x5a, bytes);
		memset(b, 0xa5, bytes); /* not 0: that could become calloc */
	}
	if (piece == 0 || piece > bytes)
		piece = bytes;
	t0 = pdx_now_ns();
	for (uint32_t i = 0; i < times; i++) {
		for (uint64_t off = 0; off < bytes; off += piece)
			memcpy(b + off, a + off,
			       piece < bytes - off ? piece : bytes - off);
		__asm__ volatile("" ::: "memory");
	}
	if (count) {
		res.memcpy_s += (double)(pdx_now_ns() - t0) / 1e9;
		res.memcpy_bytes += bytes * times;
	}
}

static void run_iter(int iter, enum iter_kind kind, double layer_ms)
{
	struct child *P = &kids[0], *D = &kids[1];
	struct child *both[2] = { P, D };
	struct ack acks[2];
	size_t total = (size_t)plan.conc * plan.nblocks;
	uint64_t first_send = UINT64_MAX, last_recv = 0, last_recv_agent = 0;
	const uint32_t layers = o.model->layers;

	for (uint32_t c = 0; c < plan.conc; c++) {
		if (pdx_xfer_id_random(&plan.ids[c]) != PDX_OK)
			fail("cannot draw a transfer id");
		plan.seeds[c] = pb_rand(&rng);
	}
	pb_pick_blocks(plan.src, total, plan.pool_blocks, o.random_blocks, &rng);
	pb_pick_blocks(plan.dst, total, plan.pool_blocks, o.random_blocks, &rng);

	/* before the recv is posted, so the copy limit never holds up a
	 * transfer; the warm-up warms the buffers */
	if (kind != ITER_CALIBRATE) {
		uint64_t ops = pb_runs(plan.src + plan.skip_blocks,
				       plan.dst + plan.skip_blocks,
				       plan.nblocks - plan.skip_blocks) *
			       layers * o.model->tensors;

		memcpy_pass(xfer_bytes(), ops ? xfer_bytes() / ops : 0, plan.conc,
			    kind == ITER_MEASURE);
	}
	send_cmd(P, CMD_FILL, iter, 0, NULL);
	wait_acks(&P, 1, acks, ACK_TIMEOUT_MS, "fill");
	send_cmd(D, CMD_RECV, iter, 0, P->peer);
	wait_acks(&D, 1, acks, ACK_TIMEOUT_MS, "recv");
	send_cmd(D, CMD_WAIT, iter, 0, NULL);
	send_cmd(P, CMD_SEND, iter, layer_ms, D->peer);
	wait_acks(both, 2, acks, ACK_TIMEOUT_MS, "transfer");

	if (!acks[1].verified) {
		fprintf(stderr, "pdx-xferbench: MISMATCH: %s\n", acks[1].reason);
		res.verified = false;
	}
	for (uint32_t c = 0; c < plan.conc; c++) {
		if (plan.t_send[c] < first_send)
			first_send = plan.t_send[c];
		if (plan.t_recv[c] > last_recv)
			last_recv = plan.t_recv[c];
		if (plan.t_recv_agent[c] > last_recv_agent)
			last_recv_agent = plan.t_recv_agent[c];
	}
	if (kind != ITER_WARMUP && layer_ms == 0) {
		for (uint32_t c = 0; c < plan.conc; c++) {
			res.layer_sum_ms += (double)(plan.t_recv[c] - *plan.t_first_ld) /
					    1e6 / layers;
			res.layer_n++;
		}
	}
	fprintf(stderr, "pdx-xferbench: %s %d: %u transfers, %.3f ms, exposed %.3f ms (engine %.3f)%s\n",
		kind == ITER_WARMUP ? "warm-up" :
		kind == ITER_CALIBRATE ? "layer calibration" : "iteration",
		iter, plan.conc, (double)(last_recv - first_send) / 1e6,
		((double)last_recv_agent - (double)*plan.t_last_ld) / 1e6,
		((double)last_recv - (double)*plan.t_last_ld) / 1e6,
		acks[1].verified ? "" : " (MISMATCH)");
	if (kind != ITER_MEASURE)
		return;
	for (uint32_t c = 0; c < plan.conc; c++) {
		const uint32_t *s = plan.src + (size_t)c * plan.nblocks;
		const uint32_t *d = plan.dst + (size_t)c * plan.nblocks;

		res.lat_ms[res.n_lat++] = (double)(plan.t_recv[c] - plan.t_send[c]) / 1e6;
		res.bytes += xfer_bytes();
		res.ops += pb_runs(s + plan.skip_blocks, d + plan.skip_blocks,
				   plan.nblocks - plan.skip_blocks) *
			   layers * o.model->tensors;
		res.xfers++;
	}
	res.wall_s += (double)(last_recv - first_send) / 1e9;
	if (res.exposed_n < MAX_ITERS) {
		res.exposed_ms[res.exposed_n] =
			((double)last_recv_agent - (double)*plan.t_last_ld) / 1e6;
		res.engine_exposed_ms[res.exposed_n] =
			((double)last_recv - (double)*plan.t_last_ld) / 1e6;
		res.exposed_n++;
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double percentile(double *v, size_t n, double p)
{
	size_t idx;

	if (!n)
		return 0;
	idx = (size_t)ceil(p * (double)n);
	if (idx > 0)
		idx--;
	if (idx >= n)
		idx = n - 1;
	return v[idx];
}

/* ---- options ---- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: pdx-xferbench [options]\n"
		"\n"
		"Moves synthetic KV caches between two pdx-agent processes through the\n"
		"engine API and reports throughput, latency and correctness.\n"
		"\n"
		"  --tls shm|tcp          UCX transports: sm,self or tcp,self (default shm)\n"
		"  --model NAME           %s (default llama3-8b)\n"
		"  --tokens N             prompt tokens per transfer (default 8192)\n"
		"  --skip-tokens N        tokens the decode side already holds (default 0)\n"
		"  --random-blocks        scattered block ids (default: contiguous)\n"
		"  --concurrency C        transfers per iteration (default 1)\n"
		"  --layer-ms X           modeled compute per layer, ms (default 0)\n"
		"  --iters K              measured iterations, after 1 warm-up (default 5)\n"
		"  --data-path auto|ipc|put|am  passed to the agents (default auto)\n"
		"  --xfer-timeout-ms N    passed to the agents (default: theirs)\n"
		"  --agent-bin PATH       pdx-agent (default: ../agent/pdx-agent beside\n"
		"                         this program)\n"
		"  --seed N               seed for block choice and data (default: random)\n"
		"  --json                 one JSON object on stdout, logs on stderr\n"
		"  --help                 this text\n"
		"\n"
		"Figures (JSON keys): gbps = payload bytes / summed wall time from the\n"
		"first send to the last \"received\"; memcpy_gbps = a single-thread\n"
		"memcpy of the same bytes in op_bytes pieces, run before each measured\n"
		"iteration; layer_xfer_ms = transfer time / layers with no compute;\n"
		"exposed_ms = median time from the last layer computed to the decode\n"
		"agent's \"received\" (engine_exposed_ms: to the engine reading it);\n"
		"p50_ms, p99_ms = send posted to \"received\" read, per transfer.\n",
		pdx_model_names());
}

static void __attribute__((noreturn)) bad(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "pdx-xferbench: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n(try --help)\n");
	exit(2);
}

static uint64_t parse_u64(const char *opt, const char *s, uint64_t lo,
			  uint64_t hi)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi)
		bad("%s: \"%s\" is not an integer in %" PRIu64 "..%" PRIu64, opt, s,
		    lo, hi);
	return v;
}

static void parse_opts(int argc, char **argv)
{
	enum {
		O_TLS = 256, O_MODEL, O_TOKENS, O_SKIP, O_RANDOM, O_CONC, O_LAYER,
		O_ITERS, O_JSON, O_BIN, O_DATA, O_XTMO, O_SEED, O_HELP
	};
	static const struct option lo[] = {
		{ "tls", required_argument, NULL, O_TLS },
		{ "model", required_argument, NULL, O_MODEL },
		{ "tokens", required_argument, NULL, O_TOKENS },
		{ "skip-tokens", required_argument, NULL, O_SKIP },
		{ "random-blocks", no_argument, NULL, O_RANDOM },
		{ "concurrency", required_argument, NULL, O_CONC },
		{ "layer-ms", required_argument, NULL, O_LAYER },
		{ "iters", required_argument, NULL, O_ITERS },
		{ "json", no_argument, NULL, O_JSON },
		{ "agent-bin", required_argument, NULL, O_BIN },
		{ "data-path", required_argument, NULL, O_DATA },
		{ "xfer-timeout-ms", required_argument, NULL, O_XTMO },
		{ "seed", required_argument, NULL, O_SEED },
		{ "help", no_argument, NULL, O_HELP },
		{ NULL, 0, NULL, 0 },
	};
	bool have_seed = false;
	int c;

	o.tls = "shm";
	o.model_name = "llama3-8b";
	o.tokens = 8192;
	o.concurrency = 1;
	o.iters = 5;
	o.data_path = "auto";
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":", lo, NULL)) != -1) {
		char *end;

		switch (c) {
		case O_TLS:
			o.tls = optarg;
			break;
		case O_MODEL:
			o.model_name = optarg;
			break;
		case O_TOKENS:
			o.tokens = (uint32_t)parse_u64("--tokens", optarg, 1,
						       1u << 22);
			break;
		case O_SKIP:
			o.skip_tokens = (uint32_t)parse_u64("--skip-tokens",
							    optarg, 0, 1u << 22);
			break;
		case O_RANDOM:
			o.random_blocks = true;
			break;
		case O_CONC:
			o.concurrency = (uint32_t)parse_u64("--concurrency",
							    optarg, 1, 4096);
			break;
		case O_LAYER:
			errno = 0;
			o.layer_ms = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(o.layer_ms >= 0) ||
			    o.layer_ms > 60000)
				bad("--layer-ms: \"%s\" is not a number of ms in 0..60000",
				    optarg);
			break;
		case O_ITERS:
			o.iters = (uint32_t)parse_u64("--iters", optarg, 1, MAX_ITERS);
			break;
		case O_JSON:
			o.json = true;
			break;
		case O_BIN:
			if (strlen(optarg) >= sizeof(o.agent_bin))
				bad("--agent-bin: path too long");
			snprintf(o.agent_bin, sizeof(o.agent_bin), "%s", optarg);
			break;
		case O_DATA:
			o.data_path = optarg;
			break;
		case O_XTMO:
			o.xfer_timeout_ms = (uint32_t)parse_u64(
				"--xfer-timeout-ms", optarg, 1, 86400000);
			break;
		case O_SEED:
			o.seed = parse_u64("--seed", optarg, 0, UINT64_MAX);
			have_seed = true;
			break;
		case O_HELP:
			usage(stdout);
			exit(0);
		case ':':
			bad("%s needs a value", argv[optind - 1]);
		default:
			bad("unknown option \"%s\"", argv[optind - 1]);
		}
	}
	if (optind < argc)
		bad("unexpected argument \"%s\"", argv[optind]);
	if (!strcmp(o.tls, "shm"))
		o.ucx_tls = "sm,self";
	else if (!strcmp(o.tls, "tcp"))
		o.ucx_tls = "tcp,self";
	else
		bad("--tls: \"%s\" is neither shm nor tcp", o.tls);
	o.model = pdx_model_find(o.model_name);
	if (!o.model)
		bad("--model: unknown model \"%s\" (known: %s)", o.model_name,
		    pdx_model_names());
	if (strcmp(o.data_path, "auto") && strcmp(o.data_path, "ipc") &&
	    strcmp(o.data_path, "put") && strcmp(o.data_path, "am"))
		bad("--data-path: \"%s\" is none of auto, ipc, put, am",
		    o.data_path);
	if (o.skip_tokens / o.model->block_tokens >=
	    (o.tokens + o.model->block_tokens - 1) / o.model->block_tokens)
		bad("--skip-tokens %u leaves no block of the %u tokens to move",
		    o.skip_tokens, o.tokens);
	if (!o.agent_bin[0] &&
	    pb_default_agent_bin(o.agent_bin, sizeof(o.agent_bin)))
		bad("cannot find pdx-agent beside this program; use --agent-bin");
	if (access(o.agent_bin, X_OK))
		bad("agent binary %s: %s", o.agent_bin, strerror(errno));
	if (!have_seed)
		o.seed = pdx_now_ns() ^ ((uint64_t)getpid() << 40);
}

/* ---- output ---- */

/* exposed_ms ends when the decode agent emits "received"; this one when the
 * decode engine read it, which adds the engine process's wake-up. */
static double engine_exposed(void)
{
	qsort(res.engine_exposed_ms, res.exposed_n, sizeof(double), cmp_double);
	return percentile(res.engine_exposed_ms, res.exposed_n, 0.50);
}

static void print_results(double gbps, double op_bytes, double p50, double p99,
			  double layer_xfer, double exposed, double mgbps)
{
	uint64_t bytes = xfer_bytes();

	if (o.json) {
		printf("{\"tls\": \"%s\", \"model\": \"%s\", \"tokens\": %u, "
		       "\"skip_tokens\": %u, \"concurrency\": %u, "
		       "\"random_blocks\": %s, \"layer_ms\": %g, \"iters\": %u, "
		       "\"data_path\": \"%s\", \"seed\": %" PRIu64 ", "
		       "\"gbps\": %.4f, \"bytes\": %" PRIu64 ", \"op_bytes\": %.1f, "
		       "\"xfers\": %u, \"p50_ms\": %.4f, \"p99_ms\": %.4f, "
		       "\"layer_xfer_ms\": %.4f, \"exposed_ms\": %.4f, "
		       "\"engine_exposed_ms\": %.4f, "
		       "\"verified\": %s, \"memcpy_gbps\": %.4f}\n",
		       o.tls, o.model->name, o.tokens, o.skip_tokens,
		       o.concurrency, o.random_blocks ? "true" : "false",
		       o.layer_ms, o.iters, o.data_path, o.seed, gbps, bytes,
		       op_bytes, res.xfers, p50, p99, layer_xfer, exposed,
		       engine_exposed(), res.verified ? "true" : "false", mgbps);
		fflush(stdout);
		return;
	}
	printf("pdx-xferbench: model %s, %u tokens%s, tls %s (UCX_TLS=%s), data path %s\n",
	       o.model->name, o.tokens, o.skip_tokens ? " (some held)" : "",
	       o.tls, o.ucx_tls, o.data_path);
	printf("  concurrency %u, %s blocks, layer compute %g ms, %u iterations\n\n",
	       o.concurrency, o.random_blocks ? "random" : "contiguous",
	       o.layer_ms, o.iters);
	printf("  %-22s %" PRIu64 " (%.2f MiB)\n", "bytes per transfer", bytes,
	       (double)bytes / 1048576.0);
	printf("  %-22s %.0f\n", "bytes per UCX op", op_bytes);
	printf("  %-22s %u\n", "transfers measured", res.xfers);
	printf("  %-22s %.3f GB/s\n", "throughput", gbps);
	printf("  %-22s %.3f GB/s\n", "memcpy (1 thread)", mgbps);
	printf("  %-22s %.3f ms\n", "latency p50", p50);
	printf("  %-22s %.3f ms\n", "latency p99", p99);
	printf("  %-22s %.4f ms\n", "per-layer transfer", layer_xfer);
	printf("  %-22s %.3f ms (engine read it after %.3f ms)\n",
	       "exposed after compute", exposed, engine_exposed());
	printf("  %-22s %s\n", "verified", res.verified ? "yes" : "NO");
	fflush(stdout);
}

int main(int argc, char **argv)
{
	struct ack acks[2];
	char dir[256], listen[64];
	uint64_t pool_bytes;
	struct statvfs sv;
	pid_t me = getpid();
	double gbps, op_bytes, p50, p99, layer_xfer, exposed, mgbps;
	int ports[2] = { -1, -1 };

	parse_opts(argc, argv);
	pdx_log_prefix("xferbench");

	plan.conc = o.concurrency;
	plan.nblocks = (o.tokens + o.model->block_tokens - 1) / o.model->block_tokens;
	plan.skip_tokens = o.skip_tokens;
	plan.skip_blocks = o.skip_tokens / o.model->block_tokens;
	plan.pool_blocks = plan.conc * plan.nblocks + 4;
	pool_bytes = (uint64_t)plan.pool_blocks * o.model->layers *
		     o.model->tensors * o.model->block_tokens *
		     o.model->kv_heads * o.model->head_dim * o.model->dtype_bytes;
	if (statvfs("/dev/shm", &sv) == 0 &&
	    (uint64_t)sv.f_bavail * sv.f_frsize < 2 * pool_bytes)
		fail("/dev/shm has %.2f GiB free; two pools need %.2f GiB",
		     (double)sv.f_bavail * sv.f_frsize / 1073741824.0,
		     2.0 * pool_bytes / 1073741824.0);
	rng = o.seed;
	res.lat_ms = calloc((size_t)o.iters * o.concurrency, sizeof(double));
	if (!res.lat_ms)
		fail("out of memory");

	pb_cleanup_install();
	plan_alloc();
	if (pb_tmpdir(dir, sizeof(dir)))
		fail("cannot make a temporary directory");

	kids[0].role = "prefill";
	kids[0].tag = 'P';
	kids[1].role = "decode";
	kids[1].tag = 'D';
	for (int i = 0; i < 2; i++) {
		struct child *k = &kids[i];
		struct pb_agent_opts ao = { 0 };
		char path[4200];

		for (int t = 0; t < 16 && (ports[i] < 0 ||
					    (i == 1 && ports[1] == ports[0]));
		     t++)
			ports[i] = pb_free_port("127.0.0.1");
		if (ports[i] < 0 || (i == 1 && ports[1] == ports[0]))
			fail("no free TCP port on 127.0.0.1");
		snprintf(k->shm_name, sizeof(k->shm_name), "/pdx-xb-%d-%c",
			 (int)me, k->tag);
		pb_track_shm(k->shm_name);
		snprintf(path, sizeof(path), "%s/%c.engine", dir,
			 k->tag == 'P' ? 'p' : 'd');
		pb_track_path(path);
		snprintf(k->engine, sizeof(k->engine), "ipc://%s", path);
		snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", ports[i]);
		ao.bin = o.agent_bin;
		ao.engine = k->engine;
		ao.listen = listen;
		ao.tls = o.ucx_tls;
		ao.data_path = o.data_path;
		ao.xfer_timeout_ms = o.xfer_timeout_ms;
		if (pb_agent_start(&k->agent, &ao))
			fail("cannot start the %s agent", k->role);
	}
	for (int i = 0; i < 2; i++)
		start_child(&kids[i]);
	{
		struct child *both[2] = { &kids[0], &kids[1] };

		wait_acks(both, 2, acks, READY_TIMEOUT_MS, "start");
	}
	for (int i = 0; i < 2; i++) {
		snprintf(kids[i].peer, sizeof(kids[i].peer), "%s", acks[i].peer);
		fprintf(stderr, "pdx-xferbench: %s engine registered; its agent is %s\n",
			kids[i].role, kids[i].peer);
	}

	run_iter(0, ITER_WARMUP, 0);
	if (o.layer_ms > 0)
		run_iter(0, ITER_CALIBRATE, 0);
	for (uint32_t i = 1; i <= o.iters; i++)
		run_iter((int)i, ITER_MEASURE, o.layer_ms);

	/* orderly stop: engines first, then agents */
	for (int i = 0; i < 2; i++)
		send_cmd(&kids[i], CMD_QUIT, 0, 0, NULL);
	for (int i = 0; i < 2; i++) {
		uint64_t deadline = pdx_now_ns() + QUIT_TIMEOUT_MS * 1000000ULL;
		struct child *k = &kids[i];

		while (k->pid > 0) {
			int st;

			if (waitpid(k->pid, &st, WNOHANG) == k->pid) {
				pb_untrack_pid(k->pid);
				k->pid = 0;
			} else if (pdx_now_ns() >= deadline) {
				kill(k->pid, SIGKILL);
			} else {
				usleep(10000);
			}
		}
		close(k->cmd_fd);
		close(k->ack_fd);
	}
	for (int i = 0; i < 2; i++)
		pb_agent_stop(&kids[i].agent);
	pb_tmpdir_remove(dir);

	gbps = res.wall_s > 0 ? (double)res.bytes / res.wall_s / 1e9 : 0;
	op_bytes = res.ops ? (double)res.bytes / (double)res.ops : 0;
	qsort(res.lat_ms, res.n_lat, sizeof(double), cmp_double);
	p50 = percentile(res.lat_ms, res.n_lat, 0.50);
	p99 = percentile(res.lat_ms, res.n_lat, 0.99);
	layer_xfer = res.layer_n ? res.layer_sum_ms / (double)res.layer_n : 0;
	qsort(res.exposed_ms, res.exposed_n, sizeof(double), cmp_double);
	exposed = percentile(res.exposed_ms, res.exposed_n, 0.50);
	mgbps = res.memcpy_s > 0 ? (double)res.memcpy_bytes / res.memcpy_s / 1e9 : 0;
	print_results(gbps, op_bytes, p50, p99, layer_xfer, exposed, mgbps);
	free(res.lat_ms);
	return res.verified ? 0 : 1;
}
