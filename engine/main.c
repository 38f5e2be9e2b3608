/* pdx-engine: options, the KV pool, the scheduler and the HTTP front on
 * one libevent loop, with the link to its pdx-agent (--agent); SIGTERM,
 * SIGINT or SIGHUP end it cleanly. A tensor-parallel instance's leader adds its
 * link to the other ranks (tp_leader.h); a follower rank runs its pool,
 * its agent link and its link to the leader only (tp_follower.h). */
#define PDX_LOG_TOPIC "engine"
#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/hangup.h"
#include "common/http_listen.h"
#include "common/log.h"
#include "common/shm_object.h"
#include "common/version.h"
#include "engine/http_api.h"
#include "engine/kv_link.h"
#include "engine/kv_pool.h"
#include "engine/metrics.h"
#include "engine/opts.h"
#include "engine/scheduler.h"
#include "engine/tp_follower.h"
#include "engine/tp_leader.h"

struct engine {
	struct pdx_engine_opts o;
	struct event_base *base;
	struct event *sigterm, *sigint, *sighup;
	struct pdx_kv_pool *pool;
	struct pdx_sched *sched;
	struct pdx_kv_link *link; /* --agent */
	struct pdx_http_api *http;
	struct pdx_engine_metrics metrics;
	struct pdx_tp_leader *tp;	/* rank 0 of --tp-size > 1 */
	struct pdx_sched_mirror mirror; /* ... its passes to the others */
	struct pdx_tp_follower *follower; /* --tp-rank > 0 */
};

/* The TP leader's reports, to the link and the scheduler. */
static void on_rank_event(void *arg, uint32_t rank,
			  const struct pdx_engine_event *ev)
{
	struct engine *e = arg;

	pdx_kv_link_rank_event(e->link, rank, ev);
}

static void on_caught_up(void *arg)
{
	struct engine *e = arg;

	pdx_sched_resume(e->sched);
}

static void on_broken(void *arg, const char *why)
{
	struct engine *e = arg;

	pdx_kv_link_fail_all(e->link, why);
	pdx_sched_resume(e->sched); /* nobody waits for a rank gone */
}

static pdx_status_t mirror_pass(void *arg, const struct pdx_synth_run *runs,
				size_t n)
{
	return pdx_tp_leader_step(arg, runs, n);
}

static bool mirror_caught_up(void *arg)
{
	return pdx_tp_leader_caught_up(arg);
}

/* Rank 0 of a TP instance: the link to the others, under the agent link
 * and the scheduler. */
static int tp_lead(struct engine *e, struct pdx_sched_params *sp)
{
	struct pdx_tp_leader_params tp = {
	    .base = e->base,
	    .addr = e->o.tp_leader,
	    .size = e->o.tp_size,
	    .model = e->o.model->name,
	    .role = e->o.role,
	    .blocks = e->o.kv_blocks,
	    .block_tokens = e->o.model->block_tokens,
	    .liveness_ms = e->o.agent_liveness_ms,
	    .cbs = {.event = on_rank_event,
		    .caught_up = on_caught_up,
		    .broken = on_broken,
		    .arg = e},
	};
	char err[256];

	if (pdx_tp_leader_new(&tp, &e->tp, err, sizeof(err)) != PDX_OK) {
		log_error("tensor-parallel leader: %s", err);
		return 1;
	}
	e->mirror = (struct pdx_sched_mirror){.pass = mirror_pass,
					      .caught_up = mirror_caught_up,
					      .arg = e->tp};
	sp->mirror = &e->mirror;
	log_info("tensor-parallel rank 0 of %u: the others join at %s",
		 e->o.tp_size, e->o.tp_leader);
	return 0;
}

/* A follower rank: no scheduler, no HTTP. */
static int tp_follow(struct engine *e)
{
	struct pdx_tp_follower_params fp = {
	    .base = e->base,
	    .leader = e->o.tp_leader,
	    .rank = e->o.tp_rank,
	    .size = e->o.tp_size,
	    .model = e->o.model->name,
	    .role = e->o.role,
	    .pool = e->pool,
	    .link = e->link,
	    .liveness_ms = e->o.agent_liveness_ms,
	};
	char err[256];

	if (pdx_tp_follower_new(&fp, &e->follower, err, sizeof(err)) !=
	    PDX_OK) {
		log_error("tensor-parallel follower: %s", err);
		return 1;
	}
	log_info("model %s, %u kv blocks (%.1f MiB) in %s", e->o.model->name,
		 e->o.kv_blocks, (double)pdx_kv_pool_size(e->pool) / (1 << 20),
		 pdx_kv_pool_where(e->pool));
	log_info("tensor-parallel rank %u of %u: following the leader at %s",
		 e->o.tp_rank, e->o.tp_size, e->o.tp_leader);
	return 0;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct engine *e = arg;

	log_info("signal %d: shutting down", (int)sig);
	event_base_loopexit(e->base, NULL);
}

/* Until the loop runs, a signal ends the engine at once. Its wait at
 * start for its agent's answer to register (10 s) took SIGTERM and
 * SIGINT, which libevent keeps for a loop not yet running, and waited
 * on: Ctrl-C on an engine given a wrong --agent did nothing for 10 s (a
 * new user's find). Only async-signal-safe calls: the KV pool's name
 * unlinked (its memory goes with the process), then the signal again,
 * to its default. */
static char starting_pool[64];

static void on_signal_starting(int sig)
{
	static const char said[] = "pdx-engine: a signal while starting: "
				   "exiting\n";
	struct sigaction dfl = {.sa_handler = SIG_DFL};

	if (write(STDERR_FILENO, said, sizeof(said) - 1) < 0)
		(void)0; /* nobody to tell */
	if (starting_pool[0])
		shm_unlink(starting_pool);
	/* ended by the signal, as a supervisor expects (an exit status
	 * of 128 + sig reads as a failure to systemd) */
	sigemptyset(&dfl.sa_mask);
	sigaction(sig, &dfl, NULL);
	raise(sig);
	_exit(128 + sig); /* not reached */
}

/* SIGTERM, SIGINT and (hup) SIGHUP to fn, SIG_DFL included */
static void signals_to(void (*fn)(int), bool hup)
{
	struct sigaction sa = {.sa_handler = fn};

	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	if (hup)
		sigaction(SIGHUP, &sa, NULL);
}

/* Once started: the loop's, which stop it cleanly (libevent's handlers
 * replace the ones above). */
static int signals_running(struct engine *e, bool hup)
{
	/* libevent puts back the handler it found when its event is freed:
	 * the default, not on_signal_starting (a second SIGTERM at the end
	 * of a clean stop said "while starting") */
	signals_to(SIG_DFL, hup);
	e->sigterm = evsignal_new(e->base, SIGTERM, on_signal, e);
	e->sigint = evsignal_new(e->base, SIGINT, on_signal, e);
	if (hup)
		e->sighup = evsignal_new(e->base, SIGHUP, on_signal, e);
	if (!e->sigterm || !e->sigint || (hup && !e->sighup) ||
	    evsignal_add(e->sigterm, NULL) || evsignal_add(e->sigint, NULL) ||
	    (e->sighup && evsignal_add(e->sighup, NULL)))
		return 1;
	return 0;
}

/* A disaggregated engine whose queue outwaits its KV wait: a decode
 * request may still be queued here when its prefill side (the same
 * options, as deployments have them) gave its KV up, and it fails then
 * (502). Allowed, as the two sides may differ; said once at start. */
static void warn_timeouts(const struct pdx_engine_opts *o)
{
	if (o->role == PDX_ROLE_BOTH ||
	    (o->queue_timeout_ms && o->queue_timeout_ms < o->kv_timeout_ms))
		return;
	log_warn("--queue-timeout-ms %u is not under --kv-timeout-ms %u: a "
		 "request queued that long loses its KV on a prefill side "
		 "with the same options (docs/engine.md)",
		 o->queue_timeout_ms, o->kv_timeout_ms);
}

/* A pool that cannot hold one request of --max-model-len tokens: each
 * longer one is refused (400), though --max-model-len (and /v1/models,
 * a proxy's view of it) says it fits. vLLM refuses to start so; allowed
 * here (tests run small pools), said once at start. */
static void warn_pool_small(const struct pdx_engine_opts *o)
{
	uint64_t tokens = (uint64_t)o->kv_blocks * o->model->block_tokens;

	if (tokens >= o->max_model_len)
		return;
	log_warn("--kv-blocks %u holds %llu tokens, fewer than "
		 "--max-model-len %u: a request of more (prompt plus "
		 "max_tokens) is refused with 400",
		 o->kv_blocks, (unsigned long long)tokens, o->max_model_len);
}

/* The KV pool's shm_open() name, unique on this /dev/shm. The pid alone
 * is not: engines in containers sharing /dev/shm (docker --ipc=host) are
 * each PID 1 of their own namespace, and a pid is reused after an engine
 * killed with -9 left its pool behind; the same name once made the second
 * engine unlink the first one's live pool (whose agent then mapped the
 * other's KV when it registered again), or, as another user, fail. */
static void pool_name(char *out, size_t len)
{
	uint32_t r = 0;

	if (getrandom(&r, sizeof(r), 0) != sizeof(r))
		r = (uint32_t)pdx_now_ns();
	snprintf(out, len, "/pdx-engine-%d-%08x", (int)getpid(), r);
}

/* Descriptors the engine holds besides its clients': the pool, the
 * agent link and ZeroMQ's, the TP links, the listener, logs. */
#define FDS_RESERVE 64

/* Raises the soft limit on file descriptors to the hard one, and says
 * when it cannot hold a client per request the engine takes (running and
 * queued): past it accept() fails, connections wait unanswered, and the
 * proxy's health checks fail with them (an engine under ulimit -n 64
 * went out of rotation under 100 clients, with nothing said at start). */
static void nofile_check(const struct pdx_engine_opts *o)
{
	rlim_t limit = pdx_nofile_raise();
	rlim_t want = (rlim_t)o->max_num_seqs + o->max_waiting + FDS_RESERVE;

	/* ranks above 0 serve no HTTP: no clients */
	if (o->tp_rank == 0 && limit != RLIM_INFINITY && limit < want)
		log_warn("file descriptors (ulimit -n): %llu, short of the %llu "
			 "that --max-num-seqs %u and --max-waiting %u clients "
			 "take: past about %llu at once, connections wait "
			 "unanswered and health checks fail (raise ulimit -n, "
			 "or lower --max-waiting)",
			 (unsigned long long)limit, (unsigned long long)want,
			 o->max_num_seqs, o->max_waiting,
			 (unsigned long long)(limit > FDS_RESERVE
						  ? limit - FDS_RESERVE
						  : 0));
}

/* The link to --agent, registered (none without one). */
static int link_agent(struct engine *e)
{
	char err[256];

	if (!e->o.agent)
		return 0;
	if (pdx_kv_link_new(e->base, e->o.agent, e->o.agent_liveness_ms,
			    e->pool, e->o.tp_rank, e->o.tp_size, &e->link, err,
			    sizeof(err)) != PDX_OK) {
		log_error("agent: %s", err);
		return 1;
	}
	log_info("agent %s, peer address %s", e->o.agent,
		 pdx_kv_link_peer(e->link));
	return 0;
}

/* Returns the exit status when it cannot start (1; 77 when the KV pool
 * wants a CUDA device there is none of), else 0. */
static int engine_start(struct engine *e)
{
	bool hup;
	struct pdx_kv_pool_params pp = {
	    .mem = e->o.kv_mem,
	    .cuda_device = e->o.cuda_device,
	    .model = e->o.model,
	    .blocks = e->o.kv_blocks,
	    .prefault = true,
	    .tp_size = e->o.tp_size,
	    .tp_rank = e->o.tp_rank,
	    .prefix_cache = e->o.prefix_cache == 1,
	};
	struct pdx_sched_params sp = {
	    .model = e->o.model,
	    .time_scale = e->o.time_scale,
	    .max_num_seqs = e->o.max_num_seqs,
	    .max_waiting = e->o.max_waiting,
	    .queue_timeout_ms = e->o.queue_timeout_ms,
	    .max_prefill_tokens = e->o.max_prefill_tokens,
	};
	struct pdx_http_api_params hp = {
	    .host = e->o.host,
	    .port = e->o.port,
	    .model = e->o.model,
	    .max_model_len = e->o.max_model_len,
	    .metrics = &e->metrics,
	};
	char err[256], url[PDX_HTTP_URL_MAX];
	pdx_status_t st;
	int swept;

	e->base = event_base_new();
	/* three priorities: everything at the default (1) but the
	 * scheduler's steps (2, scheduler.h) */
	if (!e->base || event_base_priority_init(e->base, 3))
		return 1;
	/* a closed terminal: stop cleanly (the pool unlinked), not by
	 * SIGHUP's default action; ignored when we started (nohup), it
	 * stays so */
	hup = !pdx_sighup_ignored();
	pool_name(starting_pool, sizeof(starting_pool));
	signals_to(on_signal_starting, hup);
	swept = pdx_shm_object_sweep("pdx-engine-",
				     PDX_SHM_OBJECT_SWEEP_MIN_AGE_S);
	if (swept)
		log_info("removed %d KV pool(s) left in /dev/shm by engines "
			 "that died", swept);
	pp.shm_name = starting_pool;
	st = pdx_kv_pool_new(&pp, &e->pool, err, sizeof(err));
	if (st != PDX_OK) {
		log_error("kv pool: %s", err);
		return st == PDX_ENOENT ? 77 : 1;
	}
	if (e->o.tp_rank > 0) /* no HTTP: rank 0's */
		return link_agent(e) || tp_follow(e) ? 1
						     : signals_running(e, hup);
	if (e->o.tp_size > 1 && tp_lead(e, &sp))
		return 1;
	sp.base = e->base;
	sp.pool = e->pool;
	st = pdx_sched_new(&sp, &e->sched);
	if (st != PDX_OK) {
		log_error("scheduler: %s", pdx_status_str(st));
		return 1;
	}
	warn_timeouts(&e->o);
	warn_pool_small(&e->o);
	hp.base = e->base;
	hp.sched = e->sched;
	hp.pool = e->pool;
	hp.role = pdx_engine_role_name(e->o.role);
	hp.agent = e->o.agent;
	hp.kv_timeout_ms = e->o.kv_timeout_ms;
	hp.kv_quarantine_ms = e->o.kv_quarantine_ms;
	hp.queue_timeout_ms = e->o.queue_timeout_ms;
	/* the port before the agent: a second engine started by mistake
	 * with this one's options took the registration, failed to bind,
	 * and left the agent to a dead engine (this one: "another engine
	 * registered with this agent" until restarted). Bound, not
	 * listening: a client that connects while the agent is waited for
	 * (up to 10 s) is refused, not accepted and left unanswered. */
	st = pdx_http_api_new(&hp, &e->http, err, sizeof(err));
	if (st != PDX_OK) {
		log_error("http: %s", st == PDX_ENOMEM ? "out of memory" : err);
		return 1;
	}
	/* an IPv6 address in brackets: the line is pasted into --decode */
	pdx_http_url(url, sizeof(url), e->o.host, pdx_http_api_port(e->http),
		     "");
	if (e->o.agent)
		log_info("registering with agent %s; %s refuses connections "
			 "until it answers",
			 e->o.agent, url);
	if (link_agent(e) || signals_running(e, hup))
		return 1;
	pdx_http_api_set_link(e->http, e->link);
	if (e->tp && e->link)
		pdx_kv_link_set_tp(e->link, e->tp, e->o.tp_size);
	if (pdx_http_api_serve(e->http, err, sizeof(err)) != PDX_OK) {
		log_error("http: %s", err);
		return 1;
	}
	log_info("model %s, %u kv blocks (%.1f MiB) in %s, time scale %g",
		 e->o.model->name, e->o.kv_blocks,
		 (double)pdx_kv_pool_size(e->pool) / (1 << 20),
		 pdx_kv_pool_where(e->pool), e->o.time_scale);
	log_info("listening on %s", url);
	return 0;
}

/* Reverse order of engine_start(); the HTTP front first, as it aborts the
 * scheduler's requests. */
static void engine_stop(struct engine *e)
{
	pdx_http_api_free(e->http);
	pdx_sched_free(e->sched);
	pdx_tp_follower_free(e->follower);
	pdx_kv_link_free(e->link);
	pdx_tp_leader_free(e->tp);
	pdx_kv_pool_free(e->pool);
	if (e->sigint)
		event_free(e->sigint);
	if (e->sigterm)
		event_free(e->sigterm);
	if (e->sighup)
		event_free(e->sighup);
	if (e->base)
		event_base_free(e->base);
}

int main(int argc, char **argv)
{
	struct engine e = {0};
	char err[256];
	int rc;

	switch (pdx_engine_opts_parse(argc, argv, &e.o, err, sizeof(err))) {
	case PDX_OPTS_HELP:
		pdx_engine_opts_usage(stdout);
		return 0;
	case PDX_OPTS_VERSION:
		pdx_version_print("pdx-engine");
		return 0;
	case PDX_OPTS_BAD:
		fprintf(stderr, "pdx-engine: %s (see --help)\n", err);
		return 2;
	case PDX_OPTS_RUN:
		break;
	}
	pdx_log_prefix("engine");
	nofile_check(&e.o);
	signal(SIGPIPE, SIG_IGN);
	rc = engine_start(&e);
	if (rc == 0 && event_base_dispatch(e.base) != 0)
		rc = 1;
	if (e.follower && pdx_tp_follower_failed(e.follower))
		rc = 1;
	engine_stop(&e);
	return rc;
}
