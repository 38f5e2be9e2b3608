/* pdx-agent: the sidecar that moves one engine's KV cache to and from the
 * agents beside other engines. One thread, one libevent loop. */
#define PDX_LOG_TOPIC "main"
#include <errno.h>
#include <getopt.h>
#include <net/if.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zmq.h>

#include "agent/agent.h"
#include "common/http_listen.h"
#include "common/ipc_path.h"
#include "common/hangup.h"
#include "common/log.h"
#include "common/shm_object.h"
#include "common/tcp_addr.h"
#include "common/version.h"

#define MAX_MSG_BYTES (64 << 20)
/* While data moves, poll UCX this long past the last completion before
 * sleeping; an idle agent never spins. */
#define SPIN_NS 200000
/* While UCX has work it cannot wake us for (pdx_ucx_progress() says so),
 * poll it this often: a send to a stalled peer must not keep the loop from
 * everything else. */
static const struct timeval UCX_POLL = { 0, 1000 }, UCX_NOW = { 0, 0 };
/* At most this long in UCX's progress per turn of the loop while
 * completions keep coming: the engine link, the peers and the timers
 * (heartbeats) get their turn between. */
#define PROGRESS_BUDGET_NS 1000000

/* UCX's shared-memory transports map their segments in /dev/shm: full,
 * UCX's start fails with no more than "i/o failure" from us (UCX's own
 * line says "Not enough memory"). Says how full it is when it is. */
static const char *shm_room_hint(void)
{
	static char hint[192];
	struct statvfs v;
	uint64_t avail;

	if (statvfs("/dev/shm", &v) != 0)
		return "";
	avail = (uint64_t)v.f_bavail * v.f_frsize;
	if (avail >= (64ULL << 20))
		return "";
	snprintf(hint, sizeof(hint),
		 " (/dev/shm has %llu MiB free of %llu MiB; UCX's shared-"
		 "memory transports need room there: 13 MiB or more for an "
		 "agent)",
		 (unsigned long long)(avail >> 20),
		 (unsigned long long)(((uint64_t)v.f_blocks * v.f_frsize) >>
				      20));
	return hint;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: pdx-agent --engine ipc://PATH --listen tcp://HOST:PORT [options]\n"
		"\n"
		"The sidecar beside one engine: maps its KV memory, handshakes with\n"
		"peer agents and pushes KV blocks layer by layer over UCX.\n"
		"\n"
		"  --engine ADDR           engine link (ZeroMQ ROUTER), ipc://PATH\n"
		"  --engine-direct on|off  offer the engine a direct lane beside it, a\n"
		"                          plain Unix socket that wakes fewer threads per\n"
		"                          message (docs/protocol.md; default on)\n"
		"  --listen ADDR           peer link (ZeroMQ ROUTER), tcp://HOST:PORT\n"
		"  --advertise ADDR        peer address given to others (default: --listen)\n"
		"  --notify ADDR           push transfer events to a collector, tcp://HOST:PORT\n"
		"                          (repeatable, 4 at most: each gets every event)\n"
		"  --metrics HOST:PORT     serve Prometheus metrics at /metrics there\n"
		"                          (off by default; port 0: any free port)\n"
		"  --data-path MODE        auto (default); host memory: ipc, put or am\n"
		"                          (docs/architecture.md); GPU memory: cuda-put,\n"
		"                          cuda-ipc or staged (docs/gpu.md)\n"
		"  --pull                  receiving, read the sender's blocks once all\n"
		"                          layers are computed instead of having each\n"
		"                          layer pushed, unless the engine's recv says\n"
		"                          (host memory, ipc and put lanes; default: push)\n"
		"  --staging-mb N          GPU memory, staged path: pinned host buffers\n"
		"                          (and as much GPU memory) at most (default 256)\n"
		"  --staging-chunk-mb N    one staged message at most (default 16; the\n"
		"                          receiver's must be at least the sender's)\n"
		"  --xfer-timeout-ms N     bound on one transfer (default 30000)\n"
		"  --handshake-timeout-ms N bound on a handshake (default 5000)\n"
		"  --lease-ms N            a sent prompt's KV is kept this long for a\n"
		"                          receiver that has not asked for it, renewed\n"
		"                          while its engine queues it (default 10000)\n"
		"  --layer-timeout-ms N    bound between two computed layers (default 10000)\n"
		"  --heartbeat-ms N        ping period to peers with transfers (default 1000)\n"
		"  --peer-timeout-ms N     silence that declares such a peer dead\n"
		"                          (default 5000)\n"
		"  --max-xfers N           live transfers at most (default 4096)\n"
		"  --curve-key FILE        secure the peer link with CURVE: our key\n"
		"                          pair (docs/security.md); needs --curve-peers\n"
		"  --curve-peers FILE      members: lines \"tcp://HOST:PORT PUBLIC-KEY\"\n"
		"  --curve-keygen FILE     write a new key pair to FILE, print its\n"
		"                          public key, and exit\n"
		"  --log-level LEVEL       error, warn, info (default) or debug\n"
		"  --version               print \"pdx-agent VERSION\" and exit\n"
		"  -h, --help              this text\n"
		"\n"
		"UCX reads its own UCX_* variables (e.g. UCX_TLS=tcp); PDX_LOG_LEVEL\n"
		"sets the log level like --log-level.\n");
}

static int parse_u32(const char *s, uint32_t *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || end == s || v > UINT32_MAX)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

/* Whether addr's host names a network interface of this host, as
 * ZeroMQ's bind takes it (before a host name): peers cannot connect to
 * it as given. */
static bool host_is_interface(const char *addr)
{
	char host[IF_NAMESIZE];

	return pdx_tcp_addr_host(addr, host, sizeof(host)) &&
	       if_nametoindex(host) != 0;
}

static bool port_zero(const char *addr)
{
	const char *colon = strrchr(addr, ':');

	return colon && strcmp(colon, ":0") == 0;
}

static int parse_args(int argc, char **argv, struct agent_config *c)
{
	static const struct option opts[] = {
		{ "engine", required_argument, NULL, 'e' },
		{ "engine-direct", required_argument, NULL, 'D' },
		{ "listen", required_argument, NULL, 'l' },
		{ "advertise", required_argument, NULL, 'a' },
		{ "notify", required_argument, NULL, 'n' },
		{ "metrics", required_argument, NULL, 'R' },
		{ "data-path", required_argument, NULL, 'd' },
		{ "pull", no_argument, NULL, 'U' },
		{ "xfer-timeout-ms", required_argument, NULL, 't' },
		{ "handshake-timeout-ms", required_argument, NULL, 'H' },
		{ "lease-ms", required_argument, NULL, 'E' },
		{ "layer-timeout-ms", required_argument, NULL, 'Y' },
		{ "heartbeat-ms", required_argument, NULL, 'B' },
		{ "peer-timeout-ms", required_argument, NULL, 'P' },
		{ "max-xfers", required_argument, NULL, 'm' },
		{ "staging-mb", required_argument, NULL, 'S' },
		{ "staging-chunk-mb", required_argument, NULL, 'C' },
		{ "curve-key", required_argument, NULL, 'K' },
		{ "curve-peers", required_argument, NULL, 'M' },
		{ "curve-keygen", required_argument, NULL, 'G' },
		{ "log-level", required_argument, NULL, 'L' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	int o;

	*c = agent_config_defaults();
	int at = -1;

	while ((o = getopt_long(argc, argv, "h", opts, &at)) != -1) {
		switch (o) {
		case 'e': c->engine_addr = optarg; break;
		case 'l': c->listen_addr = optarg; break;
		case 'a': c->advertise = optarg; break;
		case 'n':
			if (c->n_notify == NOTIFY_MAX) {
				fprintf(stderr, "pdx-agent: --notify: at most %d "
					"collectors\n", NOTIFY_MAX);
				return -1;
			}
			c->notify_addr[c->n_notify++] = optarg;
			break;
		case 'R': {
			char host[PDX_ADDR_MAX];
			uint16_t port;

			if (metrics_addr_parse(optarg, host, sizeof(host), &port)) {
				fprintf(stderr, "pdx-agent: --metrics %s: want "
					"HOST:PORT, the port 0 to 65535\n", optarg);
				return -1;
			}
			c->metrics_addr = optarg;
			break;
		}
		case 'U': c->pull = true; break;
		case 'D':
			if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
				fprintf(stderr, "pdx-agent: --engine-direct must be on or off\n");
				return -1;
			}
			c->no_engine_direct = !strcmp(optarg, "off");
			break;
		case 'K': c->curve_key = optarg; break;
		case 'M': c->curve_peers = optarg; break;
		case 'G': {
			char err[512];

			if (pdx_curve_keygen(optarg, err, sizeof(err))) {
				fprintf(stderr, "pdx-agent: %s\n", err);
				exit(1);
			}
			exit(0);
		}
		case 'd': {
			int i = DATA_AUTO;

			while (i <= DATA_STAGED &&
			       strcmp(optarg, data_path_key(i)) != 0)
				i++;
			if (i > DATA_STAGED) {
				fprintf(stderr, "pdx-agent: --data-path must be auto, ipc, put, am, cuda-put, cuda-ipc or staged\n");
				return -1;
			}
			c->data_path = (enum data_path)i;
			break;
		}
		case 't':
		case 'H':
		case 'E':
		case 'Y':
		case 'B':
		case 'P':
		case 'S':
		case 'C':
		case 'm': {
			uint32_t *dst = o == 't'   ? &c->xfer_timeout_ms
					: o == 'H' ? &c->handshake_timeout_ms
					: o == 'E' ? &c->lease_ms
					: o == 'Y' ? &c->layer_timeout_ms
					: o == 'B' ? &c->heartbeat_ms
					: o == 'P' ? &c->peer_timeout_ms
					: o == 'S' ? &c->staging_mb
					: o == 'C' ? &c->staging_chunk_mb
						   : &c->max_xfers;
			if (parse_u32(optarg, dst) || *dst == 0) {
				fprintf(stderr, "pdx-agent: --%s %s: want an "
					"integer from 1 to 4294967295\n",
					at >= 0 ? opts[at].name : "?", optarg);
				return -1;
			}
			break;
		}
		case 'L':
			if (pdx_log_set_level(optarg)) {
				fprintf(stderr, "pdx-agent: unknown log level %s\n", optarg);
				return -1;
			}
			break;
		case 'V':
			pdx_version_print("pdx-agent");
			exit(0);
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "pdx-agent: unexpected argument %s\n", argv[optind]);
		return -1;
	}
	if (!c->curve_key != !c->curve_peers) {
		fprintf(stderr, "pdx-agent: --curve-key and --curve-peers go together\n");
		return -1;
	}
	if (c->peer_timeout_ms <= c->heartbeat_ms) {
		fprintf(stderr, "pdx-agent: --peer-timeout-ms must exceed --heartbeat-ms\n");
		return -1;
	}
	if (!c->engine_addr || strncmp(c->engine_addr, "ipc://", 6) != 0 ||
	    !c->listen_addr || strncmp(c->listen_addr, "tcp://", 6) != 0) {
		fprintf(stderr, "pdx-agent: --engine ipc://PATH and --listen tcp://HOST:PORT are required\n");
		usage(stderr);
		return -1;
	}
	for (unsigned i = 0; i < 2 + c->n_notify; i++) {
		const char *name[] = { "--listen", "--advertise", "--notify" };
		const char *addr = i == 0   ? c->listen_addr
				   : i == 1 ? c->advertise
					    : c->notify_addr[i - 2];
		char why[256];

		if (addr && !pdx_tcp_addr_ok(addr, i == 0, why, sizeof(why))) {
			fprintf(stderr, "pdx-agent: %s %s\n", name[i < 2 ? i : 2],
				why);
			return -1;
		}
	}
	/* what peers are given must reach us: they connected to 0.0.0.0,
	 * themselves */
	if (!c->advertise && pdx_tcp_addr_wildcard(c->listen_addr)) {
		fprintf(stderr, "pdx-agent: --listen %s listens on every "
			"address: give --advertise tcp://HOST:PORT, the one "
			"peers reach this agent at\n", c->listen_addr);
		return -1;
	}
	/* advertised as given, it failed every transfer we send: the
	 * receiver's answers went to an address nobody can connect to */
	if (!c->advertise && host_is_interface(c->listen_addr) &&
	    !port_zero(c->listen_addr)) {
		fprintf(stderr, "pdx-agent: --listen %s names a network "
			"interface, which peers cannot connect to: give "
			"--advertise tcp://HOST:PORT, the address they reach "
			"this agent at\n", c->listen_addr);
		return -1;
	}
	/* the same, given: ZeroMQ's connect reads the host as a name */
	if (c->advertise && host_is_interface(c->advertise)) {
		fprintf(stderr, "pdx-agent: --advertise %s names a network "
			"interface, which peers cannot connect to: give this "
			"host's name or IP address there\n", c->advertise);
		return -1;
	}
	return 0;
}

/* Reads every message waiting on a ROUTER; returns how many. The ZeroMQ fd
 * is edge-triggered, so the loop settles by draining until nothing is left. */
static int drain_router(struct agent *a, void *sock, bool engine)
{
	int n = 0;

	for (;;) {
		zmq_msg_t id, body;
		int more;
		size_t more_len = sizeof(more);

		zmq_msg_init(&id);
		if (zmq_msg_recv(&id, sock, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&id);
			return n;
		}
		zmq_msg_init(&body);
		zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &more_len);
		if (!more || zmq_msg_recv(&body, sock, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&id);
			zmq_msg_close(&body);
			continue;
		}
		/* Multi-frame bodies are not part of the protocol: skip. */
		zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &more_len);
		while (more) {
			zmq_msg_t extra;

			zmq_msg_init(&extra);
			zmq_msg_recv(&extra, sock, ZMQ_DONTWAIT);
			zmq_msg_close(&extra);
			zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &more_len);
		}
		if (engine) {
			/* a connection closed before this one took its
			 * descriptor, or this one's (engine_watch.c) */
			engine_watch_drain(a);
			a->engine_msg_fd = zmq_msg_get(&body, ZMQ_SRCFD);
			if (engine_watch_closed(a, a->engine_msg_fd)) {
				log_debug("a message from an engine connection "
					  "that closed: dropped");
			} else {
				engine_direct_catch_up(a, zmq_msg_data(&id),
						       zmq_msg_size(&id));
				engine_on_msg(a, zmq_msg_data(&id),
					      zmq_msg_size(&id),
					      zmq_msg_data(&body),
					      zmq_msg_size(&body));
			}
			a->engine_msg_fd = -1;
		}
		else {
			a->peer_route = zmq_msg_data(&id);
			a->peer_route_len = zmq_msg_size(&id);
			peer_on_msg(a, zmq_msg_data(&body), zmq_msg_size(&body),
				    a->curve ? zmq_msg_gets(&body, "User-Id")
					     : NULL);
			a->peer_route = NULL;
		}
		zmq_msg_close(&id);
		zmq_msg_close(&body);
		n++;
	}
}

/* Runs everything that is ready until nothing is: messages on both
 * routers, UCX completions (which may send messages), and again. */
void agent_settle(struct agent *a)
{
	enum pdx_ucx_more more;
	int n;

	a->turn_ns = pdx_now_ns();
	do {
		n = a->zap_sock ? pdx_curve_zap_drain(a->curve, a->zap_sock) : 0;
		n += drain_router(a, a->engine_sock, true);
		n += drain_router(a, a->peer_sock, false);
		more = pdx_ucx_progress(a->ucx, a->ops_inflight ? SPIN_NS : 0,
					PROGRESS_BUDGET_NS);
	} while (n > 0);
	/* a timer, not event_active(): libevent would run an event active
	 * again in the same pass, before looking at the fds */
	if (more == PDX_UCX_MORE)
		evtimer_add(a->ucx_poll_ev, &UCX_NOW);
	else if (more == PDX_UCX_POLL && !evtimer_pending(a->ucx_poll_ev, NULL))
		evtimer_add(a->ucx_poll_ev, &UCX_POLL);
	xfers_reap(a);
	peers_kept_release(a);
	registrations_left_release(a);
}

/* A transfer's outcome reaches the engine, the collector and the peer
 * through these (xfer.c calls nothing above itself). */
static const struct xfer_ops xfer_ops = {
	.engine_event = engine_send_event,
	.notify = notify_xfer,
	.tell_peer = peer_send_to_addr,
	.legs_decided = tp_legs_decided,
	.stop_flush = complete_stop_flush,
};

static void on_ready(evutil_socket_t fd, short what, void *arg)
{
	agent_settle(arg);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct agent *a = arg;

	log_info("signal %d: stopping", (int)sig);
	event_base_loopexit(a->base, NULL);
}

static int read_line(const char *path, char *out, size_t len)
{
	FILE *f = fopen(path, "r");

	if (!f)
		return -1;
	if (!fgets(out, (int)len, f)) {
		fclose(f);
		return -1;
	}
	fclose(f);
	out[strcspn(out, "\n")] = '\0';
	return 0;
}

/* Two agents can reach each other through shared memory when they share a
 * kernel boot and the IPC and PID namespaces (UCX's posix and cma paths). */
static void host_identity(char *out, size_t len)
{
	char boot[64] = "?";
	struct stat ipc = { 0 }, pid = { 0 };

	read_line("/proc/sys/kernel/random/boot_id", boot, sizeof(boot));
	stat("/proc/self/ns/ipc", &ipc);
	stat("/proc/self/ns/pid", &pid);
	snprintf(out, len, "%s/%lu/%lu", boot, (unsigned long)ipc.st_ino,
		 (unsigned long)pid.st_ino);
}

/* A socket of ours, bound at bind_addr when given: an ipc:// path only
 * when no one else has it, its file then recorded in *ipc. */
static void *zsock(struct agent *a, int type, const char *bind_addr,
		   bool curve, struct pdx_ipc_path *ipc)
{
	void *s = zmq_socket(a->zctx, type);
	struct pdx_ipc_path unused;
	char err[512];
	int linger = 0, hwm = 10000;
	int64_t max = MAX_MSG_BYTES;

	if (!s)
		return NULL;
	if (!ipc)
		ipc = &unused;
	zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
	zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm));
	zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof(hwm));
	zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max, sizeof(max));
	if (curve && pdx_curve_server(a->curve, s)) {
		log_error("CURVE options on %s: %s", bind_addr,
			  zmq_strerror(zmq_errno()));
		zmq_close(s);
		return NULL;
	}
	if (bind_addr && pdx_ipc_bind(s, zmq_bind, bind_addr, "agent", ipc,
				      err, sizeof(err))) {
		log_error("%s", err);
		zmq_close(s);
		return NULL;
	}
	return s;
}

static struct event *watch_fd(struct agent *a, int fd)
{
	struct event *ev = event_new(a->base, fd, EV_READ | EV_PERSIST, on_ready, a);

	if (ev)
		event_add(ev, NULL);
	return ev;
}

static int zfd(void *sock)
{
	int fd = -1;
	size_t len = sizeof(fd);

	zmq_getsockopt(sock, ZMQ_FD, &fd, &len);
	return fd;
}

/* CURVE on the peer link: keys, members, and the ZAP handler that vets
 * each connection (bound before the peer link, so none goes unvetted). */
static int curve_start(struct agent *a)
{
	char err[512];

	if (pdx_curve_new(a->cfg.curve_key, a->cfg.curve_peers, &a->curve, err,
			  sizeof(err))) {
		log_error("%s", err);
		return -1;
	}
	a->zap_sock = zmq_socket(a->zctx, ZMQ_REP);
	if (!a->zap_sock || zmq_bind(a->zap_sock, "inproc://zeromq.zap.01") < 0) {
		log_error("ZAP handler: %s", zmq_strerror(zmq_errno()));
		return -1;
	}
	a->zap_ev = watch_fd(a, zfd(a->zap_sock));
	if (!a->zap_ev)
		return -1;
	log_info("peer link secured with CURVE (members in %s)",
		 a->cfg.curve_peers);
	return 0;
}

/* GPU staging left in /dev/shm by agents of this user that died (256 MiB
 * each by default, kill -9): nobody holds its lock (staged.c). */
static void sweep_staging(void)
{
	int n = pdx_shm_object_sweep("pdx-staging-",
				     PDX_SHM_OBJECT_SWEEP_MIN_AGE_S);

	if (n)
		log_info("removed %d staging buffer(s) left in /dev/shm by "
			 "agents that died", n);
}

/* SIGHUP was ignored when we started (nohup, a supervisor that ignores
 * it): a hangup does not stop us. Read before any library's constructor
 * runs (.preinit_array): UCX's replaces the disposition with its debug
 * handler (UCX_DEBUG_SIGNO) before main(). */
static bool hup_ignored;

static void hup_note(int argc, char **argv, char **envp)
{
	(void)argc;
	(void)argv;
	(void)envp;
	hup_ignored = pdx_sighup_ignored();
}

typedef void (*preinit_fn)(int, char **, char **);
__attribute__((section(".preinit_array"),
	       used)) static const preinit_fn hup_note_at_start = hup_note;

/* Raises the soft limit on file descriptors to the hard one (a shell's
 * 1024 holds about 320 peers, under PEERS_MAX; the agent kept it), and
 * says when even that holds fewer than PEERS_MAX: past it, peers'
 * connections fail (those to us without a word from ZeroMQ:
 * peer_watch.c says them). */
static unsigned long long nofile_raise(void)
{
	rlim_t limit = pdx_nofile_raise();
	rlim_t want = AGENT_FDS_BASE + (rlim_t)AGENT_FDS_PER_PEER * PEERS_MAX;

	if (limit != RLIM_INFINITY && limit < want)
		log_warn("file descriptors: the limit is %llu (ulimit -n, "
			 "raised to its hard limit): about %llu peers fit of "
			 "the %d an agent may know; past that, connections to "
			 "and from peers fail",
			 (unsigned long long)limit,
			 (unsigned long long)(limit > AGENT_FDS_BASE
						  ? (limit - AGENT_FDS_BASE) /
							AGENT_FDS_PER_PEER
						  : 0),
			 PEERS_MAX);
	return limit;
}

static int agent_start(struct agent *a)
{
	pdx_status_t st;

	a->nofile = nofile_raise();
	a->xfer_ops = &xfer_ops;
	a->settle = agent_settle;
	a->peer_return = &peer_return_ops;
	if (getrandom(&a->instance, sizeof(a->instance), 0) != sizeof(a->instance))
		return -1;
	host_identity(a->host_id, sizeof(a->host_id));
	sweep_staging();
	snprintf(a->peer_addr, sizeof(a->peer_addr), "%s",
		 a->cfg.advertise ? a->cfg.advertise : a->cfg.listen_addr);
	a->base = event_base_new();
	a->zctx = zmq_ctx_new();
	if (!a->base || !a->zctx)
		return -1;
	st = pdx_ucx_new(&a->ucx);
	if (st) {
		log_error("ucx init failed: %s%s", pdx_status_str(st),
			  shm_room_hint());
		return -1;
	}
	st = push_am_register(a);
	if (st) {
		log_error("ucx active-message handlers: %s", pdx_status_str(st));
		return -1;
	}
	if (a->cfg.curve_key && curve_start(a))
		return -1;
	if (metrics_start(a)) /* logged before the engine link is bound */
		return -1;
	/* a path another agent serves, another user's, or no socket at all
	 * is refused (ZeroMQ's bind would take it): common/ipc_path.h */
	a->engine_sock = zsock(a, ZMQ_ROUTER, a->cfg.engine_addr, false,
			       &a->engine_ipc);
	a->peer_sock = zsock(a, ZMQ_ROUTER, a->cfg.listen_addr, a->curve, NULL);
	if (!a->engine_sock || !a->peer_sock)
		return -1;
	if (!a->cfg.advertise && /* port 0: the one the kernel picked */
	    !strcmp(strrchr(a->cfg.listen_addr, ':'), ":0")) {
		size_t len = sizeof(a->peer_addr);

		zmq_getsockopt(a->peer_sock, ZMQ_LAST_ENDPOINT, a->peer_addr,
			       &len);
	}
	for (unsigned i = 0; i < a->cfg.n_notify; i++) {
		struct notify_target *t = &a->notify[i];
		int hwm = 1000;

		t->addr = a->cfg.notify_addr[i];
		t->sock = zsock(a, ZMQ_PUSH, NULL, false, NULL);
		if (!t->sock)
			return -1;
		zmq_setsockopt(t->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
		if (notify_watch(a, t, i) || zmq_connect(t->sock, t->addr) < 0) {
			log_error("cannot connect to collector %s: %s", t->addr,
				  zmq_strerror(zmq_errno()));
			return -1;
		}
	}
	if (!a->cfg.no_engine_direct &&
	    engine_direct_listen(a, engine_on_msg))
		return -1;
	a->engine_msg_fd = -1;
	if (engine_watch_start(a) || peer_watch_start(a) ||
	    advertise_check_start(a)) {
		log_error("link monitor: %s", zmq_strerror(zmq_errno()));
		return -1;
	}
	a->engine_ev = watch_fd(a, zfd(a->engine_sock));
	a->peer_ev = watch_fd(a, zfd(a->peer_sock));
	a->ucx_ev = watch_fd(a, pdx_ucx_fd(a->ucx));
	a->ucx_poll_ev = evtimer_new(a->base, on_ready, a);
	a->sig_int = evsignal_new(a->base, SIGINT, on_signal, a);
	a->sig_term = evsignal_new(a->base, SIGTERM, on_signal, a);
	/* SIGHUP stops us as SIGTERM does: else UCX's debug signal
	 * (UCX_DEBUG_SIGNO, HUP by default) took it and turned its logging
	 * to DEBUG for good, while the engine and proxy beside us exited */
	/* ignored when we started (nohup, a supervisor): it stays so, UCX's
	 * handler undone */
	if (hup_ignored)
		signal(SIGHUP, SIG_IGN);
	else
		a->sig_hup = evsignal_new(a->base, SIGHUP, on_signal, a);
	if (!a->engine_ev || !a->peer_ev || !a->ucx_ev || !a->ucx_poll_ev ||
	    !a->sig_int || !a->sig_term || (!hup_ignored && !a->sig_hup))
		return -1;
	event_add(a->sig_int, NULL);
	event_add(a->sig_term, NULL);
	if (a->sig_hup)
		event_add(a->sig_hup, NULL);
	a->ended = pdx_ended_new(a->cfg.max_xfers);
	if (!a->ended)
		return -1;
	return liveness_start(a);
}

/* agent_start() with SIGINT, SIGTERM and SIGHUP held until our handlers
 * are in (its end), then released: one that came meanwhile reaches them,
 * a clean stop. Taking its default action, it killed us between UCX's
 * shm_open() of a segment and its unlink, leaving
 * /dev/shm/ucx_shm_posix_* behind (a launcher stopping agents that were
 * starting: pdx-xferbench's cleanup), and once the engine link was bound,
 * which launchers wait for, before our handlers were (py_engine's agent
 * stopped then exited by SIGTERM). The threads UCX and ZeroMQ start keep
 * them blocked. */
static int agent_start_unkilled(struct agent *a)
{
	sigset_t stop, old;
	int rc;

	sigemptyset(&stop);
	sigaddset(&stop, SIGINT);
	sigaddset(&stop, SIGTERM);
	sigaddset(&stop, SIGHUP);
	sigprocmask(SIG_BLOCK, &stop, &old);
	rc = agent_start(a);
	sigprocmask(SIG_SETMASK, &old, NULL);
	return rc;
}

/* libevent's event_free() does not take NULL. */
static void event_free_safe(struct event *ev)
{
	if (ev)
		event_free(ev);
}

static void agent_stop(struct agent *a)
{
	liveness_stop(a);
	metrics_stop(a);
	gpu_drain(a->gpu); /* its callbacks name transfers */
	staged_stop(a);
	slice_bufs_stop(a);
	xfers_free(a);
	pdx_ended_free(a->ended);
	peers_free(a);
	if (a->zap_ev)
		event_free(a->zap_ev);
	if (a->zap_sock)
		zmq_close(a->zap_sock);
	if (a->ucx) /* cancelled operations call back, chunks too */
		pdx_ucx_progress(a->ucx, 0, 0);
	/* a start that failed half way left some unmade */
	event_free_safe(a->ucx_ev); /* watches the worker's fd */
	event_free_safe(a->ucx_poll_ev);
	/* The worker goes first: any callback still to come (an operation
	 * cancelled by its destruction) runs now, while the memory its
	 * operation used is registered and mapped, and the staging it ends
	 * chunks into is there. */
	if (!pdx_ucx_stop(a->ucx))
		log_warn("UCX still queues operations to peers that no longer "
			 "take them (puts over shared memory, or their "
			 "acknowledgements, to an agent that stopped): its "
			 "worker is left to the exit");
	engine_direct_stop(a);
	registration_clear(a);
	staged_free(a);
	gpu_free(a->gpu);
	event_free_safe(a->engine_ev);
	event_free_safe(a->peer_ev);
	event_free_safe(a->sig_int);
	event_free_safe(a->sig_term);
	event_free_safe(a->sig_hup);
	engine_watch_stop(a);
	peer_watch_stop(a);
	advertise_check_stop(a);
	if (a->engine_sock)
		zmq_close(a->engine_sock);
	if (a->peer_sock)
		zmq_close(a->peer_sock);
	pdx_curve_free(a->curve);
	for (unsigned i = 0; i < NOTIFY_MAX; i++) {
		notify_unwatch(&a->notify[i]);
		if (a->notify[i].sock)
			zmq_close(a->notify[i].sock);
	}
	if (a->zctx)
		zmq_ctx_term(a->zctx);
	pdx_ucx_free(a->ucx);
	/* what UCX operations named: called back now, or never */
	xfers_reap(a);
	slice_bufs_free(a);
	if (a->base)
		event_base_free(a->base);
	/* only the socket file our bind made, never one another agent put
	 * there since, nor one this agent was refused */
	pdx_ipc_path_remove(&a->engine_ipc);
}

/* A queued request's lease is renewed by its receiver's ping, once a
 * heartbeat: a lease no longer than that (with the receiver's heartbeat
 * as ours, as deployments have it) can run out between two renewals and
 * fail the request. Allowed, as the receiver's heartbeat may be shorter;
 * said once at start. */
static void warn_lease(const struct agent_config *c)
{
	if (c->lease_ms > c->heartbeat_ms)
		return;
	log_warn("--lease-ms %u is not above --heartbeat-ms %u: a receiver "
		 "with the same heartbeat renews a queued request's lease "
		 "only that often, and it may run out between renewals",
		 c->lease_ms, c->heartbeat_ms);
}

int main(int argc, char **argv)
{
	struct agent a = { 0 };
	int rc = 1;

	signal(SIGPIPE, SIG_IGN);
	if (getenv("PDX_LOG_LEVEL"))
		pdx_log_set_level(getenv("PDX_LOG_LEVEL"));
	a.trace = getenv("PDX_AGENT_TRACE") &&
		  strcmp(getenv("PDX_AGENT_TRACE"), "1") == 0;
	a.no_slices = getenv("PDX_AGENT_NO_SLICES") &&
		      strcmp(getenv("PDX_AGENT_NO_SLICES"), "1") == 0;
	if (parse_args(argc, argv, &a.cfg))
		return 2;
	pdx_log_prefix("pdx-agent");
	warn_lease(&a.cfg);
	if (agent_start_unkilled(&a) == 0) {
		log_info("ready: engine link %s, peer link %s (advertised %s)",
			 a.cfg.engine_addr, a.cfg.listen_addr, a.peer_addr);
		agent_settle(&a);
		event_base_dispatch(a.base);
		rc = 0;
	}
	agent_stop(&a);
	return rc;
}
