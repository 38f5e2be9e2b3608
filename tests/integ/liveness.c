/* liveness: leases, heartbeats and the gap between layers.
 *
 * The agents run with short bounds (heartbeat 200 ms, a peer silent for
 * 1000 ms is dead, lease 800 ms, 2500 ms between layers) and a transfer
 * timeout long enough (20 s) that only those bounds can end a transfer:
 *  - a decode request queued for three leases (pdx_engine_hold) still gets
 *    its KV: the heartbeats renewed the lease;
 *  - KV no receiver holds or asks for is freed once its lease expires,
 *    and a receiver that asks later hears why at once;
 *  - a held request that leaves frees the sender's KV at once;
 *  - a stopped (SIGSTOP) receiver or sender agent is declared dead by the
 *    other within the silence bound, and by its own engine's link within
 *    its liveness bound (the transfer fails there once, by the link);
 *    after it resumes the engine registers again by itself and every
 *    transfer works again;
 *  - a prefill engine that stops producing layers fails its transfer at
 *    the layer bound, on both sides.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "tests/integ/harness.h"

#define BEAT_MS 200
#define SILENT_MS 1000
#define LEASE_MS 800
#define LAYER_MS 2500
#define SLACK_MS 1500

static double since_ms(uint64_t t0)
{
	return (double)(pdx_now_ns() - t0) / 1e6;
}

/* The event about x on side s is "failed" with status, within
 * [lo, bound + SLACK_MS] ms of t0, and its reason holds `says`. */
static void expect_failed(struct h_side *s, const struct h_xfer *x,
			  pdx_status_t status, const char *says, uint64_t t0,
			  int lo, int bound, const char *what)
{
	struct pdx_engine_event ev;
	double ms;

	if (h_wait(s, &x->id, bound + SLACK_MS, &ev)) {
		CHECK(false, "%s: the %s engine hears within %d ms", what,
		      s->role, bound + SLACK_MS);
		return;
	}
	ms = since_ms(t0);
	CHECK(ev.kind == PDX_EVENT_FAILED && ev.status == status &&
		      strstr(ev.reason, says),
	      "%s: the %s engine gets failed, %s, \"%s\" (got %s, %s: %s)",
	      what, s->role, pdx_status_str(status), says, h_kind(ev.kind),
	      pdx_status_str(ev.status), ev.reason);
	CHECK(ms >= lo && ms <= bound + SLACK_MS,
	      "%s: after %.0f ms (bound %d ms)", what, ms, bound);
}

static void all_layers(struct h_env *env, struct h_xfer *x)
{
	for (uint32_t l = 0; l < env->p.pool.layout.layers; l++)
		h_layer_done(env, l, x, 1);
}

/* One transfer announced and computed on the prefill side, nobody on the
 * decode side asking yet. */
static void sent_unasked(struct h_env *env, struct h_xfer *x)
{
	h_plan(env, x, 1, 6, 0, true);
	h_prepare(env, x, 1);
	h_post_send(env, x, 1);
	all_layers(env, x);
}

static void works_again(struct h_env *env, const char *after)
{
	struct h_xfer ok[4];

	h_plan(env, ok, 4, 0, 8, true);
	CHECK(h_run(env, ok, 4) == 0, "transfers after %s work", after);
	h_plan_free(ok, 4);
}

static void held_past_lease(struct h_env *env)
{
	struct h_xfer x[1];

	sent_unasked(env, x);
	CHECK(pdx_engine_hold(env->d.eng, &x->id, env->p.peer) == PDX_OK,
	      "the decode engine holds the request");
	CHECK(h_quiet(&env->p, &x->id, 3 * LEASE_MS) == 0,
	      "held for three leases: the prefill side keeps its KV");
	h_post_recv(env, x, 1);
	CHECK(h_expect_ok(env, x, 1, 5000) == 0,
	      "the held request then gets every byte");
	h_plan_free(x, 1);
}

static void lease_expires(struct h_env *env)
{
	struct h_xfer x[1];
	uint64_t t0;

	t0 = pdx_now_ns();
	sent_unasked(env, x);
	expect_failed(&env->p, x, PDX_ETIMEDOUT, "lease expired", t0,
		      LEASE_MS - 100, LEASE_MS, "nobody asks");
	CHECK(h_quiet(&env->d, &x->id, 0) == 0,
	      "nobody asks: the decode engine hears nothing");
	t0 = pdx_now_ns();
	h_post_recv(env, x, 1);
	expect_failed(&env->d, x, PDX_ECANCELED, "lease expired", t0, 0, 0,
		      "asking after the lease");
	h_plan_free(x, 1);
}

static void held_then_left(struct h_env *env)
{
	struct h_xfer x[1];
	uint64_t t0;

	sent_unasked(env, x);
	pdx_engine_hold(env->d.eng, &x->id, env->p.peer);
	h_sleep_ms(3 * BEAT_MS);
	t0 = pdx_now_ns();
	pdx_engine_abort_at(env->d.eng, &x->id, env->p.peer);
	expect_failed(&env->p, x, PDX_ECANCELED, "queued", t0, 0, 200,
		      "a held request leaves");
	CHECK(h_quiet(&env->d, &x->id, 0) == 0,
	      "a held request leaves: no event on the decode side");
	h_plan_free(x, 1);
}

/* The decode side gives up (abort_at) before the prefill engine announced
 * its send, and that send is open (no receiver named; the id is the
 * credential): it fails at once, not after its lease. */
static void aborted_before_open_send(struct h_env *env)
{
	struct h_xfer x[1];
	uint64_t t0;

	h_plan(env, x, 1, 4, 0, true);
	h_prepare(env, x, 1);
	pdx_engine_abort_at(env->d.eng, &x->id, env->p.peer);
	h_sleep_ms(300); /* the abort reaches the prefill agent first */
	t0 = pdx_now_ns();
	CHECK_EQ(pdx_engine_send(env->p.eng, &x->id, NULL, x->src, x->n),
		 PDX_OK, "an open send of the aborted transfer is announced");
	expect_failed(&env->p, x, PDX_ECANCELED, "aborted by", t0, 0, 200,
		      "an open send aborted before it was announced");
	h_plan_free(x, 1);
}

/* SIGSTOP the agent of `stopped` mid-transfer: the other side fails the
 * transfer by silence; then it resumes. */
static void agent_stalls(struct h_env *env, struct h_side *stopped)
{
	struct h_side *other = stopped == &env->d ? &env->p : &env->d;
	struct pdx_engine_event ev;
	struct h_xfer x[1];
	char what[64];
	uint64_t t0;
	long mark = h_log_mark(&env->d);

	snprintf(what, sizeof(what), "the %s agent stops", stopped->role);
	h_plan(env, x, 1, 6, 0, true);
	h_prepare(env, x, 1);
	h_post_recv(env, x, 1);
	h_post_send(env, x, 1);
	h_layer_done(env, 0, x, 1);
	/* the transfer is under way once the decode agent sent its "want"
	 * (a sleep of 100 ms was not always enough: a decode agent stopped
	 * before it did left the send unasked, and the prefill side failed
	 * it by its lease, 800 ms, before any silence) */
	CHECK(h_log_wait(&env->d, mark, "want to", 1, 5000, NULL) >= 0,
	      "%s: the decode agent sent its want", what);
	h_sleep_ms(100);
	t0 = pdx_now_ns();
	kill(stopped->agent.pid, SIGSTOP);
	/* silence counts from the last word heard, a heartbeat up to
	 * BEAT_MS before t0 */
	expect_failed(other, x, PDX_EPEER, "silent", t0, SILENT_MS - BEAT_MS,
		      SILENT_MS + BEAT_MS, what);
	/* its own engine's link notices the hang (liveness_ms, 1000 by
	 * default), without waiting for the agent to resume: the event was
	 * made when the link was found lost (t_last) */
	if (h_wait(stopped, &x->id, SLACK_MS, &ev) == 0) {
		double ms = (double)(ev.t_last_ns - t0) / 1e6;

		CHECK(ev.kind == PDX_EVENT_FAILED && ev.status == PDX_EAGENT &&
			      strstr(ev.reason, "link to the agent was lost"),
		      "%s: its own engine gets failed, its agent went away "
		      "(got %s, %s: %s)",
		      what, h_kind(ev.kind), pdx_status_str(ev.status),
		      ev.reason);
		CHECK(ms <= 1000 + 250,
		      "%s: its own engine's link noticed after %.0f ms "
		      "(liveness 1000 ms)",
		      what, ms);
	} else {
		CHECK(false, "%s: its own engine hears while the agent is "
			     "stopped", what);
	}
	kill(stopped->agent.pid, SIGCONT);
	CHECK(h_link_up(stopped, 3000) == 0,
	      "%s: resumed, its engine registers again by itself", what);
	CHECK(h_quiet(stopped, &x->id, 300) == 0,
	      "%s: resumed and registered again, its engine hears nothing "
	      "more of the transfer (what its agent says of it is dropped)",
	      what);
	h_plan_free(x, 1);
	works_again(env, what);
}

static void layers_stop(struct h_env *env)
{
	struct h_xfer x[1];
	uint64_t t0;

	h_plan(env, x, 1, 6, 0, true);
	h_prepare(env, x, 1);
	h_post_recv(env, x, 1);
	h_post_send(env, x, 1);
	t0 = pdx_now_ns();
	h_layer_done(env, 0, x, 1);
	expect_failed(&env->p, x, PDX_ETIMEDOUT, "no layer computed", t0,
		      LAYER_MS - 100, LAYER_MS, "layers stop");
	expect_failed(&env->d, x, PDX_ECANCELED, "no layer computed", t0,
		      LAYER_MS - 100, LAYER_MS, "layers stop");
	h_plan_free(x, 1);
}

/* A second engine registers with the decode agent (two engines given one
 * agent, e.g. TP ranks sharing an address): the first is told. Its link
 * status says why, its receive in flight fails at once (the agent sends
 * that event to the other), and it does not register again by itself
 * (the two would take turns); pdx_engine_register() makes it the served
 * one again. Before, it looked healthy and its receive waited for the
 * transfer's bound. */
static void displaced(struct h_env *env)
{
	struct pdx_engine_params ep = { .agent = env->d.engine_addr };
	struct pdx_engine *other = NULL;
	struct pdx_engine_event ev;
	struct h_xfer x[1];
	char why[PDX_REASON_MAX], peer[PDX_ADDR_MAX];
	uint64_t t0;
	bool got;
	long mark;

	h_plan(env, x, 1, 4, 4, true);
	h_post_recv(env, x, 1);
	mark = h_log_mark(&env->d);
	CHECK(pdx_engine_connect(&ep, &other) == PDX_OK &&
		      pb_register_retry(other, &env->d.pool, peer, sizeof(peer),
					5000, NULL) == PDX_OK,
	      "a second engine registers with the decode agent");
	t0 = pdx_now_ns();
	memset(&ev, 0, sizeof(ev));
	got = h_wait(&env->d, &x->id, 3000, &ev) == 0;
	CHECK(got && ev.kind == PDX_EVENT_FAILED &&
		      ev.status == PDX_ENOTREG &&
		      strstr(ev.reason, "another engine registered"),
	      "the first engine's receive fails at once, saying why (%s: %s, "
	      "after %.0f ms)",
	      pdx_status_str(ev.status), ev.reason, since_ms(t0));
	CHECK(pdx_engine_link_status(env->d.eng, why, sizeof(why)) ==
			  PDX_EPEER &&
		      strstr(why, "another engine registered") &&
		      strstr(why, "until it is started again"),
	      "its link status says so, and what to do: %s", why);
	CHECK(h_log_wait(&env->d, mark, "that one is displaced", 1, 2000,
			 NULL) >= 0,
	      "the agent warns of it (it said so at info, of the lane only)");
	h_sleep_ms(3 * BEAT_MS);
	(void)h_quiet(&env->d, &x->id, 10);
	CHECK(pdx_engine_link_status(other, NULL, 0) == PDX_OK,
	      "it did not register again by itself: the other is served");
	CHECK(pdx_engine_recv(env->d.eng, &x->id, env->p.peer, x->dst, x->n,
			      0) == PDX_EPEER,
	      "its announcements fail at once");
	CHECK(pb_register_retry(env->d.eng, &env->d.pool, env->d.peer,
				sizeof(env->d.peer), 5000, NULL) == PDX_OK,
	      "registering again makes it the served one");
	(void)h_quiet(&env->d, &x->id, 10);
	pdx_engine_free(other);
	h_plan_free(x, 1);
}

int main(int argc, char **argv)
{
	struct h_opts o = { 0 };
	struct h_env env;

	/* "fastbeat": heartbeats every millisecond, the same silence bound.
	 * A beat late by a few ms once counted as the agent's own stall,
	 * which restarts every peer's silence: at that rate on a busy host
	 * every beat did, and a stopped peer was never found dead (the
	 * transfer waited for its 20 s bound). */
	bool fast = argc > 2 && strcmp(argv[2], "fastbeat") == 0;

	h_note("liveness: leases, heartbeats, the gap between layers%s",
	       fast ? " (heartbeat every 1 ms)" : "");
	o.xfer_timeout_ms = 20000;
	o.agent_logs = true; /* agent_stalls waits for the "want" */
	o.agent_args[0] = "--heartbeat-ms";
	o.agent_args[1] = fast ? "1" : "200";
	o.agent_args[2] = "--peer-timeout-ms";
	o.agent_args[3] = "1000";
	o.agent_args[4] = "--lease-ms";
	o.agent_args[5] = "800";
	o.agent_args[6] = "--layer-timeout-ms";
	o.agent_args[7] = "2500";
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		return h_finish(&env);
	}
	works_again(&env, "setup");
	if (fast) {
		agent_stalls(&env, &env.d);
		agent_stalls(&env, &env.p);
		return h_finish(&env);
	}
	held_past_lease(&env);
	lease_expires(&env);
	held_then_left(&env);
	aborted_before_open_send(&env);
	agent_stalls(&env, &env.d);
	agent_stalls(&env, &env.p);
	layers_stop(&env);
	displaced(&env);
	works_again(&env, "all of it");
	return h_finish(&env);
}
