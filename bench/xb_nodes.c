/* pdx-xferbench's agents and engine processes (xb_nodes.h).
 *
 * The agents' logs are read back through files and copied to stderr, to
 * report the data path each chose; --one-block's trace lines go to the
 * measurement instead.
 */
#define _GNU_SOURCE
#include "bench/xb_nodes.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/xb_engine.h"
#include "bench/xb_fail.h"
#include "common/clock.h"

#define QUIT_TIMEOUT_MS 5000

/* the started ones: the cleanup hook and the liveness checks see all */
static struct xb_nodes *all;

struct xb_node *xb_nodes_add(struct xb_nodes *ns, const char *role, char tag,
			     uint32_t tp_rank, uint32_t tp_size, int cuda_dev)
{
	struct xb_node *n;

	if (ns->n == XB_NODES_MAX)
		xb_fail("more than %d agents", XB_NODES_MAX);
	n = &ns->node[ns->n];
	n->row = ns->n++;
	n->role = role;
	n->tag = tag;
	n->tp_rank = tp_rank;
	n->tp_size = tp_size;
	if (tp_size > 1)
		snprintf(n->name, sizeof(n->name), "%s rank %u of %u", role,
			 tp_rank, tp_size);
	else
		snprintf(n->name, sizeof(n->name), "%s", role);
	n->cuda_dev = cuda_dev;
	return n;
}

/* One line of an agent's log, copied to our stderr unless it is a trace
 * line (--one-block reads those). peer.c says which path it moves data
 * by as "peer ADDR ready: ..., data by PATH". */
static void agent_log_line(struct xb_node *k)
{
	static const char by[] = ", data by ";
	const char *r = strstr(k->logline, " ready: ");
	const char *d = r ? strstr(r, by) : NULL;

	if (d)
		snprintf(k->data_by, sizeof(k->data_by), "%s", d + strlen(by));
	if (strstr(k->logline, " trace: ")) {
		if (all->on_trace)
			all->on_trace(all->trace_arg, k->logline);
		return;
	}
	k->logline[k->loglen++] = '\n';
	xb_write_all(2, k->logline, k->loglen);
}

/* Copies what the agents logged since the last call to our stderr, line
 * by line, noting their data paths. Also the cleanup hook: a failed run
 * still shows the agents' last words. */
static void agent_logs_drain(void)
{
	char buf[4096];

	for (int i = 0; all && i < all->n; i++) {
		struct xb_node *k = &all->node[i];

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
static int agent_log_open(struct xb_node *k, const char *dir)
{
	char path[512];
	int wfd;

	snprintf(path, sizeof(path), "%s/%c%d.log", dir,
		 k->tag == 'P' ? 'p' : 'd', k->row);
	wfd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0600);
	if (wfd < 0)
		xb_fail("agent log %s: %s", path, strerror(errno));
	k->log_fd = open(path, O_RDONLY | O_CLOEXEC);
	if (k->log_fd < 0)
		xb_fail("agent log %s: %s", path, strerror(errno));
	unlink(path);
	return wfd;
}

static void check_alive(void)
{
	for (int i = 0; i < all->n; i++) {
		struct xb_node *k = &all->node[i];
		int st;

		if (k->agent.pid && !pb_agent_alive(&k->agent))
			xb_fail("the %s agent ended (wait status 0x%x)", k->name,
				k->agent.status);
		if (k->pid > 0 && waitpid(k->pid, &st, WNOHANG) == k->pid) {
			pb_untrack_pid(k->pid);
			k->pid = 0;
			xb_fail("the %s engine ended (wait status 0x%x)", k->name,
				st);
		}
	}
}

void xb_node_cmd(struct xb_node *k, uint32_t op, int iter, double layer_ms,
		 const char *peer)
{
	struct xb_cmd c;

	memset(&c, 0, sizeof(c));
	c.op = op;
	c.iter = iter;
	c.layer_ms = layer_ms;
	if (peer)
		snprintf(c.peer, sizeof(c.peer), "%s", peer);
	if (xb_write_all(k->cmd_fd, &c, sizeof(c)))
		xb_fail("cannot command the %s engine", k->name);
}

void xb_nodes_wait(struct xb_node **ks, int n, struct xb_ack *acks,
		   int timeout_ms, const char *what)
{
	uint64_t deadline = pdx_now_ns() + (uint64_t)timeout_ms * 1000000ULL;
	bool got[XB_NODES_MAX] = { false };
	int left = n;

	while (left) {
		struct pollfd pf[XB_NODES_MAX];
		int np = 0, map[XB_NODES_MAX];

		for (int i = 0; i < n; i++) {
			if (got[i])
				continue;
			pf[np].fd = ks[i]->ack_fd;
			pf[np].events = POLLIN;
			map[np++] = i;
		}
		if (pdx_now_ns() >= deadline)
			xb_fail("%s: no answer from the %s engine in %d s", what,
				ks[map[0]]->name, timeout_ms / 1000);
		if (poll(pf, (nfds_t)np, 100) < 0 && errno != EINTR)
			xb_fail("poll: %s", strerror(errno));
		for (int j = 0; j < np; j++) {
			int i = map[j];

			if (!(pf[j].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			if (xb_read_all(ks[i]->ack_fd, &acks[i], sizeof(acks[i]))) {
				check_alive();
				xb_fail("%s: the %s engine went away", what,
					ks[i]->name);
			}
			if (!acks[i].ok)
				xb_fail("%s: %s engine: %s", what, ks[i]->name,
					acks[i].reason);
			got[i] = true;
			left--;
		}
		agent_logs_drain();
		if (left)
			check_alive();
	}
}

/* Forks k's engine, with a pipe each way. */
static void engine_start(struct xb_node *k, const struct xb_opts *o,
			 struct xb_plan *plan)
{
	int cmd[2], ackp[2];
	pid_t parent = getpid();

	if (pipe2(cmd, O_CLOEXEC) || pipe2(ackp, O_CLOEXEC))
		xb_fail("pipe: %s", strerror(errno));
	fflush(NULL);
	k->pid = fork();
	if (k->pid < 0)
		xb_fail("fork: %s", strerror(errno));
	if (k->pid == 0) {
		struct xb_engine_cfg cfg = {
			.role = k->role, .engine = k->engine,
			.row = k->row, .tp_rank = k->tp_rank,
			.tp_size = k->tp_size, .order = k->order,
			.shm_name = k->shm_name, .cuda = o->cuda,
			.cuda_dev = k->cuda_dev,
			.cmd_fd = cmd[0], .ack_fd = ackp[1],
		};

		for (int i = 0; i < all->n; i++) {
			if (&all->node[i] != k && all->node[i].pid > 0) {
				close(all->node[i].cmd_fd);
				close(all->node[i].ack_fd);
			}
		}
		close(cmd[1]);
		close(ackp[0]);
		xb_engine_main(&cfg, plan, parent);
	}
	pb_track_pid(k->pid);
	close(cmd[0]);
	close(ackp[1]);
	k->cmd_fd = cmd[1];
	k->ack_fd = ackp[0];
}

/* A TCP port for the i-th agent, none of the earlier ones'. */
static int agent_port(const int *ports, int i)
{
	int port = -1;

	for (int t = 0; t < 16; t++) {
		bool taken = false;

		port = pb_free_port("127.0.0.1");
		for (int j = 0; j < i; j++)
			taken |= port == ports[j];
		if (port >= 0 && !taken)
			return port;
	}
	xb_fail("no free TCP port on 127.0.0.1");
}

/* The run's part of its pools' names. The pid alone is not unique on a
 * /dev/shm that PID namespaces share (two runs in containers are both
 * PID 1; the second found the first's pools held), as pdx-engine found
 * (engine/main.c, pool_name()). */
static uint32_t run_tag(void)
{
	static uint32_t tag;

	if (!tag && getrandom(&tag, sizeof(tag), 0) != sizeof(tag))
		tag = (uint32_t)pdx_now_ns();
	return tag;
}

/* k's agent, its engine link an ipc:// socket in dir and its log a file
 * there. */
static void agent_start(struct xb_node *k, const struct xb_opts *o,
			const char *dir, int port)
{
	struct pb_agent_opts ao = { 0 };
	char path[4200], listen[64];
	int log_wfd;

	snprintf(k->shm_name, sizeof(k->shm_name),
		 "/" XB_SHM_PREFIX "%d-%08x-%c%d", (int)getpid(), run_tag(),
		 k->tag, k->row);
	if (!o->cuda)
		pb_track_shm(k->shm_name);
	snprintf(path, sizeof(path), "%s/%c%d.engine", dir,
		 k->tag == 'P' ? 'p' : 'd', k->row);
	pb_track_path(path);
	snprintf(k->engine, sizeof(k->engine), "ipc://%s", path);
	snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", port);
	ao.bin = o->agent_bin;
	ao.engine = k->engine;
	ao.listen = listen;
	ao.tls = o->ucx_tls;
	ao.data_path = o->data_path;
	ao.xfer_timeout_ms = o->xfer_timeout_ms;
	for (uint32_t i = 0; i < o->n_agent_args; i++)
		ao.args[i] = o->agent_args[i];
	if (o->one_block)
		ao.env[0] = "PDX_AGENT_TRACE=1"; /* the breakdown */
	log_wfd = agent_log_open(k, dir);
	ao.log_fd = log_wfd;
	if (pb_agent_start(&k->agent, &ao))
		xb_fail("cannot start the %s agent", k->name);
	close(log_wfd); /* the agent has it; we never restart one */
}

void xb_nodes_start(struct xb_nodes *ns, const struct xb_opts *o,
		    struct xb_plan *plan, const char *dir)
{
	struct xb_node *ks[XB_NODES_MAX];
	struct xb_ack acks[XB_NODES_MAX];
	int ports[XB_NODES_MAX];

	all = ns;
	pb_cleanup_hook(agent_logs_drain);
	for (int i = 0; i < ns->n; i++) {
		ports[i] = agent_port(ports, i);
		agent_start(&ns->node[i], o, dir, ports[i]);
	}
	for (int i = 0; i < ns->n; i++) {
		engine_start(&ns->node[i], o, plan);
		ks[i] = &ns->node[i];
	}
	xb_nodes_wait(ks, ns->n, acks, READY_TIMEOUT_MS, "start");
	for (int i = 0; i < ns->n; i++) {
		struct xb_node *k = &ns->node[i];

		snprintf(k->peer, sizeof(k->peer), "%s", acks[i].peer);
		snprintf(k->gpu, sizeof(k->gpu), "%s", acks[i].gpu);
		fprintf(stderr, "pdx-xferbench: %s engine registered%s%s; its agent is %s\n",
			k->name, acks[i].gpu[0] ? " on " : "", acks[i].gpu,
			k->peer);
	}
}

void xb_nodes_stop(struct xb_nodes *ns)
{
	for (int i = 0; i < ns->n; i++)
		xb_node_cmd(&ns->node[i], CMD_QUIT, 0, 0, NULL);
	for (int i = 0; i < ns->n; i++) {
		uint64_t deadline = pdx_now_ns() + QUIT_TIMEOUT_MS * 1000000ULL;
		struct xb_node *k = &ns->node[i];

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
	for (int i = 0; i < ns->n; i++)
		pb_agent_stop(&ns->node[i].agent);
	agent_logs_drain();
}
