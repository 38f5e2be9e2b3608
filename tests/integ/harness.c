#define _GNU_SOURCE
#include "tests/integ/harness.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fnv.h"
#include "common/log.h"
#include "common/shm_object.h"

void h_note(const char *fmt, ...)
{
	va_list ap;

	printf("# ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

void h_sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

const char *h_kind(enum pdx_event_kind k)
{
	switch (k) {
	case PDX_EVENT_SENT: return "sent";
	case PDX_EVENT_RECEIVED: return "received";
	case PDX_EVENT_FAILED: return "failed";
	}
	return "?";
}

static int side_start(struct h_env *env, struct h_side *s, const char *host,
		      const char *netns, const char *const *extra_env,
		      const char *const *extra_args, char tag)
{
	struct pb_agent_opts ao = { 0 };
	char path[4200];
	int port = pb_free_port(host), n = 0;

	if (port < 0) {
		h_note("no free port on %s", host);
		return -1;
	}
	snprintf(path, sizeof(path), "%s/%c.engine", env->dir, tag);
	pb_track_path(path);
	snprintf(s->engine_addr, sizeof(s->engine_addr), "ipc://%s", path);
	snprintf(s->listen, sizeof(s->listen), "tcp://%s:%d", host, port);
	ao.bin = env->agent_bin;
	ao.engine = s->engine_addr;
	ao.listen = s->listen;
	ao.tls = env->o.tls;
	ao.data_path = env->o.data_path;
	ao.notify = env->o.notify;
	ao.xfer_timeout_ms = env->o.xfer_timeout_ms;
	for (int i = 0; i < 11 && env->o.agent_args[i]; i++)
		ao.args[n++] = env->o.agent_args[i];
	for (int i = 0; i < 4 && extra_args[i] && n < 11; i++)
		ao.args[n++] = extra_args[i];
	if (env->o.agent_logs && n < 10) {
		ao.args[n++] = "--log-level";
		ao.args[n++] = "debug";
		snprintf(s->log, sizeof(s->log), "%s/%c.agent.log", env->dir, tag);
		s->log_fd = open(s->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
				 0600);
		if (s->log_fd < 0) {
			h_note("%s: %s", s->log, strerror(errno));
			return -1;
		}
		ao.log_fd = s->log_fd;
	}
	ao.netns = netns;
	for (int i = 0; i < 4 && extra_env[i]; i++)
		ao.env[i] = extra_env[i];
	if (pb_agent_start(&s->agent, &ao))
		return -1;
	h_note("%s agent: pid %d, engine %s, listen %s%s%s, UCX_TLS=%s",
	       s->role, (int)s->agent.pid, s->engine_addr, s->listen,
	       netns ? " in netns " : "", netns ? netns : "", env->o.tls);
	return 0;
}

int h_register(struct h_env *env, struct h_side *s)
{
	struct pdx_engine_params ep = { .agent = s->engine_addr,
					.timeout_ms = 1000 };
	pdx_status_t st;

	(void)env;
	if (!s->eng) {
		st = pdx_engine_connect(&ep, &s->eng);
		if (st != PDX_OK) {
			h_note("%s engine: connect %s: %s", s->role,
			       s->engine_addr, pdx_status_str(st));
			return -1;
		}
	}
	st = pb_register_retry(s->eng, &s->pool, s->peer, sizeof(s->peer),
			       10000, &s->agent);
	if (st != PDX_OK) {
		h_note("%s engine: register: %s", s->role, pdx_status_str(st));
		return -1;
	}
	h_note("%s engine registered; agent peer address %s", s->role, s->peer);
	return 0;
}

int h_setup(struct h_env *env, int argc, char **argv, const struct h_opts *o)
{
	const struct pdx_model *m;
	struct pdx_model dm;
	char name[64];

	memset(env, 0, sizeof(*env));
	env->p.role = "prefill";
	env->d.role = "decode";
	setvbuf(stdout, NULL, _IOLBF, 0);
	pb_cleanup_install();
	if (argc < 2) {
		fprintf(stderr, "usage: %s PATH-TO-pdx-agent [args]\n", argv[0]);
		return -1;
	}
	env->agent_bin = argv[1];
	if (access(env->agent_bin, X_OK)) {
		h_note("agent binary %s: %s", env->agent_bin, strerror(errno));
		return -1;
	}
	if (o)
		env->o = *o;
	if (!env->o.tls)
		env->o.tls = "sm,self";
	if (!env->o.model)
		env->o.model = "tiny";
	if (!env->o.pool_blocks)
		env->o.pool_blocks = 1024;
	if (!env->o.host_p)
		env->o.host_p = "127.0.0.1";
	if (!env->o.host_d)
		env->o.host_d = "127.0.0.1";
	env->rng = pdx_now_ns() ^ ((uint64_t)getpid() << 32);
	h_note("seed %" PRIu64, env->rng);
	m = pdx_model_find(env->o.model);
	if (!m) {
		h_note("unknown model %s", env->o.model);
		return -1;
	}
	dm = *m;
	if (env->o.d_head_dim)
		dm.head_dim = env->o.d_head_dim;
	if (pb_tmpdir(env->dir, sizeof(env->dir)))
		return -1;
	/* the pools of tests that were SIGKILLed (a runner's timeout) */
	pdx_shm_object_sweep("pdx-test-", PDX_SHM_OBJECT_SWEEP_MIN_AGE_S);
	pdx_shm_object_sweep("pdx-tp-", PDX_SHM_OBJECT_SWEEP_MIN_AGE_S);
	snprintf(name, sizeof(name), "/pdx-test-%d-P", (int)getpid());
	if (pb_pool_create(&env->p.pool, name, m, env->o.pool_blocks))
		return -1;
	snprintf(name, sizeof(name), "/pdx-test-%d-D", (int)getpid());
	if (pb_pool_create(&env->d.pool, name, &dm, env->o.pool_blocks))
		return -1;
	if (side_start(env, &env->p, env->o.host_p, env->o.netns_p,
		       env->o.env_p, env->o.args_p, 'p') ||
	    side_start(env, &env->d, env->o.host_d, env->o.netns_d,
		       env->o.env_d, env->o.args_d, 'd'))
		return -1;
	if (h_register(env, &env->p) || h_register(env, &env->d))
		return -1;
	return 0;
}

long h_log_mark(const struct h_side *s)
{
	struct stat st;

	return s->log[0] && stat(s->log, &st) == 0 ? (long)st.st_size : 0;
}

/* The index of the count-th line after from containing needle, or -1. */
static long log_find(const struct h_side *s, long from, const char *needle,
		     int count, double *ts)
{
	char *line = NULL;
	size_t cap = 0;
	long i = 0, found = -1;
	FILE *f = fopen(s->log, "r");

	if (!f || fseek(f, from, SEEK_SET)) {
		if (f)
			fclose(f);
		return -1;
	}
	/* only whole lines: the agent may be writing the last one */
	for (; getline(&line, &cap, f) > 0 && strchr(line, '\n'); i++) {
		if (strstr(line, needle) && --count == 0) {
			found = i;
			if (ts)
				*ts = strtod(line, NULL);
			break;
		}
	}
	free(line);
	fclose(f);
	return found;
}

long h_log_wait(const struct h_side *s, long from, const char *needle,
		int count, int timeout_ms, double *ts)
{
	uint64_t end = pdx_now_ns() + (uint64_t)timeout_ms * 1000000u;
	long i;

	while ((i = log_find(s, from, needle, count, ts)) < 0 &&
	       pdx_now_ns() < end)
		h_sleep_ms(10);
	return i;
}

/* The last 40 lines of the agent's log, when a check failed. */
static void log_tail(const struct h_side *s)
{
	char *line = NULL, *ring[40] = { 0 };
	size_t cap = 0, n = 0;
	FILE *f;

	if (!s->log[0] || !check_failures || !(f = fopen(s->log, "r")))
		return;
	while (getline(&line, &cap, f) > 0) {
		free(ring[n % 40]);
		ring[n++ % 40] = strdup(line);
	}
	h_note("the %s agent's log ends:", s->role);
	for (size_t i = n > 40 ? n - 40 : 0; i < n; i++)
		fputs(ring[i % 40] ? ring[i % 40] : "", stdout);
	for (size_t i = 0; i < 40; i++)
		free(ring[i]);
	free(line);
	fclose(f);
}

static void side_stop(struct h_side *s)
{
	pdx_engine_free(s->eng);
	s->eng = NULL;
	if (s->agent.pid > 0) {
		int st = pb_agent_stop(&s->agent);

		/* A sanitizer or valgrind finding at exit shows here. */
		CHECK_EQ(st, 0, "%s agent stops cleanly (wait status 0x%x)",
		      s->role, st);
	}
	log_tail(s);
	if (s->log_fd > 0)
		close(s->log_fd);
	s->log_fd = 0;
	pb_pool_destroy(&s->pool);
	free(s->evs);
	s->evs = NULL;
	s->n_evs = s->cap_evs = 0;
}

int h_finish(struct h_env *env)
{
	side_stop(&env->p);
	side_stop(&env->d);
	if (env->dir[0])
		pb_tmpdir_remove(env->dir);
	pb_cleanup_run();
	return check_status();
}

uint64_t h_bytes(const struct h_env *env, const struct h_xfer *x)
{
	const struct pdx_shm_pool *p = &env->p.pool;
	uint32_t skip = x->skip_tokens / p->layout.block_tokens;

	return (uint64_t)(x->n - skip) * p->layout.layers * p->layout.tensors *
	       p->block_bytes;
}

void h_plan(struct h_env *env, struct h_xfer *x, size_t count, uint32_t n,
	    uint32_t max_n, bool random)
{
	size_t total = 0, off = 0;
	uint32_t *src, *dst;

	for (size_t i = 0; i < count; i++) {
		memset(&x[i], 0, sizeof(x[i]));
		pdx_xfer_id_random(&x[i].id);
		x[i].seed = pdx_splitmix64(&env->rng);
		x[i].token = -1;
		x[i].n = n ? n : 1 + (uint32_t)(pdx_splitmix64(&env->rng) % max_n);
		total += x[i].n;
	}
	src = malloc(total * sizeof(*src));
	dst = malloc(total * sizeof(*dst));
	if (!src || !dst || total > env->o.pool_blocks) {
		fprintf(stderr, "h_plan: %zu blocks do not fit the pool\n", total);
		abort();
	}
	if (random) {
		pb_pick_blocks(src, total, env->o.pool_blocks, true, &env->rng);
		pb_pick_blocks(dst, total, env->o.pool_blocks, true, &env->rng);
	} else {
		/* contiguous, from a rotating start so batches differ */
		if (env->next_block_p + total > env->o.pool_blocks)
			env->next_block_p = 0;
		if (env->next_block_d + total > env->o.pool_blocks)
			env->next_block_d = 0;
		for (size_t i = 0; i < total; i++) {
			src[i] = env->next_block_p + (uint32_t)i;
			dst[i] = env->next_block_d + (uint32_t)i;
		}
		env->next_block_p += (uint32_t)total;
		env->next_block_d = (env->next_block_d + (uint32_t)total + 7) %
				    env->o.pool_blocks;
	}
	for (size_t i = 0; i < count; i++) {
		/* each transfer owns a slice; x[0] owns the allocation */
		x[i].src = src + off;
		x[i].dst = dst + off;
		off += x[i].n;
	}
}

void h_plan_free(struct h_xfer *x, size_t count)
{
	if (count) {
		free(x[0].src);
		free(x[0].dst);
	}
	memset(x, 0, count * sizeof(*x));
}

void h_prepare(struct h_env *env, const struct h_xfer *x, size_t count)
{
	for (size_t i = 0; i < count; i++) {
		uint32_t skip = x[i].skip_tokens / env->p.pool.layout.block_tokens;

		pb_fill(&env->p.pool, x[i].seed, x[i].src, x[i].n, skip);
		pb_poison(&env->d.pool, x[i].dst, x[i].n, skip);
	}
}

int h_post_recv(struct h_env *env, const struct h_xfer *x, size_t count)
{
	for (size_t i = 0; i < count; i++) {
		pdx_status_t st = pdx_engine_recv(env->d.eng, &x[i].id,
						  env->p.peer, x[i].dst, x[i].n,
						  x[i].skip_tokens);

		if (st != PDX_OK) {
			CHECK_FAIL("pdx_engine_recv: %s", pdx_status_str(st));
			return -1;
		}
	}
	return 0;
}

int h_post_send(struct h_env *env, const struct h_xfer *x, size_t count)
{
	for (size_t i = 0; i < count; i++) {
		pdx_status_t st = pdx_engine_send(env->p.eng, &x[i].id,
						  env->d.peer, x[i].src, x[i].n);

		if (st != PDX_OK) {
			CHECK_FAIL("pdx_engine_send: %s", pdx_status_str(st));
			return -1;
		}
	}
	return 0;
}

int h_layer_done(struct h_env *env, uint32_t layer, const struct h_xfer *x,
		 size_t count)
{
	struct pdx_xfer_id ids[256];
	size_t done = 0;

	while (done < count) {
		size_t n = count - done < 256 ? count - done : 256;
		pdx_status_t st;

		for (size_t i = 0; i < n; i++)
			ids[i] = x[done + i].id;
		st = pdx_engine_layer_done(env->p.eng, layer, ids, n);
		if (st != PDX_OK) {
			CHECK_FAIL("pdx_engine_layer_done(%u): %s", layer,
				 pdx_status_str(st));
			return -1;
		}
		done += n;
	}
	return 0;
}

/* An event read and its meta, which is valid only until the next read:
 * kept as a length and a hash. */
struct h_kept {
	struct pdx_engine_event ev;
	size_t meta_len;
	uint64_t meta_hash;
};

/* ev: the event the engine's link gave last */
static void keep(struct h_side *s, const struct pdx_engine_event *ev)
{
	const void *meta;
	size_t len;

	if (s->n_evs == s->cap_evs) {
		size_t cap = s->cap_evs ? 2 * s->cap_evs : 64;
		struct h_kept *n = realloc(s->evs, cap * sizeof(*n));

		if (!n)
			abort();
		s->evs = n;
		s->cap_evs = cap;
	}
	if (pdx_engine_event_meta(s->eng, &meta, &len))
		abort();
	s->evs[s->n_evs++] = (struct h_kept){
	    .ev = *ev,
	    .meta_len = len,
	    .meta_hash = pdx_fnv1a64(PDX_FNV1A64_INIT, meta, len),
	};
}

static bool take(struct h_side *s, const struct pdx_xfer_id *id,
		 struct pdx_engine_event *ev)
{
	for (size_t i = 0; i < s->n_evs; i++) {
		if (memcmp(s->evs[i].ev.xfer.b, id->b, sizeof(id->b)))
			continue;
		*ev = s->evs[i].ev;
		s->meta_len = s->evs[i].meta_len;
		s->meta_hash = s->evs[i].meta_hash;
		memmove(&s->evs[i], &s->evs[i + 1],
			(s->n_evs - i - 1) * sizeof(s->evs[i]));
		s->n_evs--;
		return true;
	}
	return false;
}

uint64_t h_meta(const struct h_xfer *x, uint8_t *out)
{
	uint64_t r = x->seed | 1;

	for (uint32_t k = 0; k < x->meta_len; k++) {
		r ^= r << 13, r ^= r >> 7, r ^= r << 17;
		out[k] = (uint8_t)r;
	}
	return pdx_fnv1a64(PDX_FNV1A64_INIT, out, x->meta_len);
}

int h_wait(struct h_side *s, const struct pdx_xfer_id *id, int timeout_ms,
	   struct pdx_engine_event *ev)
{
	uint64_t deadline = pdx_now_ns() + (uint64_t)timeout_ms * 1000000ULL;

	for (;;) {
		struct pdx_engine_event e;
		uint64_t now;
		pdx_status_t st;

		if (take(s, id, ev))
			return 0;
		now = pdx_now_ns();
		if (now >= deadline)
			return -1;
		st = pdx_engine_wait_event(s->eng,
					   (int)((deadline - now) / 1000000) + 1,
					   &e);
		if (st == PDX_OK)
			keep(s, &e);
		else if (st != PDX_ETIMEDOUT && st != PDX_EAGAIN)
			return -1;
	}
}

int h_link_up(struct h_side *s, int timeout_ms)
{
	uint64_t deadline = pdx_now_ns() + (uint64_t)timeout_ms * 1000000ULL;

	while (pdx_engine_link_status(s->eng, NULL, 0) != PDX_OK) {
		struct pdx_engine_event e;

		if (pdx_now_ns() >= deadline)
			return -1;
		/* reading the link is what registers again */
		if (pdx_engine_wait_event(s->eng, 20, &e) == PDX_OK)
			keep(s, &e);
	}
	return 0;
}

int h_quiet(struct h_side *s, const struct pdx_xfer_id *id, int ms)
{
	struct pdx_engine_event ev;

	if (h_wait(s, id, ms, &ev) == 0) {
		h_note("%s: unexpected %s event (%s)", s->role, h_kind(ev.kind),
		       ev.reason);
		return -1;
	}
	return 0;
}

void h_forget(struct h_side *s)
{
	s->n_evs = 0;
}

/* The meta of the event s's h_wait() returned last is x's. */
static bool h_meta_arrived(const struct h_side *s, const struct h_xfer *x)
{
	static uint8_t want[PDX_META_MAX];

	return s->meta_len == x->meta_len && s->meta_hash == h_meta(x, want);
}

int h_expect_ok(struct h_env *env, const struct h_xfer *x, size_t count,
		int timeout_ms)
{
	uint64_t deadline = pdx_now_ns() + (uint64_t)timeout_ms * 1000000ULL;
	int bad = 0;

	for (size_t i = 0; i < count; i++) {
		struct h_side *sides[2] = { &env->p, &env->d };
		enum pdx_event_kind want[2] = { PDX_EVENT_SENT,
						PDX_EVENT_RECEIVED };
		uint64_t bytes = h_bytes(env, &x[i]);
		char hex[33];
		bool ok = true;

		pdx_xfer_id_hex(&x[i].id, hex);
		for (int k = 0; k < 2; k++) {
			struct pdx_engine_event ev;
			uint64_t now = pdx_now_ns();
			int left = now < deadline ?
					   (int)((deadline - now) / 1000000) : 0;

			if (h_wait(sides[k], &x[i].id, left, &ev)) {
				h_note("%s %s: no event in time", hex,
				       sides[k]->role);
				ok = false;
				continue;
			}
			if (ev.kind != want[k]) {
				h_note("%s %s: %s (%s: %s), wanted %s", hex,
				       sides[k]->role, h_kind(ev.kind),
				       pdx_status_str(ev.status), ev.reason,
				       h_kind(want[k]));
				ok = false;
				continue;
			}
			if (k == 1 && ev.first_token != x[i].token) {
				h_note("%s: received first_token %lld, sent "
				       "%lld", hex, (long long)ev.first_token,
				       (long long)x[i].token);
				ok = false;
			}
			if (k == 1 && !h_meta_arrived(sides[k], &x[i])) {
				h_note("%s: received %zu bytes of meta, not the "
				       "%u sent", hex, sides[k]->meta_len,
				       x[i].meta_len);
				ok = false;
			}
			if (ev.bytes != bytes) {
				h_note("%s %s: event says %" PRIu64
				       " bytes, expected %" PRIu64,
				       hex, sides[k]->role, ev.bytes, bytes);
				ok = false;
			}
		}
		if (ok) {
			char err[512];
			uint32_t skip = x[i].skip_tokens /
					env->d.pool.layout.block_tokens;

			if (pb_verify(&env->d.pool, x[i].seed, x[i].dst, x[i].n,
				      skip, err, sizeof(err))) {
				h_note("%s: data mismatch: %s", hex, err);
				ok = false;
			}
		}
		if (!ok)
			bad++;
	}
	return bad;
}

int h_run(struct h_env *env, struct h_xfer *x, size_t count)
{
	h_prepare(env, x, count);
	if (h_post_recv(env, x, count) || h_post_send(env, x, count))
		return (int)count;
	for (uint32_t l = 0; l < env->p.pool.layout.layers; l++) {
		/* half the transfers carry a first token to the receiver,
		 * a third bytes of meta (one of them as many as can be) */
		for (size_t i = 0; l == 0 && i < count; i++) {
			static uint8_t meta[PDX_META_MAX];

			x[i].token = i % 2 ? (int64_t)(x[i].seed % 100000) : -1;
			x[i].meta_len = i % 3 ? 0
					: i == 3 ? PDX_META_MAX
						 : 1 + (uint32_t)(x[i].seed % 3000);
			h_meta(&x[i], meta);
			if (x[i].token >= 0 &&
			    pdx_engine_token(env->p.eng, &x[i].id,
					     (uint32_t)x[i].token)) {
				CHECK_FAIL("pdx_engine_token failed");
				return (int)count;
			}
			if (x[i].meta_len &&
			    pdx_engine_meta(env->p.eng, &x[i].id, meta,
					    x[i].meta_len)) {
				CHECK_FAIL("pdx_engine_meta failed");
				return (int)count;
			}
		}
		if (h_layer_done(env, l, x, count))
			return (int)count;
	}
	return h_expect_ok(env, x, count, 10000);
}
