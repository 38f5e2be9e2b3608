/* pdx-xferbench: KV transfer throughput and latency over the real path.
 *
 * The parent starts two pdx-agent processes and forks two synthetic engines
 * (prefill "P" and decode "D"). Each engine keeps a KV pool shaped like the
 * model, in POSIX shared memory or (--mem cuda) in GPU memory, and
 * registers it with its agent. Per iteration the parent mints the transfer
 * ids and picks the blocks (written to a shared anonymous mapping both
 * engines see), then drives the engines with fixed-size commands over
 * pipes:
 *
 *   P: FILL      write the pattern into the source blocks
 *   D: RECV      post pdx_engine_recv() for every transfer
 *   D: WAIT      collect the "received" events, then verify every byte
 *   P: SEND      post pdx_engine_send() for every transfer, then per layer
 *                (after --layer-ms of modeled compute) pdx_engine_layer_done()
 *                for all of them; collect the "sent" events
 *
 * On a GPU the pattern is written and checked by kernels (bench/xfer_cuda.h)
 * and a layer is done when its CUDA event is recorded; P also measures the
 * device's own copy rates (YARD), the yardsticks of the transfer.
 *
 * The agents' logs are read back through files and copied to stderr, to
 * report the data path each chose. Times are CLOCK_MONOTONIC, comparable
 * between the processes.
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
#include "bench/xfer_ctl.h"
#include "bench/xfer_cuda.h"
#include "common/clock.h"
#include "common/log.h"

#define READY_TIMEOUT_MS 60000   /* pool creation + agent start + register */
#define EVENT_TIMEOUT_MS 60000   /* all events of one iteration */
#define ACK_TIMEOUT_MS 300000    /* a command, verification included */
#define QUIT_TIMEOUT_MS 5000
#define EVENT_SLOTS 4            /* the engines' CUDA event ring */
#define YARD_REPS 9              /* timed copies per GPU yardstick */
#define ONE_BLOCK_WARMUP 10      /* --one-block: transfers not counted */
#define ONE_BLOCK_LAYER_MS 0.1   /* its layers this far apart, unless
				  * --layer-ms says */
#define PING_TIMEOUT_MS 5000

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
	bool pull;            /* the decode agent reads (pdx_engine_recv_opts) */
	uint32_t xfer_timeout_ms;
	uint64_t seed;
	bool cuda;            /* --mem cuda[:DEVICE] */
	int cuda_dev;
	int decode_dev;       /* --decode-device, default cuda_dev */
	char mem[24];         /* "shm", "cuda:N" or "cuda:P,D", as reported */
	uint32_t one_block;   /* --one-block N: one-block transfers measured */
	const char *versus;   /* --versus WHAT, or NULL */
};

/* What a transfer asks of the engines beyond its blocks, set by the parent
 * before each iteration: the part of the run --versus varies. A variant
 * that needs other agents (tensor parallelism) would add its own agents per
 * arm instead; these only change what the same two engines post. */
struct shape {
	/* transfers at once and blocks of each, skipped ones included: the
	 * run's, or 1 and 1 for --one-block's */
	uint32_t conc, nblocks;
	uint32_t skip_tokens;
	uint32_t skip_blocks; /* leading blocks D already holds */
	bool pull;            /* the decode agent reads (pdx_engine_recv_opts) */
};

/* What the parent and both engines share (a MAP_SHARED anonymous mapping
 * made before the fork, so the pointers are the same everywhere). */
struct plan {
	uint32_t conc, nblocks; /* the run's: the arrays' dimensions */
	struct shape *shape;    /* this iteration's */
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

enum cmd_op {
	CMD_FILL = 1, CMD_RECV, CMD_WAIT, CMD_SEND, CMD_YARD, CMD_PING, CMD_QUIT
};

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
	char gpu[128];        /* --mem cuda: the device's name */
	double d2d_gbps;      /* YARD */
	double d2h_gbps;
	uint64_t rtt_ns;      /* PING */
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
	int log_fd;           /* the agent's log, read back; 0: none */
	char logline[1024];   /* the line being read */
	size_t loglen;
	char data_by[128];    /* its "data by" for the other agent */
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
	for (uint32_t c = 0; c < plan.shape->conc; c++)
		if (!memcmp(plan.ids[c].b, x->b, sizeof(x->b)))
			return (int)c;
	return -1;
}

/* The payload of one transfer of that shape. */
static uint64_t shape_bytes(const struct shape *sh)
{
	const struct pdx_model *m = o.model;

	return (uint64_t)(plan.shape->nblocks - sh->skip_blocks) * m->layers *
	       m->tensors * m->block_tokens * m->kv_heads * m->head_dim *
	       m->dtype_bytes;
}

/* ... of this iteration's */
static uint64_t xfer_bytes(void)
{
	return shape_bytes(plan.shape);
}

/* ---- the synthetic engines (children) ---- */

static struct pdx_engine *ch_eng;
static struct pdx_shm_pool ch_pool;
static struct xb_cuda_pool *ch_gpu; /* --mem cuda: the pool instead */
static uint32_t ch_sends;           /* SENDs so far: picks the event slot */
static struct xc_ping *ch_ping;     /* PING: our own socket to our agent */

static void ch_ack_send(int fd, struct ack *a)
{
	if (ch_gpu)
		snprintf(a->gpu, sizeof(a->gpu), "%s", xb_cuda_pool_device(ch_gpu));
	if (write_all(fd, a, sizeof(*a)))
		_exit(1);
}

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
	ch_ack_send(fd, &a);
}

/* Collects one event of `want` kind for every transfer; returns 0, or -1
 * with the reason in err. */
static int ch_collect(enum pdx_event_kind want, uint64_t *times, char *err,
		      size_t errlen)
{
	uint64_t deadline = pdx_now_ns() + EVENT_TIMEOUT_MS * 1000000ULL;
	uint32_t got = 0;
	char *seen = calloc(plan.shape->conc, 1);

	if (!seen) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	while (got < plan.shape->conc) {
		struct pdx_engine_event ev;
		uint64_t now = pdx_now_ns();
		pdx_status_t st;
		char hex[33];
		int i;

		if (now >= deadline) {
			snprintf(err, errlen, "%u of %u %s events after %d s", got,
				 plan.shape->conc, want == PDX_EVENT_SENT ? "sent" : "received",
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

/* P: the source blocks. On a GPU with modeled compute the blocks get the
 * pattern of another seed here (the stale KV of an earlier request) and
 * SEND's per-layer "compute" writes the real one: a data path that reads a
 * layer before its event fired then shows as a mismatch. Without compute
 * the real pattern is written here and SEND only records the events. */
static int ch_fill(double layer_ms, char *err, size_t errlen)
{
	uint32_t nb = plan.shape->nblocks;

	for (uint32_t x = 0; x < plan.shape->conc; x++) {
		const uint32_t *b = plan.src + (size_t)x * nb;
		uint64_t seed = plan.seeds[x];

		if (!ch_gpu) {
			pb_fill(&ch_pool, seed, b, nb, plan.shape->skip_blocks);
			continue;
		}
		if (layer_ms > 0)
			seed = ~seed;
		for (uint32_t l = 0; l < o.model->layers; l++)
			if (xb_cuda_fill_layer(ch_gpu, l, seed, b, nb,
					       plan.shape->skip_blocks, err,
					       errlen))
				return -1;
	}
	/* done before the ack, so no fill runs into SEND's timings */
	return ch_gpu ? xb_cuda_sync(ch_gpu, err, errlen) : 0;
}

/* P on a GPU with modeled compute: queues layer l's real bytes of every
 * transfer on the compute stream. */
static int ch_compute_layer(uint32_t l, char *err, size_t errlen)
{
	uint32_t nb = plan.shape->nblocks;

	for (uint32_t x = 0; x < plan.shape->conc; x++)
		if (xb_cuda_fill_layer(ch_gpu, l, plan.seeds[x],
				       plan.src + (size_t)x * nb, nb,
				       plan.shape->skip_blocks, err, errlen))
			return -1;
	return 0;
}

/* P: layer l is computed. On a GPU its event is recorded on the compute
 * stream, behind the layer's kernels, and the agent waits for it there:
 * nothing here waits for the GPU. */
static int ch_layer_done(uint32_t l, uint32_t slot, char *err, size_t errlen)
{
	pdx_status_t st;

	if (ch_gpu && xb_cuda_record(ch_gpu, slot, l, err, errlen))
		return -1;
	if (ch_gpu)
		st = pdx_engine_layer_done_slot(ch_eng, l, slot, plan.ids,
						plan.shape->conc);
	else
		st = pdx_engine_layer_done(ch_eng, l, plan.ids, plan.shape->conc);
	if (st != PDX_OK) {
		snprintf(err, errlen, "pdx_engine_layer_done%s(%u): %s",
			 ch_gpu ? "_slot" : "", l, pdx_status_str(st));
		return -1;
	}
	return 0;
}

/* D: transfer x's blocks against P's pattern. 0: all bytes match; 1: the
 * first difference in err; -1: the check itself failed. */
static int ch_verify(uint32_t x, char *err, size_t errlen)
{
	uint32_t nb = plan.shape->nblocks;
	const uint32_t *dst = plan.dst + (size_t)x * nb;

	if (ch_gpu)
		return xb_cuda_verify(ch_gpu, plan.seeds[x],
				      plan.src + (size_t)x * nb, dst, nb,
				      plan.shape->skip_blocks, err, errlen);
	return pb_verify(&ch_pool, plan.seeds[x], dst, nb,
			 plan.shape->skip_blocks, err, errlen) ? 1 : 0;
}

/* P on a GPU: the device's copy rates for one transfer's bytes. */
static void ch_yardsticks(struct child *k)
{
	struct ack a;
	char err[1024];

	memset(&a, 0, sizeof(a));
	if (!ch_gpu) {
		ch_ack(k->ack_fd, 0, 0, NULL, "yardsticks need --mem cuda");
		return;
	}
	if (xb_cuda_yardsticks(ch_gpu, xfer_bytes(), YARD_REPS, &a.d2d_gbps,
			       &a.d2h_gbps, err, sizeof(err))) {
		ch_ack(k->ack_fd, 0, 0, NULL, "%s", err);
		return;
	}
	a.ok = 1;
	ch_ack_send(k->ack_fd, &a);
}

/* The yardstick of --one-block: a bare round trip over our agent's engine
 * link, through its loop, on a socket of our own beside the engine's,
 * after idle_ms of quiet: a transfer's hops wake threads (and, in a VM,
 * CPUs) that slept as long, which costs more than waking warm ones. */
static void ch_ping_once(struct child *k, double idle_ms)
{
	struct ack a;
	char err[512];

	memset(&a, 0, sizeof(a));
	ch_sleep_until(pdx_now_ns() + (uint64_t)llround(idle_ms * 1e6));
	if (!ch_ping)
		ch_ping = xc_ping_open(k->engine, err, sizeof(err));
	if (!ch_ping || xc_ping(ch_ping, PING_TIMEOUT_MS, &a.rtt_ns, err,
				sizeof(err))) {
		ch_ack(k->ack_fd, 0, 0, NULL, "ping: %s", err);
		return;
	}
	a.ok = 1;
	ch_ack_send(k->ack_fd, &a);
}

static void ch_do(struct child *k, const struct cmd *c)
{
	uint32_t nb = plan.shape->nblocks;
	char err[1024];
	pdx_status_t st;

	switch (c->op) {
	case CMD_FILL:
		if (ch_fill(c->layer_ms, err, sizeof(err))) {
			ch_ack(k->ack_fd, 0, 0, NULL, "fill: %s", err);
			return;
		}
		ch_ack(k->ack_fd, 1, 0, NULL, NULL);
		return;
	case CMD_RECV:
		for (uint32_t x = 0; x < plan.shape->conc; x++) {
			struct pdx_recv_opts ro = {
				.skip_tokens = plan.shape->skip_tokens,
				.mode = plan.shape->pull ? PDX_XFER_PULL :
							   PDX_XFER_PUSH,
			};

			st = pdx_engine_recv_opts(ch_eng, &plan.ids[x], c->peer,
						  plan.dst + (size_t)x * nb, nb,
						  &ro);
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
		for (uint32_t x = 0; x < plan.shape->conc; x++) {
			int rc;

			if (plan.ev_bytes[x] != want && !bytes_warned) {
				fprintf(stderr, "xferbench: received event says %" PRIu64
						" bytes, expected %" PRIu64 "\n",
					plan.ev_bytes[x], want);
				bytes_warned = true;
			}
			rc = ch_verify(x, err, sizeof(err));
			if (rc < 0) {
				ch_ack(k->ack_fd, 0, 0, NULL, "verify: %s", err);
				return;
			}
			if (rc) {
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
		uint32_t slot = ch_sends++ % EVENT_SLOTS;

		for (uint32_t x = 0; x < plan.shape->conc; x++) {
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
			/* the kernels run inside the layer's compute time */
			if (ch_gpu && layer_ns &&
			    ch_compute_layer(l, err, sizeof(err))) {
				ch_ack(k->ack_fd, 0, 0, NULL, "compute: %s", err);
				return;
			}
			if (layer_ns)
				ch_sleep_until(start + (l + 1) * layer_ns);
			if (l == 0)
				*plan.t_first_ld = pdx_now_ns();
			if (l == o.model->layers - 1)
				*plan.t_last_ld = pdx_now_ns();
			if (ch_layer_done(l, slot, err, sizeof(err))) {
				ch_ack(k->ack_fd, 0, 0, NULL, "%s", err);
				return;
			}
		}
		if (ch_collect(PDX_EVENT_SENT, plan.t_sent, err, sizeof(err))) {
			ch_ack(k->ack_fd, 0, 0, NULL, "%s", err);
			return;
		}
		ch_ack(k->ack_fd, 1, 0, NULL, NULL);
		return;
	}
	case CMD_YARD:
		ch_yardsticks(k);
		return;
	case CMD_PING:
		ch_ping_once(k, c->layer_ms);
		return;
	default:
		ch_ack(k->ack_fd, 0, 0, NULL, "unknown command %u", c->op);
	}
}

/* The KV pool, registered with the agent; our peer address in peer. */
static int ch_pool_register(struct child *k, char *peer, size_t peer_len)
{
	char err[512];
	pdx_status_t st;

	if (!o.cuda && pb_pool_create(&ch_pool, k->shm_name, o.model,
				      plan.pool_blocks)) {
		ch_ack(k->ack_fd, 0, 0, NULL, "cannot create the KV pool");
		return -1;
	}
	if (o.cuda && xb_cuda_pool_new(k->tag == 'D' ? o.decode_dev : o.cuda_dev,
				       o.model, plan.pool_blocks, EVENT_SLOTS,
				       &ch_gpu, err, sizeof(err))) {
		ch_ack(k->ack_fd, 0, 0, NULL, "GPU KV pool on device %d: %s",
		       k->tag == 'D' ? o.decode_dev : o.cuda_dev, err);
		return -1;
	}
	/* an agent opening CUDA IPC handles answers slower than one mapping
	 * shared memory: give it the whole start-up budget */
	if (ch_gpu)
		st = pb_register_regions_retry(
			ch_eng, xb_cuda_pool_layout(ch_gpu),
			xb_cuda_pool_region(ch_gpu), 1,
			xb_cuda_pool_events(ch_gpu), peer, peer_len,
			READY_TIMEOUT_MS / 2, NULL);
	else
		st = pb_register_retry(ch_eng, &ch_pool, peer, peer_len, 10000,
				       NULL);
	if (st != PDX_OK) {
		ch_ack(k->ack_fd, 0, 0, NULL, "register with the agent at %s: %s",
		       k->engine, pdx_status_str(st));
		return -1;
	}
	return 0;
}

static void __attribute__((noreturn)) child_main(struct child *k, pid_t parent)
{
	struct pdx_engine_params ep = { .agent = k->engine,
					.timeout_ms = o.cuda ? 10000 : 2000 };
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
	st = pdx_engine_connect(&ep, &ch_eng);
	if (st != PDX_OK) {
		ch_ack(k->ack_fd, 0, 0, NULL, "pdx_engine_connect(%s): %s",
		       k->engine, pdx_status_str(st));
		_exit(1);
	}
	if (ch_pool_register(k, peer, sizeof(peer))) {
		pb_pool_destroy(&ch_pool);
		_exit(1);
	}
	ch_ack(k->ack_fd, 1, 0, peer, NULL);
	while (read_all(k->cmd_fd, &c, sizeof(c)) == 0 && c.op != CMD_QUIT)
		ch_do(k, &c);
	xc_ping_close(ch_ping);
	pdx_engine_free(ch_eng);
	xb_cuda_pool_free(ch_gpu);
	pb_pool_destroy(&ch_pool);
	_exit(0);
}

/* ---- the parent ---- */

static void ob_trace(const char *line);

/* One line of an agent's log, copied to our stderr unless it is a trace
 * line (--one-block reads those). peer.c says which path it moves data
 * by as "peer ADDR ready: ..., data by PATH". */
static void agent_log_line(struct child *k)
{
	static const char by[] = ", data by ";
	const char *r = strstr(k->logline, " ready: ");
	const char *d = r ? strstr(r, by) : NULL;

	if (d)
		snprintf(k->data_by, sizeof(k->data_by), "%s", d + strlen(by));
	if (strstr(k->logline, " trace: ")) {
		ob_trace(k->logline);
		return;
	}
	k->logline[k->loglen++] = '\n';
	write_all(2, k->logline, k->loglen);
}

/* Copies what the agents logged since the last call to our stderr, line
 * by line, noting their data paths. Also the cleanup hook: a failed run
 * still shows the agents' last words. */
static void agent_logs_drain(void)
{
	char buf[4096];

	for (int i = 0; i < 2; i++) {
		struct child *k = &kids[i];

		while (k->log_fd > 0) {
			ssize_t n = read(k->log_fd, buf, sizeof(buf));

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				break;
			for (ssize_t j = 0; j < n; j++) {
				if (buf[j] != '\n')
					k->logline[k->loglen++] = buf[j];
				/* room for the newline and the NUL */
				if (buf[j] == '\n' ||
				    k->loglen == sizeof(k->logline) - 2) {
					k->logline[k->loglen] = '\0';
					agent_log_line(k);
					k->loglen = 0;
				}
			}
		}
	}
}

/* The agent logs to a file that is unlinked at once (nothing to clean up)
 * and that we read back through a second descriptor. Returns the agent's
 * end. */
static int agent_log_open(struct child *k, const char *dir)
{
	char path[512];
	int wfd;

	snprintf(path, sizeof(path), "%s/%c.log", dir, k->tag == 'P' ? 'p' : 'd');
	wfd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0600);
	if (wfd < 0)
		fail("agent log %s: %s", path, strerror(errno));
	k->log_fd = open(path, O_RDONLY | O_CLOEXEC);
	if (k->log_fd < 0)
		fail("agent log %s: %s", path, strerror(errno));
	unlink(path);
	return wfd;
}

/* --mem cuda: whether the device is there, asked in a child that exits,
 * so that this process, which forks the engines later, never initialises
 * CUDA (it does not survive fork()). No device: exit XB_CUDA_SKIP. */
static void cuda_probe(void)
{
	char err[512];
	pid_t pid;
	int st;

	fflush(NULL);
	pid = fork();
	if (pid < 0)
		fail("fork: %s", strerror(errno));
	if (pid == 0) {
		int rc = xb_cuda_probe(o.cuda_dev, err, sizeof(err));

		if (!rc && o.decode_dev != o.cuda_dev)
			rc = xb_cuda_probe(o.decode_dev, err, sizeof(err));

		if (rc)
			fprintf(stderr, "pdx-xferbench: --mem %s: %s\n", o.mem, err);
		_exit(rc == XB_CUDA_SKIP ? XB_CUDA_SKIP : rc ? 1 : 0);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			fail("waitpid: %s", strerror(errno));
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return;
	if (WIFEXITED(st) && WEXITSTATUS(st) == XB_CUDA_SKIP)
		exit(XB_CUDA_SKIP);
	fail("--mem %s: the CUDA check failed (wait status 0x%x)", o.mem, st);
}

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
		agent_logs_drain();
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
	plan.shape = shared_alloc(&used, sizeof(*plan.shape));
}

/* ---- measurement ---- */

#define MAX_ITERS 10000

struct results {
	double *lat_ms;       /* per measured transfer */
	size_t n_lat;
	double wall_s;        /* sum over measured iterations */
	uint64_t bytes;       /* over measured iterations */
	uint64_t ev_bytes;    /* the same, as the decode agent's events say */
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

/* One configuration measured. arms[0] is the run's options; with --versus,
 * arms[1] is the variant, measured in the same process, iteration by
 * iteration beside the baseline. */
struct arm {
	struct shape shape;
	struct results res;
};

static struct arm arms[2] = { { .res.verified = true },
			      { .res.verified = true } };
static uint32_t n_arms = 1;
static uint64_t rng;

/* --mem cuda: the device and its copy rates, measured once */
static struct {
	char gpu[128];
	double d2d_gbps, d2h_gbps;
} dev;

enum iter_kind { ITER_WARMUP, ITER_CALIBRATE, ITER_MEASURE };

/* The copy limit, paired with the transfers: before each measured
 * iteration, a plain single-threaded memcpy of the same bytes in pieces of
 * that iteration's op size between two pre-faulted buffers of one
 * transfer's size, so both figures see the same machine load. */
static void memcpy_pass(uint64_t bytes, uint64_t piece, uint32_t times,
			struct results *r)
{
	static uint8_t *a, *b;
	static uint64_t cap;
	uint64_t t0;

	/* the largest arm's size: each arm's warm-up comes before its first
	 * counted pass */
	if (bytes > cap) {
		free(a);
		free(b);
		a = malloc(bytes);
		b = malloc(bytes);
		if (!a || !b)
			fail("cannot allocate the memcpy buffers");
		memset(a, 0x5a, bytes);
		memset(b, 0xa5, bytes); /* not 0: that could become calloc */
		cap = bytes;
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
	if (r) {
		r->memcpy_s += (double)(pdx_now_ns() - t0) / 1e9;
		r->memcpy_bytes += bytes * times;
	}
}

/* One iteration of arm a: its shape goes to the engines through the shared
 * plan, its figures to a->res. */
static void run_iter(int iter, enum iter_kind kind, double layer_ms,
		     struct arm *a)
{
	struct results *r = &a->res;
	struct child *P = &kids[0], *D = &kids[1];
	struct child *both[2] = { P, D };
	struct ack acks[2];
	size_t total = (size_t)a->shape.conc * a->shape.nblocks;
	uint64_t first_send = UINT64_MAX, last_recv = 0, last_recv_agent = 0;
	const uint32_t layers = o.model->layers;

	*plan.shape = a->shape;
	for (uint32_t c = 0; c < plan.shape->conc; c++) {
		if (pdx_xfer_id_random(&plan.ids[c]) != PDX_OK)
			fail("cannot draw a transfer id");
		plan.seeds[c] = pb_rand(&rng);
	}
	pb_pick_blocks(plan.src, total, plan.pool_blocks, o.random_blocks, &rng);
	pb_pick_blocks(plan.dst, total, plan.pool_blocks, o.random_blocks, &rng);

	/* before the recv is posted, so the copy limit never holds up a
	 * transfer; the warm-up warms the buffers */
	if (kind != ITER_CALIBRATE) {
		uint64_t ops = pb_runs(plan.src + plan.shape->skip_blocks,
				       plan.dst + plan.shape->skip_blocks,
				       plan.shape->nblocks - plan.shape->skip_blocks) *
			       layers * o.model->tensors;

		memcpy_pass(xfer_bytes(), ops ? xfer_bytes() / ops : 0, plan.shape->conc,
			    kind == ITER_MEASURE ? r : NULL);
	}
	send_cmd(P, CMD_FILL, iter, layer_ms, NULL);
	wait_acks(&P, 1, acks, ACK_TIMEOUT_MS, "fill");
	send_cmd(D, CMD_RECV, iter, 0, P->peer);
	wait_acks(&D, 1, acks, ACK_TIMEOUT_MS, "recv");
	send_cmd(D, CMD_WAIT, iter, 0, NULL);
	send_cmd(P, CMD_SEND, iter, layer_ms, D->peer);
	wait_acks(both, 2, acks, ACK_TIMEOUT_MS, "transfer");

	if (!acks[1].verified) {
		fprintf(stderr, "pdx-xferbench: MISMATCH: %s\n", acks[1].reason);
		r->verified = false;
	}
	for (uint32_t c = 0; c < plan.shape->conc; c++) {
		if (plan.t_send[c] < first_send)
			first_send = plan.t_send[c];
		if (plan.t_recv[c] > last_recv)
			last_recv = plan.t_recv[c];
		if (plan.t_recv_agent[c] > last_recv_agent)
			last_recv_agent = plan.t_recv_agent[c];
	}
	if (kind != ITER_WARMUP && layer_ms == 0) {
		for (uint32_t c = 0; c < plan.shape->conc; c++) {
			r->layer_sum_ms += (double)(plan.t_recv[c] - *plan.t_first_ld) /
					    1e6 / layers;
			r->layer_n++;
		}
	}
	fprintf(stderr, "pdx-xferbench: %s%s %d: %u transfers, %.3f ms, exposed %.3f ms (engine %.3f)%s\n",
		n_arms == 1 ? "" : a == arms ? "baseline " : "variant ",
		kind == ITER_WARMUP ? "warm-up" :
		kind == ITER_CALIBRATE ? "layer calibration" : "iteration",
		iter, plan.shape->conc, (double)(last_recv - first_send) / 1e6,
		((double)last_recv_agent - (double)*plan.t_last_ld) / 1e6,
		((double)last_recv - (double)*plan.t_last_ld) / 1e6,
		acks[1].verified ? "" : " (MISMATCH)");
	if (kind != ITER_MEASURE)
		return;
	for (uint32_t c = 0; c < plan.shape->conc; c++) {
		const uint32_t *s = plan.src + (size_t)c * plan.shape->nblocks;
		const uint32_t *d = plan.dst + (size_t)c * plan.shape->nblocks;

		r->lat_ms[r->n_lat++] = (double)(plan.t_recv[c] - plan.t_send[c]) / 1e6;
		r->bytes += xfer_bytes();
		r->ev_bytes += plan.ev_bytes[c];
		r->ops += pb_runs(s + plan.shape->skip_blocks,
				  d + plan.shape->skip_blocks,
				  plan.shape->nblocks - plan.shape->skip_blocks) *
			   layers * o.model->tensors;
		r->xfers++;
	}
	r->wall_s += (double)(last_recv - first_send) / 1e9;
	if (r->exposed_n < MAX_ITERS) {
		r->exposed_ms[r->exposed_n] =
			((double)last_recv_agent - (double)*plan.t_last_ld) / 1e6;
		r->engine_exposed_ms[r->exposed_n] =
			((double)last_recv - (double)*plan.t_last_ld) / 1e6;
		r->exposed_n++;
	}
}

/* --one-block: one measured transfer. The agents' marks (agent/trace.h)
 * come later, through their logs. */
struct ob_sample {
	char hex[33];
	uint64_t t_ld;           /* P: the last layer_done called */
	uint64_t t_ev;           /* D: the engine read "received" */
	uint64_t rtt_ns;         /* the ping right after it */
	uint64_t p[MARK_N];      /* the prefill agent's marks */
	uint64_t d[MARK_N];      /* the decode agent's */
};

static struct ob_sample *ob;
static uint32_t ob_n;

/* A trace line: its marks go to the sample of its transfer, if any. */
static void ob_trace(const char *line)
{
	uint64_t marks[MARK_N];
	char hex[33];
	bool send;

	if (!xc_trace_parse(line, hex, &send, marks))
		return;
	for (uint32_t i = 0; i < ob_n; i++) {
		if (strcmp(ob[i].hex, hex))
			continue;
		memcpy(send ? ob[i].p : ob[i].d, marks, sizeof(marks));
		return;
	}
}

/* --one-block: one-block transfers one after another, each followed by a
 * ping over the decode agent's engine link after as long a quiet as the
 * transfer's, so that both see the same machine. The layers come ONE_BLOCK_LAYER_MS apart (or --layer-ms), so
 * the agent is idle when the last one is computed: what follows it is
 * that layer's copy and the control path. */
static void run_one_block(void)
{
	struct child *P = &kids[0], *D = &kids[1];
	struct child *both[2] = { P, D };
	double layer_ms = o.layer_ms > 0 ? o.layer_ms : ONE_BLOCK_LAYER_MS;
	struct plan saved = plan;
	struct ack acks[2];

	ob = calloc(o.one_block, sizeof(*ob));
	if (!ob)
		fail("out of memory");
	/* the run's own transfer (not --versus's variant), whole */
	*plan.shape = (struct shape){
		.conc = 1, .nblocks = 1, .pull = arms[0].shape.pull };
	for (uint32_t i = 0; i < ONE_BLOCK_WARMUP + o.one_block; i++) {
		struct ob_sample *smp = i < ONE_BLOCK_WARMUP ? NULL : &ob[ob_n];

		if (pdx_xfer_id_random(&plan.ids[0]) != PDX_OK)
			fail("cannot draw a transfer id");
		plan.seeds[0] = pb_rand(&rng);
		pb_pick_blocks(plan.src, 1, plan.pool_blocks, false, &rng);
		pb_pick_blocks(plan.dst, 1, plan.pool_blocks, false, &rng);
		if (smp) { /* before its trace lines can come */
			pdx_xfer_id_hex(&plan.ids[0], smp->hex);
			ob_n++;
		}
		send_cmd(P, CMD_FILL, -1, layer_ms, NULL);
		wait_acks(&P, 1, acks, ACK_TIMEOUT_MS, "one-block fill");
		send_cmd(D, CMD_RECV, -1, 0, P->peer);
		wait_acks(&D, 1, acks, ACK_TIMEOUT_MS, "one-block recv");
		send_cmd(D, CMD_WAIT, -1, 0, NULL);
		send_cmd(P, CMD_SEND, -1, layer_ms, D->peer);
		wait_acks(both, 2, acks, ACK_TIMEOUT_MS, "one-block transfer");
		if (!acks[1].verified) {
			fprintf(stderr, "pdx-xferbench: MISMATCH: %s\n",
				acks[1].reason);
			arms[0].res.verified = false;
		}
		send_cmd(D, CMD_PING, -1, o.model->layers * layer_ms, NULL);
		wait_acks(&D, 1, acks, ACK_TIMEOUT_MS, "ping");
		if (!smp)
			continue;
		smp->t_ld = *plan.t_last_ld;
		smp->t_ev = plan.t_recv[0];
		smp->rtt_ns = acks[0].rtt_ns;
	}
	plan = saved;
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
		"  --mem shm|cuda[:DEV]   where the engines keep their KV pools: /dev/shm\n"
		"                         (default), or memory of CUDA device DEV (default\n"
		"                         0) shared by CUDA IPC, with per-layer CUDA events;\n"
		"                         exits 77 when there is no such device\n"
		"  --decode-device DEV    with --mem cuda: the decode engine's device\n"
		"                         (default: the prefill engine's), e.g. to move\n"
		"                         KV between two GPUs\n"
		"  --data-path PATH       passed to both agents as is: auto (default), ipc,\n"
		"                         put, am; for GPU memory e.g. cuda-ipc, staged,\n"
		"                         cuda-put\n"
		"  --pull                 the decode agent reads the prefill agent's blocks\n"
		"                         once all layers are computed (default: push)\n"
		"  --xfer-timeout-ms N    passed to the agents (default: theirs)\n"
		"  --agent-bin PATH       pdx-agent (default: ../agent/pdx-agent beside\n"
		"                         this program)\n"
		"  --seed N               seed for block choice and data (default: random)\n"
		"  --one-block N          then N one-block transfers one after another\n"
		"                         (after %d warm-up), layers %g ms apart (or\n"
		"                         --layer-ms), each followed by a ping over the\n"
		"                         decode agent's engine link; the agents trace\n"
		"                         their steps (PDX_AGENT_TRACE=1)\n"
		"  --versus WHAT          measure a variant beside the run's own transfer\n"
		"                         (the baseline), iterations alternating, both\n"
		"                         verified: pull (the decode agent pulls),\n"
		"                         skip-half (it holds the first half of the\n"
		"                         prompt), skip=N (the first N tokens)\n"
		"  --json                 one JSON object on stdout, logs on stderr\n"
		"  --help                 this text\n"
		"\n"
		"Figures (JSON keys): gbps = payload bytes / summed wall time from the\n"
		"first send to the last \"received\"; memcpy_gbps = a single-thread\n"
		"memcpy of the same bytes in op_bytes pieces, run before each measured\n"
		"iteration; layer_xfer_ms = transfer time / layers with no compute;\n"
		"exposed_ms = median time from the last layer computed to the decode\n"
		"agent's \"received\" (engine_exposed_ms: to the engine reading it);\n"
		"p50_ms, p99_ms = send posted to \"received\" read, per transfer;\n"
		"data_by = the path the prefill agent logged it moves data by\n"
		"(data_by_decode: the decode agent's). With --one-block:\n"
		"one_block_ctl_us = {p50, p90, mean, n} from the last layer_done called\n"
		"to the decode engine reading \"received\"; zmq_rtt_us = the same of the\n"
		"pings; one_block_ratio = their p50s' ratio; one_block_breakdown_us =\n"
		"{step: {p50, mean}} from the agents' traces (docs/benchmarking.md).\n"
		"With --versus: versus = {what, baseline, variant, time_ratio,\n"
		"mean_time_ratio, exposed_ratio, bytes_ratio}, each arm's figures and\n"
		"the variant's over the baseline's (p50, mean, exposed_ms, bytes the\n"
		"decode agent received); the other keys are the baseline's, but\n"
		"verified covers both.\n"
		"With --mem cuda: d2d_gbps,\n"
		"d2h_gbps = cudaMemcpy of one transfer's bytes device to device and\n"
		"device to pinned host on that GPU (median of %d, timed by CUDA events);\n"
		"d2d_ratio, d2h_ratio = gbps / them.\n",
		pdx_model_names(), ONE_BLOCK_WARMUP, ONE_BLOCK_LAYER_MS, YARD_REPS);
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

static void check_skip(const char *opt, uint32_t skip)
{
	if (skip / o.model->block_tokens >=
	    (o.tokens + o.model->block_tokens - 1) / o.model->block_tokens)
		bad("%s %u leaves no block of the %u tokens to move", opt, skip,
		    o.tokens);
}

/* --versus WHAT: the variant, measured beside the run's own transfer (the
 * baseline). A variant differs from the baseline in one thing only. */
static void parse_versus(const char *what)
{
	struct shape *v = &arms[1].shape;

	*v = arms[0].shape;
	if (!strcmp(what, "pull")) {
		if (o.pull)
			bad("--versus pull: the baseline pushes; drop --pull");
		v->pull = true;
	} else if (!strcmp(what, "skip-half") || !strncmp(what, "skip=", 5)) {
		if (o.skip_tokens)
			bad("--versus %s: the baseline moves the whole prompt; "
			    "drop --skip-tokens", what);
		v->skip_tokens = what[4] == '=' ?
			(uint32_t)parse_u64("--versus skip=N", what + 5, 1,
					    1u << 22) : o.tokens / 2;
		check_skip("--versus skip", v->skip_tokens);
		v->skip_blocks = v->skip_tokens / o.model->block_tokens;
	} else {
		bad("--versus: \"%s\" is none of pull, skip-half, skip=N", what);
	}
	n_arms = 2;
}

static void parse_opts(int argc, char **argv)
{
	enum {
		O_TLS = 256, O_MODEL, O_TOKENS, O_SKIP, O_RANDOM, O_CONC, O_LAYER,
		O_ITERS, O_JSON, O_BIN, O_DATA, O_XTMO, O_SEED, O_MEM, O_DDEV,
		O_PULL, O_ONE, O_VERSUS, O_HELP
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
		{ "pull", no_argument, NULL, O_PULL },
		{ "xfer-timeout-ms", required_argument, NULL, O_XTMO },
		{ "seed", required_argument, NULL, O_SEED },
		{ "mem", required_argument, NULL, O_MEM },
		{ "decode-device", required_argument, NULL, O_DDEV },
		{ "one-block", required_argument, NULL, O_ONE },
		{ "versus", required_argument, NULL, O_VERSUS },
		{ "help", no_argument, NULL, O_HELP },
		{ NULL, 0, NULL, 0 },
	};
	const char *mem = "shm";
	bool have_seed = false, have_ddev = false;
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
		case O_PULL:
			o.pull = true;
			break;
		case O_XTMO:
			o.xfer_timeout_ms = (uint32_t)parse_u64(
				"--xfer-timeout-ms", optarg, 1, 86400000);
			break;
		case O_SEED:
			o.seed = parse_u64("--seed", optarg, 0, UINT64_MAX);
			have_seed = true;
			break;
		case O_MEM:
			mem = optarg;
			break;
		case O_DDEV:
			o.decode_dev = (int)parse_u64("--decode-device", optarg, 0,
						      1023);
			have_ddev = true;
			break;
		case O_ONE:
			o.one_block = (uint32_t)parse_u64("--one-block", optarg,
							  1, 100000);
			break;
		case O_VERSUS:
			o.versus = optarg;
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
	/* the agent judges the value: its paths grow (GPU memory) faster
	 * than a list here would */
	if (!o.data_path[0] || strlen(o.data_path) >= sizeof(kids[0].agent.data_path))
		bad("--data-path: \"%s\" is empty or too long", o.data_path);
	if (!strcmp(mem, "shm")) {
		o.cuda = false;
	} else if (!strncmp(mem, "cuda", 4) && (!mem[4] || mem[4] == ':')) {
		o.cuda = true;
		o.cuda_dev = mem[4] ? (int)parse_u64("--mem cuda:DEVICE", mem + 5,
						      0, 1023) : 0;
	} else {
		bad("--mem: \"%s\" is neither shm nor cuda[:DEVICE]", mem);
	}
	if (have_ddev && !o.cuda)
		bad("--decode-device needs --mem cuda");
	if (!have_ddev)
		o.decode_dev = o.cuda_dev;
	if (o.cuda && o.decode_dev != o.cuda_dev)
		snprintf(o.mem, sizeof(o.mem), "cuda:%d,%d", o.cuda_dev,
			 o.decode_dev);
	else if (o.cuda)
		snprintf(o.mem, sizeof(o.mem), "cuda:%d", o.cuda_dev);
	else
		snprintf(o.mem, sizeof(o.mem), "shm");
	check_skip("--skip-tokens", o.skip_tokens);
	arms[0].shape = (struct shape){
		.conc = o.concurrency,
		.nblocks = (o.tokens + o.model->block_tokens - 1) /
			   o.model->block_tokens,
		.skip_tokens = o.skip_tokens,
		.skip_blocks = o.skip_tokens / o.model->block_tokens,
		.pull = o.pull,
	};
	if (o.versus)
		parse_versus(o.versus);
	if (!o.agent_bin[0] &&
	    pb_default_agent_bin(o.agent_bin, sizeof(o.agent_bin)))
		bad("cannot find pdx-agent beside this program; use --agent-bin");
	if (access(o.agent_bin, X_OK))
		bad("agent binary %s: %s", o.agent_bin, strerror(errno));
	if (!have_seed)
		o.seed = pdx_now_ns() ^ ((uint64_t)getpid() << 40);
}

/* ---- output ---- */

/* An arm's figures (the keys of --help's text), from its results. */
struct figures {
	uint64_t bytes;       /* per transfer */
	uint64_t ev_bytes;    /* per transfer, as the decode agent's events say */
	double gbps, op_bytes, p50, p99, mean, layer_xfer, exposed, mgbps;
	/* exposed ends when the decode agent emits "received"; this one when
	 * the decode engine read it, which adds the engine process's wake-up */
	double engine_exposed;
};

/* Sorts a's samples. */
static struct figures figures_of(struct arm *a)
{
	struct results *r = &a->res;
	struct figures f = {
		.bytes = shape_bytes(&a->shape),
		.ev_bytes = r->xfers ? r->ev_bytes / r->xfers : 0,
		.gbps = r->wall_s > 0 ? (double)r->bytes / r->wall_s / 1e9 : 0,
		.op_bytes = r->ops ? (double)r->bytes / (double)r->ops : 0,
		.layer_xfer = r->layer_n ? r->layer_sum_ms / (double)r->layer_n : 0,
		.mgbps = r->memcpy_s > 0 ?
			 (double)r->memcpy_bytes / r->memcpy_s / 1e9 : 0,
	};

	qsort(r->lat_ms, r->n_lat, sizeof(double), cmp_double);
	f.p50 = percentile(r->lat_ms, r->n_lat, 0.50);
	f.p99 = percentile(r->lat_ms, r->n_lat, 0.99);
	for (size_t i = 0; i < r->n_lat; i++)
		f.mean += r->lat_ms[i] / (double)r->n_lat;
	qsort(r->exposed_ms, r->exposed_n, sizeof(double), cmp_double);
	f.exposed = percentile(r->exposed_ms, r->exposed_n, 0.50);
	qsort(r->engine_exposed_ms, r->exposed_n, sizeof(double), cmp_double);
	f.engine_exposed = percentile(r->engine_exposed_ms, r->exposed_n, 0.50);
	return f;
}

/* s as a JSON string (quotes and escapes); null when empty. */
static void json_str(const char *s)
{
	if (!s[0]) {
		printf("null");
		return;
	}
	putchar('"');
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

/* x, or null without the GPU yardsticks */
static void json_gpu_num(const char *key, double x)
{
	printf(", \"%s\": ", key);
	if (o.cuda)
		printf("%.4f", x);
	else
		printf("null");
}

/* --mem, the data paths the agents chose and, on a GPU, the yardsticks:
 * the keys after the shm-era ones. */
static void json_mem(double gbps)
{
	printf(", \"mem\": \"%s\", \"gpu\": ", o.mem);
	json_str(dev.gpu);
	printf(", \"data_by\": ");
	json_str(kids[0].data_by);
	printf(", \"data_by_decode\": ");
	json_str(kids[1].data_by);
	json_gpu_num("d2d_gbps", dev.d2d_gbps);
	json_gpu_num("d2h_gbps", dev.d2h_gbps);
	json_gpu_num("d2d_ratio", dev.d2d_gbps > 0 ? gbps / dev.d2d_gbps : 0);
	json_gpu_num("d2h_ratio", dev.d2h_gbps > 0 ? gbps / dev.d2h_gbps : 0);
}

static void print_gpu(double gbps)
{
	printf("  %-22s %.3f GB/s (throughput / it = %.3f)\n",
	       "cudaMemcpy d2d", dev.d2d_gbps,
	       dev.d2d_gbps > 0 ? gbps / dev.d2d_gbps : 0);
	printf("  %-22s %.3f GB/s (throughput / it = %.3f)\n",
	       "cudaMemcpy d2h pinned", dev.d2h_gbps,
	       dev.d2h_gbps > 0 ? gbps / dev.d2h_gbps : 0);
}

/* ---- --one-block's figures ---- */

#define OB_SEGS 8

/* From the last layer_done called to the decode engine reading its
 * event, step by step (agent/trace.h's marks between the engines'). */
static const char *const ob_seg_key[OB_SEGS] = {
	"engine_link_prefill", "to_push", "push", "completion",
	"done_build", "peer_link", "decode_agent", "engine_link_decode",
};
static const char *const ob_seg_name[OB_SEGS] = {
	"layer_done to prefill agent", "agent to push issued",
	"push (ipc: the copy)", "push to completion",
	"done built", "done to decode agent",
	"decode agent to event", "event sent, to D engine",
};

struct ob_stat {
	double p50, p90, mean;
	size_t n;
};

struct ob_summary {
	struct ob_stat ctl, rtt;
	struct ob_stat seg[OB_SEGS];
};

static struct ob_summary obs;

/* v sorted; its percentiles and mean. */
static struct ob_stat ob_stat(double *v, size_t n)
{
	struct ob_stat st = { .n = n };

	qsort(v, n, sizeof(double), cmp_double);
	for (size_t i = 0; i < n; i++)
		st.mean += v[i] / (double)n;
	st.p50 = percentile(v, n, 0.50);
	st.p90 = percentile(v, n, 0.90);
	return st;
}

/* The sample's timeline, or false when a mark is missing (no trace line:
 * an agent without PDX_AGENT_TRACE, or one that logs below info). */
static bool ob_timeline(const struct ob_sample *s, uint64_t t[OB_SEGS + 1])
{
	const uint64_t tl[OB_SEGS + 1] = {
		s->t_ld, s->p[MARK_LAYER_DONE], s->p[MARK_PUSH],
		s->p[MARK_PUSHED], s->p[MARK_FLUSHED], s->p[MARK_DONE_SENT],
		s->d[MARK_DONE_HEARD], s->d[MARK_EVENT], s->t_ev,
	};

	memcpy(t, tl, sizeof(tl));
	for (int i = 0; i <= OB_SEGS; i++)
		if (!t[i])
			return false;
	return true;
}

static void ob_summarize(void)
{
	double *v = calloc(ob_n ? ob_n : 1, sizeof(double));
	double *seg[OB_SEGS];
	size_t traced = 0;

	if (!v)
		fail("out of memory");
	for (int g = 0; g < OB_SEGS; g++) {
		seg[g] = calloc(ob_n ? ob_n : 1, sizeof(double));
		if (!seg[g])
			fail("out of memory");
	}
	for (uint32_t i = 0; i < ob_n; i++) {
		uint64_t t[OB_SEGS + 1];

		v[i] = ((double)ob[i].t_ev - (double)ob[i].t_ld) / 1e3;
		if (!ob_timeline(&ob[i], t))
			continue;
		for (int g = 0; g < OB_SEGS; g++)
			seg[g][traced] = ((double)t[g + 1] - (double)t[g]) / 1e3;
		traced++;
	}
	obs.ctl = ob_stat(v, ob_n);
	for (int g = 0; g < OB_SEGS; g++) {
		obs.seg[g] = ob_stat(seg[g], traced);
		free(seg[g]);
	}
	for (uint32_t i = 0; i < ob_n; i++)
		v[i] = (double)ob[i].rtt_ns / 1e3;
	obs.rtt = ob_stat(v, ob_n);
	free(v);
}

static void json_stat(const char *key, const struct ob_stat *st)
{
	printf(", \"%s\": {\"p50\": %.1f, \"p90\": %.1f, \"mean\": %.1f, "
	       "\"n\": %zu}", key, st->p50, st->p90, st->mean, st->n);
}

/* The keys of --one-block, null without it (or, for the breakdown,
 * without the agents' trace lines). */
static void json_one_block(void)
{
	if (!o.one_block) {
		printf(", \"one_block_ctl_us\": null, \"zmq_rtt_us\": null, "
		       "\"one_block_ratio\": null, "
		       "\"one_block_breakdown_us\": null");
		return;
	}
	json_stat("one_block_ctl_us", &obs.ctl);
	json_stat("zmq_rtt_us", &obs.rtt);
	printf(", \"one_block_ratio\": %.3f, \"one_block_breakdown_us\": ",
	       obs.rtt.p50 > 0 ? obs.ctl.p50 / obs.rtt.p50 : 0);
	if (!obs.seg[0].n) {
		printf("null");
		return;
	}
	for (int g = 0; g < OB_SEGS; g++)
		printf("%s\"%s\": {\"p50\": %.1f, \"mean\": %.1f}",
		       g ? ", " : "{", ob_seg_key[g], obs.seg[g].p50,
		       obs.seg[g].mean);
	printf(", \"n\": %zu}", obs.seg[0].n);
}

static void print_one_block(void)
{
	double layer_ms = o.layer_ms > 0 ? o.layer_ms : ONE_BLOCK_LAYER_MS;
	double sum = 0;

	printf("\n  one-block control path: %zu transfers of one block, %u layers %g ms apart\n",
	       obs.ctl.n, o.model->layers, layer_ms);
	printf("  %-34s %8s %8s %8s\n", "", "p50 us", "p90 us", "mean us");
	printf("  %-34s %8.1f %8.1f %8.1f\n", "last layer_done to D's event",
	       obs.ctl.p50, obs.ctl.p90, obs.ctl.mean);
	printf("  %-34s %8.1f %8.1f %8.1f\n", "ping over D's engine link",
	       obs.rtt.p50, obs.rtt.p90, obs.rtt.mean);
	printf("  %-34s %8.2f\n", "ratio (p50)",
	       obs.rtt.p50 > 0 ? obs.ctl.p50 / obs.rtt.p50 : 0);
	if (!obs.seg[0].n) {
		printf("  (no trace lines from the agents: no breakdown)\n");
		return;
	}
	printf("  where it goes (%zu traced):\n", obs.seg[0].n);
	for (int g = 0; g < OB_SEGS; g++) {
		printf("    %-32s %8.1f %8s %8.1f\n", ob_seg_name[g],
		       obs.seg[g].p50, "", obs.seg[g].mean);
		sum += obs.seg[g].mean;
	}
	printf("    %-32s %8s %8s %8.1f\n", "sum of means", "", "", sum);
}

static bool all_verified(void)
{
	return arms[0].res.verified && arms[1].res.verified;
}

static double ratio(double x, double y)
{
	return y > 0 ? x / y : 0;
}

/* One arm of --versus in JSON. */
static void json_arm(const char *key, const struct arm *a,
		     const struct figures *f)
{
	printf("\"%s\": {\"skip_tokens\": %u, \"pull\": %s, "
	       "\"bytes\": %" PRIu64 ", \"event_bytes\": %" PRIu64 ", "
	       "\"xfers\": %u, \"p50_ms\": %.4f, \"mean_ms\": %.4f, "
	       "\"p99_ms\": %.4f, \"gbps\": %.4f, \"exposed_ms\": %.4f, "
	       "\"engine_exposed_ms\": %.4f, \"memcpy_gbps\": %.4f, "
	       "\"verified\": %s}",
	       key, a->shape.skip_tokens, a->shape.pull ? "true" : "false",
	       f->bytes, f->ev_bytes, a->res.xfers, f->p50, f->mean, f->p99,
	       f->gbps, f->exposed, f->engine_exposed, f->mgbps,
	       a->res.verified ? "true" : "false");
}

/* The versus object, null without --versus. The ratios are the variant's
 * over the baseline's; bytes_ratio is of the bytes the decode agent said it
 * received, printed exactly (both are integers). */
static void json_versus(const struct figures *f, const struct figures *v)
{
	if (n_arms == 1) {
		printf(", \"versus\": null");
		return;
	}
	printf(", \"versus\": {\"what\": ");
	json_str(o.versus);
	printf(", ");
	json_arm("baseline", &arms[0], f);
	printf(", ");
	json_arm("variant", &arms[1], v);
	printf(", \"time_ratio\": %.4f, \"mean_time_ratio\": %.4f, "
	       "\"exposed_ratio\": %.4f, \"bytes_ratio\": %.17g}",
	       ratio(v->p50, f->p50), ratio(v->mean, f->mean),
	       ratio(v->exposed, f->exposed),
	       ratio((double)v->ev_bytes, (double)f->ev_bytes));
}

static void print_versus(const struct figures *f, const struct figures *v)
{
	const struct shape *bs = &arms[0].shape, *vs = &arms[1].shape;

	printf("\n  versus %s: both in this run, iterations alternating\n",
	       o.versus);
	printf("  %-26s %14s %14s %9s\n", "", "baseline", "variant",
	       "ratio");
	printf("  %-26s %14u %14u\n", "tokens held by decode",
	       bs->skip_tokens, vs->skip_tokens);
	printf("  %-26s %14s %14s\n", "moved by", bs->pull ? "pull" : "push",
	       vs->pull ? "pull" : "push");
	printf("  %-26s %14" PRIu64 " %14" PRIu64 " %9.4f\n",
	       "bytes per transfer", f->ev_bytes, v->ev_bytes,
	       ratio((double)v->ev_bytes, (double)f->ev_bytes));
	printf("  %-26s %14.3f %14.3f %9.3f\n", "latency p50, ms", f->p50,
	       v->p50, ratio(v->p50, f->p50));
	printf("  %-26s %14.3f %14.3f %9.3f\n", "latency mean, ms", f->mean,
	       v->mean, ratio(v->mean, f->mean));
	printf("  %-26s %14.3f %14.3f %9.3f\n", "exposed after compute, ms",
	       f->exposed, v->exposed, ratio(v->exposed, f->exposed));
	printf("  %-26s %14.3f %14.3f\n", "throughput, GB/s", f->gbps,
	       v->gbps);
	printf("  %-26s %14s %14s\n", "verified",
	       arms[0].res.verified ? "yes" : "NO",
	       arms[1].res.verified ? "yes" : "NO");
}

/* f: the run's own figures (arms[0]); v: --versus's variant, or NULL. */
static void print_results(const struct figures *f, const struct figures *v)
{
	const char *by_p = kids[0].data_by[0] ? kids[0].data_by : "(not logged)";

	if (o.json) {
		printf("{\"tls\": \"%s\", \"model\": \"%s\", \"tokens\": %u, "
		       "\"skip_tokens\": %u, \"concurrency\": %u, "
		       "\"random_blocks\": %s, \"layer_ms\": %g, \"iters\": %u, "
		       "\"data_path\": \"%s\", \"pull\": %s, "
		       "\"seed\": %" PRIu64 ", "
		       "\"gbps\": %.4f, \"bytes\": %" PRIu64 ", \"op_bytes\": %.1f, "
		       "\"xfers\": %u, \"p50_ms\": %.4f, \"p99_ms\": %.4f, "
		       "\"layer_xfer_ms\": %.4f, \"exposed_ms\": %.4f, "
		       "\"engine_exposed_ms\": %.4f, "
		       "\"verified\": %s, \"memcpy_gbps\": %.4f",
		       o.tls, o.model->name, o.tokens, o.skip_tokens,
		       o.concurrency, o.random_blocks ? "true" : "false",
		       o.layer_ms, o.iters, o.data_path,
		       o.pull ? "true" : "false", o.seed, f->gbps, f->bytes,
		       f->op_bytes, arms[0].res.xfers, f->p50, f->p99,
		       f->layer_xfer, f->exposed, f->engine_exposed,
		       all_verified() ? "true" : "false", f->mgbps);
		json_mem(f->gbps);
		json_one_block();
		json_versus(f, v);
		printf("}\n");
		fflush(stdout);
		return;
	}
	printf("pdx-xferbench: model %s, %u tokens%s, tls %s (UCX_TLS=%s), data path %s%s\n",
	       o.model->name, o.tokens, o.skip_tokens ? " (some held)" : "",
	       o.tls, o.ucx_tls, o.data_path, o.pull ? ", pulled" : "");
	printf("  concurrency %u, %s blocks, layer compute %g ms, %u iterations\n",
	       o.concurrency, o.random_blocks ? "random" : "contiguous",
	       o.layer_ms, o.iters);
	if (o.cuda)
		printf("  KV pools in GPU memory, %s%s%s%s\n\n", o.mem,
		       dev.gpu[0] ? " (" : "", dev.gpu, dev.gpu[0] ? ")" : "");
	else
		printf("  KV pools in /dev/shm\n\n");
	printf("  %-22s %s", "data by", by_p);
	if (kids[1].data_by[0] && strcmp(kids[1].data_by, kids[0].data_by))
		printf(" (decode agent: %s)", kids[1].data_by);
	printf("\n");
	printf("  %-22s %" PRIu64 " (%.2f MiB)\n", "bytes per transfer",
	       f->bytes, (double)f->bytes / 1048576.0);
	printf("  %-22s %.0f\n", "bytes per UCX op", f->op_bytes);
	printf("  %-22s %u\n", "transfers measured", arms[0].res.xfers);
	printf("  %-22s %.3f GB/s\n", "throughput", f->gbps);
	printf("  %-22s %.3f GB/s\n", "memcpy (1 thread)", f->mgbps);
	if (o.cuda)
		print_gpu(f->gbps);
	printf("  %-22s %.3f ms\n", "latency p50", f->p50);
	printf("  %-22s %.3f ms\n", "latency p99", f->p99);
	printf("  %-22s %.4f ms\n", "per-layer transfer", f->layer_xfer);
	printf("  %-22s %.3f ms (engine read it after %.3f ms)\n",
	       "exposed after compute", f->exposed, f->engine_exposed);
	printf("  %-22s %s\n", "verified", all_verified() ? "yes" : "NO");
	if (o.one_block)
		print_one_block();
	if (v)
		print_versus(f, v);
	fflush(stdout);
}

/* --mem cuda: P measures its device's copy rates once, with the GPU warm
 * from the warm-up transfer and nothing else queued on it. */
static void gpu_yardsticks(void)
{
	struct child *P = &kids[0];
	struct ack a;

	*plan.shape = arms[0].shape; /* the run's own transfer's bytes */
	send_cmd(P, CMD_YARD, 0, 0, NULL);
	wait_acks(&P, 1, &a, ACK_TIMEOUT_MS, "yardsticks");
	dev.d2d_gbps = a.d2d_gbps;
	dev.d2h_gbps = a.d2h_gbps;
	fprintf(stderr, "pdx-xferbench: %s: cudaMemcpy d2d %.3f GB/s, d2h (pinned) %.3f GB/s\n",
		o.mem, a.d2d_gbps, a.d2h_gbps);
}

int main(int argc, char **argv)
{
	struct ack acks[2];
	char dir[256], listen[64];
	uint64_t pool_bytes;
	struct statvfs sv;
	pid_t me = getpid();
	struct figures f, v;
	int ports[2] = { -1, -1 };

	parse_opts(argc, argv);
	pdx_log_prefix("xferbench");
	if (o.cuda)
		cuda_probe();

	plan.conc = arms[0].shape.conc;
	plan.nblocks = arms[0].shape.nblocks;
	plan.pool_blocks = plan.conc * plan.nblocks + 4;
	pool_bytes = (uint64_t)plan.pool_blocks * o.model->layers *
		     o.model->tensors * o.model->block_tokens *
		     o.model->kv_heads * o.model->head_dim * o.model->dtype_bytes;
	if (!o.cuda && statvfs("/dev/shm", &sv) == 0 &&
	    (uint64_t)sv.f_bavail * sv.f_frsize < 2 * pool_bytes)
		fail("/dev/shm has %.2f GiB free; two pools need %.2f GiB",
		     (double)sv.f_bavail * sv.f_frsize / 1073741824.0,
		     2.0 * pool_bytes / 1073741824.0);
	rng = o.seed;
	for (uint32_t a = 0; a < n_arms; a++) {
		arms[a].res.lat_ms = calloc((size_t)o.iters * o.concurrency,
					    sizeof(double));
		if (!arms[a].res.lat_ms)
			fail("out of memory");
	}

	pb_cleanup_install();
	pb_cleanup_hook(agent_logs_drain);
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
		int log_wfd;

		for (int t = 0; t < 16 && (ports[i] < 0 ||
					    (i == 1 && ports[1] == ports[0]));
		     t++)
			ports[i] = pb_free_port("127.0.0.1");
		if (ports[i] < 0 || (i == 1 && ports[1] == ports[0]))
			fail("no free TCP port on 127.0.0.1");
		snprintf(k->shm_name, sizeof(k->shm_name), "/pdx-xb-%d-%c",
			 (int)me, k->tag);
		if (!o.cuda)
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
		if (o.one_block)
			ao.env[0] = "PDX_AGENT_TRACE=1"; /* the breakdown */
		log_wfd = agent_log_open(k, dir);
		ao.log_fd = log_wfd;
		if (pb_agent_start(&k->agent, &ao))
			fail("cannot start the %s agent", k->role);
		close(log_wfd); /* the agent has it; we never restart one */
	}
	for (int i = 0; i < 2; i++)
		start_child(&kids[i]);
	{
		struct child *both[2] = { &kids[0], &kids[1] };

		wait_acks(both, 2, acks, READY_TIMEOUT_MS, "start");
	}
	for (int i = 0; i < 2; i++) {
		snprintf(kids[i].peer, sizeof(kids[i].peer), "%s", acks[i].peer);
		fprintf(stderr, "pdx-xferbench: %s engine registered%s%s; its agent is %s\n",
			kids[i].role, acks[i].gpu[0] ? " on " : "", acks[i].gpu,
			kids[i].peer);
	}
	snprintf(dev.gpu, sizeof(dev.gpu), "%s", acks[0].gpu);

	for (uint32_t a = 0; a < n_arms; a++)
		run_iter(0, ITER_WARMUP, 0, &arms[a]);
	if (o.cuda)
		gpu_yardsticks();
	for (uint32_t a = 0; o.layer_ms > 0 && a < n_arms; a++)
		run_iter(0, ITER_CALIBRATE, 0, &arms[a]);
	/* --versus: the arms take turns, each iteration in the other order
	 * (ABBA), so that neither always runs right after the other */
	for (uint32_t i = 1; i <= o.iters; i++)
		for (uint32_t a = 0; a < n_arms; a++)
			run_iter((int)i, ITER_MEASURE, o.layer_ms,
				 &arms[i % 2 ? a : n_arms - 1 - a]);
	if (o.one_block)
		run_one_block();

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
	agent_logs_drain();
	pb_tmpdir_remove(dir);

	f = figures_of(&arms[0]);
	if (n_arms > 1)
		v = figures_of(&arms[1]);
	if (o.one_block)
		ob_summarize();
	print_results(&f, n_arms > 1 ? &v : NULL);
	for (uint32_t a = 0; a < n_arms; a++)
		free(arms[a].res.lat_ms);
	return all_verified() ? 0 : 1;
}
