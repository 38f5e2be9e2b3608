/* netns: the two agents in two network namespaces joined by a veth pair
 * (10.77.0.1/24 and 10.77.0.2/24), UCX over TCP; the engines stay in this
 * namespace (ipc:// paths work across network namespaces). Transfers are
 * byte-exact; a link cut mid-transfer fails it on both sides within the
 * heartbeats' bound, and transfers work once it is back. Needs root and `ip netns`; exits 77 when namespaces cannot
 * be made.
 *
 *   netns PATH-TO-pdx-agent [firewall | return_path | ucx_cut | reset]
 *
 * firewall: each namespace's firewall lets in only its agent's peer port
 * (deployment.md: a firewall must allow UCX's ports too; this one does
 * not). A transfer then fails within its bound, and the agents' loops go
 * on meanwhile: UCX's TCP connect() blocked one for the kernel's SYN
 * retries (about 130 s), deaf to its engine. Exits 77 without iptables.
 *
 * return_path: the decode namespace drops connections to its agent's
 * peer port from outside, its own connections there pass: the decode
 * agent's probe of its own address comes back, the prefill agent cannot
 * answer its hello (return_path() says what it checks).
 *
 * ucx_cut: the decode namespace resets UCX's connections, not ZeroMQ's,
 * then lets them in again (ucx_cut() says what it checks); reset: it
 * resets all TCP from the prefill namespace for a while (reset_all()).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "tests/integ/harness.h"

#define N 8
#define SILENT_MS 1000
#define SILENT_STR "1000"
#define CUT_MS 6000 /* reset: how long */

static char ns_a[32], ns_b[32], veth_a[16], veth_b[16];
static bool made_a, made_b;

static int ip(const char *a0, const char *a1, const char *a2, const char *a3,
	      const char *a4, const char *a5, const char *a6, const char *a7)
{
	const char *argv[] = { "ip", a0, a1, a2, a3, a4, a5, a6, a7, NULL };

	return pb_run(argv, true);
}

static void ns_teardown(void)
{
	if (made_a)
		ip("netns", "del", ns_a, NULL, NULL, NULL, NULL, NULL);
	if (made_b)
		ip("netns", "del", ns_b, NULL, NULL, NULL, NULL, NULL);
	made_a = made_b = false;
}

static int ns_setup(void)
{
	int pid = (int)getpid();

	snprintf(ns_a, sizeof(ns_a), "pdxA%d", pid);
	snprintf(ns_b, sizeof(ns_b), "pdxB%d", pid);
	snprintf(veth_a, sizeof(veth_a), "pxa%d", pid % 10000000);
	snprintf(veth_b, sizeof(veth_b), "pxb%d", pid % 10000000);
	if (ip("netns", "add", ns_a, NULL, NULL, NULL, NULL, NULL))
		return -1;
	made_a = true;
	pb_cleanup_hook(ns_teardown);
	if (ip("netns", "add", ns_b, NULL, NULL, NULL, NULL, NULL))
		return -1;
	made_b = true;
	if (ip("link", "add", veth_a, "type", "veth", "peer", "name", veth_b) ||
	    ip("link", "set", veth_a, "netns", ns_a, NULL, NULL, NULL) ||
	    ip("link", "set", veth_b, "netns", ns_b, NULL, NULL, NULL) ||
	    ip("-n", ns_a, "addr", "add", "10.77.0.1/24", "dev", veth_a, NULL) ||
	    ip("-n", ns_b, "addr", "add", "10.77.0.2/24", "dev", veth_b, NULL) ||
	    ip("-n", ns_a, "link", "set", veth_a, "up", NULL, NULL) ||
	    ip("-n", ns_b, "link", "set", veth_b, "up", NULL, NULL) ||
	    ip("-n", ns_a, "link", "set", "lo", "up", NULL, NULL) ||
	    ip("-n", ns_b, "link", "set", "lo", "up", NULL, NULL))
		return -1;
	return 0;
}

/* One transfer of blocks blocks, planned, its pools filled, announced on
 * both sides. */
static void posted(struct h_env *env, struct h_xfer *x, uint32_t blocks)
{
	h_plan(env, x, 1, blocks, 0, true);
	h_prepare(env, x, 1);
	h_post_recv(env, x, 1);
	h_post_send(env, x, 1);
}

/* Layers first to the last of x computed. */
static void layers_from(struct h_env *env, struct h_xfer *x, uint32_t first)
{
	for (uint32_t l = first; l < env->p.pool.layout.layers; l++)
		h_layer_done(env, l, x, 1);
}

/* The link goes down mid-transfer: both engines hear "failed" once the
 * heartbeats go unanswered; with the link back, transfers work again. */
static void link_cut(struct h_env *env)
{
	struct pdx_engine_event ev;
	struct h_xfer x[1], ok[4];
	uint64_t t0;
	double ms;

	posted(env, x, 16);
	h_layer_done(env, 0, x, 1);
	h_sleep_ms(200);
	t0 = pdx_now_ns();
	CHECK(ip("-n", ns_a, "link", "set", veth_a, "down", NULL, NULL) == 0,
	      "link cut: %s down", veth_a);
	layers_from(env, x, 1);
	for (int side = 0; side < 2; side++) {
		struct h_side *s = side ? &env->p : &env->d;

		if (h_wait(s, &x->id, SILENT_MS + 3000, &ev)) {
			CHECK(false, "link cut: the %s engine hears within %d ms",
			      s->role, SILENT_MS + 3000);
			continue;
		}
		ms = (double)(pdx_now_ns() - t0) / 1e6;
		CHECK(ev.kind == PDX_EVENT_FAILED && ms <= SILENT_MS + 3000,
		      "link cut: the %s engine gets failed after %.0f ms (%s: %s)",
		      s->role, ms, pdx_status_str(ev.status), ev.reason);
	}
	h_plan_free(x, 1);
	CHECK(ip("-n", ns_a, "link", "set", veth_a, "up", NULL, NULL) == 0,
	      "link cut: %s up again", veth_a);
	h_plan(env, ok, 4, 0, 16, true);
	CHECK(h_run(env, ok, 4) == 0, "link cut: transfers after it work");
	h_plan_free(ok, 4);
}

/* ns resets (tcp-reset) every TCP connection from its peer but the peer
 * link's: to our port, and from theirs: UCX's data lane is cut, ZeroMQ's
 * control link stays. */
static int reset_ucx(const char *ns, const char *veth, const char *ours,
		     const char *theirs)
{
	const char *to[] = { "ip", "netns", "exec", ns, "iptables", "-A",
			     "INPUT", "-i", veth, "-p", "tcp", "--dport",
			     strrchr(ours, ':') + 1, "-j", "ACCEPT", NULL };
	const char *from[] = { "ip", "netns", "exec", ns, "iptables", "-A",
			       "INPUT", "-i", veth, "-p", "tcp", "--sport",
			       strrchr(theirs, ':') + 1, "-j", "ACCEPT", NULL };
	const char *reset[] = { "ip", "netns", "exec", ns, "iptables", "-A",
				"INPUT", "-i", veth, "-p", "tcp", "-j",
				"REJECT", "--reject-with", "tcp-reset", NULL };

	return pb_run(to, true) || pb_run(from, true) || pb_run(reset, true);
}

/* The decode namespace's firewall rules go: the link is whole again. */
static int heal(void)
{
	const char *flush[] = { "ip", "netns", "exec", ns_b, "iptables", "-F",
				"INPUT", NULL };

	return pb_run(flush, true);
}

/* UCX's connections reset while ZeroMQ's stay (a partition of the data
 * lane alone): the transfer under way fails on both sides within the
 * heartbeats' bound. Healed, the very next transfers work: the sender,
 * whose endpoint had failed, refused the receiver's want for want of a
 * handshake, and the receiver, still holding one, failed the transfer
 * instead of meeting the sender again (the first request after a heal
 * got a 502). */
static void ucx_cut(struct h_env *env)
{
	struct pdx_engine_event ev;
	struct h_xfer x[1], ok[4];
	uint64_t t0;
	double ms;

	h_plan(env, ok, 1, 0, 16, true);
	CHECK(h_run(env, ok, 1) == 0, "UCX cut: a transfer before it works");
	h_plan_free(ok, 1);
	CHECK(reset_ucx(ns_b, veth_b, env->d.listen, env->p.listen) == 0,
	      "UCX cut: %s resets all but the peer link", ns_b);
	posted(env, x, 16);
	t0 = pdx_now_ns();
	layers_from(env, x, 0);
	for (int side = 0; side < 2; side++) {
		struct h_side *s = side ? &env->p : &env->d;
		bool got = h_wait(s, &x->id, 5 * SILENT_MS + 3000, &ev) == 0;

		ms = (double)(pdx_now_ns() - t0) / 1e6;
		CHECK(got && ev.kind == PDX_EVENT_FAILED &&
			      ms <= 2 * SILENT_MS + 1000,
		      "UCX cut: the %s engine gets failed within %d ms (after "
		      "%.0f ms: %s)",
		      s->role, 2 * SILENT_MS + 1000, ms,
		      got ? ev.reason : "no event");
	}
	h_plan_free(x, 1);
	CHECK(heal() == 0, "UCX cut: healed");
	h_plan(env, ok, 4, 0, 16, true);
	CHECK(h_run(env, ok, 4) == 0, "UCX cut: the transfers right after work");
	h_plan_free(ok, 4);
}

/* The decode namespace resets every TCP packet from the prefill one for
 * a while, mid-transfer (a partition by resets: a firewall, a
 * middlebox). Healed, the next transfers work at once: the decode
 * agent's ZeroMQ connection to the prefill agent, whose far end was
 * reset (the resets went one way), looked established to its kernel,
 * and what it sent after the heal waited behind a backed-off
 * retransmission (requests failed for ~6 s after a 5 s cut). */
static void reset_all(struct h_env *env)
{
	const char *reset[] = { "ip", "netns", "exec", ns_b, "iptables", "-A",
				"INPUT", "-i", veth_b, "-p", "tcp", "-j",
				"REJECT", "--reject-with", "tcp-reset", NULL };
	struct pdx_engine_event ev;
	struct h_xfer x[1], ok[4];
	uint64_t t0;
	double ms;
	int bad;

	h_plan(env, ok, 1, 0, 16, true);
	CHECK(h_run(env, ok, 1) == 0, "resets: a transfer before works");
	h_plan_free(ok, 1);
	posted(env, x, 16);
	h_layer_done(env, 0, x, 1);
	t0 = pdx_now_ns();
	CHECK(pb_run(reset, true) == 0, "resets: %s resets all TCP for %d ms",
	      ns_b, CUT_MS);
	layers_from(env, x, 1);
	for (int side = 0; side < 2; side++) /* failed, at its bound */
		h_wait(side ? &env->p : &env->d, &x->id, CUT_MS, &ev);
	h_sleep_ms(CUT_MS - (long)((pdx_now_ns() - t0) / 1000000));
	h_plan_free(x, 1);
	CHECK(heal() == 0, "resets: healed");
	h_plan(env, ok, 4, 0, 16, true);
	t0 = pdx_now_ns();
	bad = h_run(env, ok, 4);
	ms = (double)(pdx_now_ns() - t0) / 1e6;
	CHECK(bad == 0 && ms < 2000,
	      "resets: the transfers right after work, in %.0f ms (< 2000)",
	      ms);
	h_plan_free(ok, 4);
}

/* ns lets in, over veth, TCP to port and the connections it made */
static int firewall(const char *ns, const char *veth, const char *listen)
{
	const char *port = strrchr(listen, ':') + 1;
	const char *accept_port[] = { "ip", "netns", "exec", ns, "iptables",
				      "-A", "INPUT", "-i", veth, "-p", "tcp",
				      "--dport", port, "-j", "ACCEPT", NULL };
	const char *accept_est[] = { "ip", "netns", "exec", ns, "iptables",
				     "-A", "INPUT", "-i", veth, "-m", "state",
				     "--state", "ESTABLISHED,RELATED", "-j",
				     "ACCEPT", NULL };
	const char *drop[] = { "ip", "netns", "exec", ns, "iptables", "-A",
			       "INPUT", "-i", veth, "-p", "tcp", "-j", "DROP",
			       NULL };

	return pb_run(accept_port, true) || pb_run(accept_est, true) ||
	       pb_run(drop, true);
}

/* Behind those firewalls: the transfer fails within the peers' silence
 * bound, both engines told why (the prefill agent's UCX operations
 * finished nothing: before, each waited for --xfer-timeout-ms and heard
 * only "timed out ... waiting for the sender"), and meanwhile the decode
 * agent answers its engine at once (a recv naming a block past the pool
 * fails by return). */
static void firewalled(struct h_env *env)
{
	struct pdx_engine_event ev;
	struct h_xfer x[1], bad[1];
	uint64_t t0;
	double ms;
	bool got;

	posted(env, x, 4);
	t0 = pdx_now_ns();
	layers_from(env, x, 0);
	h_sleep_ms(500); /* the handshake's UCX endpoints: connecting */
	h_plan(env, bad, 1, 1, 0, true);
	bad->dst[0] = env->o.pool_blocks; /* past the pool */
	h_post_recv(env, bad, 1);
	got = h_wait(&env->d, &bad->id, 1500, &ev) == 0;
	ms = (double)(pdx_now_ns() - t0) / 1e6;
	CHECK(got && ev.kind == PDX_EVENT_FAILED,
	      "firewall: the decode agent answers its engine meanwhile (a bad "
	      "recv fails at once, %.0f ms after the transfer began)", ms);
	for (int side = 0; side < 2; side++) {
		struct h_side *s = side ? &env->p : &env->d;

		got = h_wait(s, &x->id, 15000, &ev) == 0;
		ms = (double)(pdx_now_ns() - t0) / 1e6;
		CHECK(got && ev.kind == PDX_EVENT_FAILED &&
			      ms < 3 * SILENT_MS + 1500 &&
			      strstr(ev.reason, "must let UCX's ports through"),
		      "firewall: the %s engine's transfer fails within %d ms "
		      "saying why (after %.0f ms: %s)",
		      s->role, 3 * SILENT_MS + 1500, ms,
		      got ? ev.reason : "no event in 15 s");
	}
	h_plan_free(bad, 1);
	h_plan_free(x, 1);
}

/* The decode agent's port is open to its own namespace only (a firewall
 * that lets in local connections, or a name only its own host resolves):
 * its probe comes back, but the prefill agent's answer to its hello goes
 * nowhere. The prefill agent says so over the hello's own connection,
 * and the decode side's transfer fails at its hello's bound blaming its
 * own --advertise (EIO: a decode engine answers 500, and a proxy opens
 * its breaker, not the prefill instance's); the prefill agent logs it.
 * The old agents failed it EPEER, "no answer to our hello from P": every
 * prefill instance was blamed. */
static void return_path(struct h_env *env)
{
	const char *drop[] = { "ip", "netns", "exec", ns_b, "iptables", "-A",
			       "INPUT", "-i", veth_b, "-p", "tcp", "--dport",
			       strrchr(env->d.listen, ':') + 1, "-j", "DROP",
			       NULL };
	struct pdx_engine_event ev;
	struct h_xfer x[1], ok[2];
	long mark = h_log_mark(&env->p);
	uint64_t t0;
	double ms;
	bool got;

	CHECK(pb_run(drop, true) == 0, "return path: %s drops TCP to %s from "
	      "outside", ns_b, env->d.listen);
	posted(env, x, 4);
	t0 = pdx_now_ns();
	layers_from(env, x, 0);
	got = h_wait(&env->d, &x->id, 6500, &ev) == 0;
	ms = (double)(pdx_now_ns() - t0) / 1e6;
	CHECK(got && ev.kind == PDX_EVENT_FAILED && ev.status == PDX_EIO &&
		      strstr(ev.reason, "cannot reach") &&
		      strstr(ev.reason, env->d.peer),
	      "return path: the decode engine's transfer fails EIO naming its "
	      "own address, at the hello's bound (after %.0f ms: %s %s)", ms,
	      got ? pdx_status_str(ev.status) : "no event",
	      got ? ev.reason : "");
	CHECK(h_log_wait(&env->p, mark, "cannot reach it there to answer its "
			 "hello", 1, 1000, NULL) >= 0,
	      "return path: the prefill agent says it cannot answer the "
	      "decode agent there");
	h_wait(&env->p, &x->id, 15000, &ev); /* its side ends at its bound */
	h_plan_free(x, 1);
	CHECK(heal() == 0, "return path: healed");
	/* the prefill agent's connect there, its SYN dropped, ends at its
	 * bound (1 s) before the next one joins: its pings until then go
	 * unheard, and its silence bound here is 1 s */
	h_sleep_ms(1500);
	h_plan(env, ok, 2, 0, 16, true);
	CHECK(h_run(env, ok, 2) == 0, "return path: the transfers after it work");
	h_plan_free(ok, 2);
}

int main(int argc, char **argv)
{
	struct h_opts o = { 0 };
	struct h_env env;
	struct h_xfer x[N];
	bool fw = argc > 2 && !strcmp(argv[2], "firewall");
	bool ucx = argc > 2 && !strcmp(argv[2], "ucx_cut");
	bool rst = argc > 2 && !strcmp(argv[2], "reset");
	bool ret = argc > 2 && !strcmp(argv[2], "return_path");
	const char *iptables[] = { "iptables", "--version", NULL };
	int bad;

	h_note("netns: agents in two network namespaces over a veth pair, UCX tcp%s",
	       fw ? ", behind firewalls" : ucx ? ", UCX's connections cut" :
	       rst ? ", TCP reset for a while" :
	       ret ? ", the decode agent's port open to its own namespace only" : "");
	if ((fw || ucx || rst || ret) && pb_run(iptables, true)) {
		h_note("SKIP: no iptables");
		return H_SKIP;
	}
	pb_cleanup_install();
	if (geteuid() != 0 || ns_setup()) {
		ns_teardown();
		h_note("SKIP: cannot create network namespaces and a veth pair (needs root and ip netns)");
		return H_SKIP;
	}
	h_note("namespaces %s (10.77.0.1 on %s) and %s (10.77.0.2 on %s)", ns_a,
	       veth_a, ns_b, veth_b);
	o.tls = "tcp,self";
	o.netns_p = ns_a;
	o.netns_d = ns_b;
	o.host_p = "10.77.0.1";
	o.host_d = "10.77.0.2";
	o.xfer_timeout_ms = 10000;
	o.agent_logs = ret; /* return_path waits for the prefill agent's word */
	/* reset: the defaults, whose backed-off retransmissions outlast
	 * a cut of a few seconds */
	o.agent_args[0] = "--heartbeat-ms";
	o.agent_args[1] = rst ? "1000" : "200";
	o.agent_args[2] = "--peer-timeout-ms";
	o.agent_args[3] = rst ? "5000" : SILENT_STR;
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
	} else if (fw) {
		CHECK(firewall(ns_a, veth_a, env.p.listen) == 0 &&
			      firewall(ns_b, veth_b, env.d.listen) == 0,
		      "firewalls: only the agents' peer ports let in");
		firewalled(&env);
	} else if (ucx) {
		ucx_cut(&env);
	} else if (rst) {
		reset_all(&env);
	} else if (ret) {
		return_path(&env);
	} else {
		CHECK(strstr(env.p.peer, "10.77.0.1") && strstr(env.d.peer, "10.77.0.2"),
		      "peer addresses are the namespaces' (%s, %s)", env.p.peer,
		      env.d.peer);
		h_plan(&env, x, N, 0, 16, true);
		bad = h_run(&env, x, N);
		CHECK_EQ(bad, 0, "%d random-block transfers across namespaces are byte-exact",
		      N);
		h_plan_free(x, N);
		h_plan(&env, x, N, 32, 0, false);
		bad = h_run(&env, x, N);
		CHECK_EQ(bad, 0, "%d contiguous transfers across namespaces are byte-exact",
		      N);
		h_plan_free(x, N);
		link_cut(&env);
	}
	bad = h_finish(&env); /* stops the agents first */
	ns_teardown();
	return bad;
}
