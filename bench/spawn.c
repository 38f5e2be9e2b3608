/* Spawning pdx-agent processes, free ports, temp dirs and the cleanup
 * registry that undoes them when the process exits or is signalled. */
#define _GNU_SOURCE
#include "bench/pdx_bench.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* ---- cleanup registry ---- */

/* pdx-xferbench's largest run, --prefill-tp 8 --decode-tp 4 --versus tp,
 * has 20 agents and 20 engines (bench/xb_nodes.h: 24 nodes at most, each
 * a pid, a pool and a socket path) */
#define REG_MAX 64

static pid_t reg_owner;
static volatile pid_t reg_pids[REG_MAX];
static char reg_shm[REG_MAX][64];
static char reg_path[REG_MAX][4200];
static char reg_dir[4200];
static void (*reg_hook)(void);
static volatile sig_atomic_t reg_running;

static void on_signal(int sig)
{
	static const char msg[] = "interrupted: cleaning up\n";
	ssize_t rc;

	/* a child forked a moment ago, before its exec or its own handlers
	 * (a run that fails at start stops it at once): nothing of its own
	 * to clean up, and no interruption to report */
	if (getpid() != reg_owner) {
		signal(sig, SIG_DFL);
		raise(sig);
		_exit(1);
	}
	rc = write(2, msg, sizeof(msg) - 1);
	(void)rc;
	pb_cleanup_run();
	_exit(1);
}

void pb_cleanup_install(void)
{
	struct sigaction sa;

	if (reg_owner)
		return;
	reg_owner = getpid();
	atexit(pb_cleanup_run);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaddset(&sa.sa_mask, SIGINT);
	sigaddset(&sa.sa_mask, SIGTERM);
	sigaddset(&sa.sa_mask, SIGHUP);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
}

/* The names first, so that a SIGKILL while the processes wind down (a
 * test runner's, 0.5 s after its SIGTERM) leaves nothing behind: the
 * memory of a pool unlinked while mapped goes with its last mapping. */
static void unlink_names(bool forget)
{
	for (int i = 0; i < REG_MAX; i++) {
		if (reg_shm[i][0]) {
			shm_unlink(reg_shm[i]);
			if (forget)
				reg_shm[i][0] = '\0';
		}
		if (reg_path[i][0]) {
			unlink(reg_path[i]);
			if (forget)
				reg_path[i][0] = '\0';
		}
	}
}

/* Async-signal-safe enough: kill, waitpid, nanosleep, unlink, rmdir.
 * SIGINT, SIGTERM and SIGHUP wait until it is done: one that came during
 * the cleanup at exit would end the process half-way (on_signal() finds
 * it running and exits at once). */
void pb_cleanup_run(void)
{
	sigset_t block, old;
	uint64_t deadline;
	bool left;

	if (!reg_owner || getpid() != reg_owner || reg_running)
		return;
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGHUP);
	sigprocmask(SIG_BLOCK, &block, &old);
	reg_running = 1;
	unlink_names(false);
	for (int i = 0; i < REG_MAX; i++)
		if (reg_pids[i] > 0)
			kill(reg_pids[i], SIGTERM);
	deadline = pdx_now_ns() + 2000000000ULL;
	do {
		left = false;
		for (int i = 0; i < REG_MAX; i++) {
			pid_t p = reg_pids[i];

			if (p <= 0)
				continue;
			if (waitpid(p, NULL, WNOHANG) != 0)
				reg_pids[i] = 0; /* ended, or not ours */
			else
				left = true;
		}
		if (left) {
			struct timespec ts = { 0, 20000000L };

			nanosleep(&ts, NULL);
		}
	} while (left && pdx_now_ns() < deadline);
	for (int i = 0; i < REG_MAX; i++) {
		pid_t p = reg_pids[i];

		if (p <= 0)
			continue;
		kill(p, SIGKILL);
		waitpid(p, NULL, 0);
		reg_pids[i] = 0;
	}
	/* again: one a child created after the first pass */
	unlink_names(true);
	if (reg_hook)
		reg_hook();
	reg_hook = NULL;
	if (reg_dir[0]) {
		DIR *d = NULL;

		/* the files agents left there (sockets); not signal-safe but
		 * only reached when the normal path did not remove the dir */
		if (rmdir(reg_dir) && errno == ENOTEMPTY)
			d = opendir(reg_dir);
		if (d) {
			struct dirent *de;
			char p[4500];

			while ((de = readdir(d))) {
				if (!strcmp(de->d_name, ".") ||
				    !strcmp(de->d_name, ".."))
					continue;
				snprintf(p, sizeof(p), "%s/%s", reg_dir,
					 de->d_name);
				unlink(p);
			}
			closedir(d);
			rmdir(reg_dir);
		}
		reg_dir[0] = '\0';
	}
	reg_running = 0;
	sigprocmask(SIG_SETMASK, &old, NULL);
}

void pb_track_pid(pid_t pid)
{
	for (int i = 0; i < REG_MAX; i++) {
		if (reg_pids[i] == 0) {
			reg_pids[i] = pid;
			return;
		}
	}
	fprintf(stderr, "cleanup registry full: pid %d not tracked\n", (int)pid);
}

void pb_untrack_pid(pid_t pid)
{
	for (int i = 0; i < REG_MAX; i++)
		if (reg_pids[i] == pid)
			reg_pids[i] = 0;
}

void pb_track_shm(const char *name)
{
	for (int i = 0; i < REG_MAX; i++) {
		if (!reg_shm[i][0]) {
			snprintf(reg_shm[i], sizeof(reg_shm[i]), "%s", name);
			return;
		}
	}
	fprintf(stderr, "cleanup registry full: %s not tracked\n", name);
}

void pb_untrack_shm(const char *name)
{
	for (int i = 0; i < REG_MAX; i++)
		if (!strcmp(reg_shm[i], name))
			reg_shm[i][0] = '\0';
}

void pb_track_path(const char *path)
{
	for (int i = 0; i < REG_MAX; i++) {
		if (!reg_path[i][0]) {
			snprintf(reg_path[i], sizeof(reg_path[i]), "%s", path);
			return;
		}
	}
	fprintf(stderr, "cleanup registry full: %s not tracked\n", path);
}

void pb_track_dir(const char *path)
{
	snprintf(reg_dir, sizeof(reg_dir), "%s", path);
}

void pb_cleanup_hook(void (*fn)(void))
{
	reg_hook = fn;
}

int pb_tmpdir(char *out, size_t len)
{
	char tmpl[64];

	snprintf(tmpl, sizeof(tmpl), "/tmp/pdx-%d-XXXXXX", (int)getpid());
	if (!mkdtemp(tmpl)) {
		fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
		return -1;
	}
	if (strlen(tmpl) >= len) {
		rmdir(tmpl);
		return -1;
	}
	memcpy(out, tmpl, strlen(tmpl) + 1);
	pb_track_dir(out);
	return 0;
}

void pb_tmpdir_remove(const char *dir)
{
	DIR *d = opendir(dir);
	char p[4500];

	if (d) {
		struct dirent *de;

		while ((de = readdir(d))) {
			if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
				continue;
			snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
			unlink(p);
		}
		closedir(d);
	}
	rmdir(dir);
	if (!strcmp(reg_dir, dir))
		reg_dir[0] = '\0';
}

/* ---- agents ---- */

static void copy_opt(const char **dst, char *buf, size_t len, const char *src)
{
	if (!src) {
		*dst = NULL;
		return;
	}
	snprintf(buf, len, "%s", src);
	*dst = buf;
}

int pb_agent_start(struct pb_agent *a, const struct pb_agent_opts *o)
{
	memset(a, 0, sizeof(*a));
	if (!o->bin || !o->engine || !o->listen) {
		fprintf(stderr, "agent: bin, engine and listen are needed\n");
		return -1;
	}
	copy_opt(&a->o.bin, a->bin, sizeof(a->bin), o->bin);
	copy_opt(&a->o.engine, a->engine, sizeof(a->engine), o->engine);
	copy_opt(&a->o.listen, a->listen, sizeof(a->listen), o->listen);
	copy_opt(&a->o.tls, a->tls, sizeof(a->tls), o->tls);
	copy_opt(&a->o.data_path, a->data_path, sizeof(a->data_path),
		 o->data_path);
	copy_opt(&a->o.notify, a->notify, sizeof(a->notify), o->notify);
	copy_opt(&a->o.netns, a->netns, sizeof(a->netns), o->netns);
	a->o.xfer_timeout_ms = o->xfer_timeout_ms;
	a->o.log_fd = o->log_fd;
	for (int i = 0; i < 7 && o->env[i]; i++)
		copy_opt(&a->o.env[i], a->env[i], sizeof(a->env[i]), o->env[i]);
	for (int i = 0; i < 11 && o->args[i]; i++)
		copy_opt(&a->o.args[i], a->args[i], sizeof(a->args[i]),
			 o->args[i]);
	return pb_agent_restart(a);
}

int pb_agent_restart(struct pb_agent *a)
{
	const char *argv[64];
	char tmo[16], wrapper[512];
	const char *w = getenv("PDX_AGENT_WRAPPER");
	int n = 0;
	pid_t parent = getpid(), pid;

	if (a->pid > 0) {
		fprintf(stderr, "agent: still running (pid %d)\n", (int)a->pid);
		return -1;
	}
	/* PDX_AGENT_WRAPPER="valgrind --leak-check=full ..." runs agents
	 * under a tool (words split on spaces). */
	if (w && *w) {
		char *save = NULL;

		snprintf(wrapper, sizeof(wrapper), "%s", w);
		for (char *t = strtok_r(wrapper, " ", &save); t && n < 20;
		     t = strtok_r(NULL, " ", &save))
			argv[n++] = t;
	}
	if (a->o.netns) {
		argv[n++] = "ip";
		argv[n++] = "netns";
		argv[n++] = "exec";
		argv[n++] = a->o.netns;
	}
	argv[n++] = a->o.bin;
	argv[n++] = "--engine";
	argv[n++] = a->o.engine;
	argv[n++] = "--listen";
	argv[n++] = a->o.listen;
	if (a->o.notify) {
		argv[n++] = "--notify";
		argv[n++] = a->o.notify;
	}
	if (a->o.data_path) {
		argv[n++] = "--data-path";
		argv[n++] = a->o.data_path;
	}
	if (a->o.xfer_timeout_ms) {
		snprintf(tmo, sizeof(tmo), "%u", a->o.xfer_timeout_ms);
		argv[n++] = "--xfer-timeout-ms";
		argv[n++] = tmo;
	}
	for (int i = 0; i < 11 && a->o.args[i]; i++)
		argv[n++] = a->o.args[i];
	argv[n] = NULL;

	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "agent: fork: %s\n", strerror(errno));
		return -1;
	}
	if (pid == 0) {
		sigset_t none;

		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		signal(SIGPIPE, SIG_DFL);
		/* never outlive whoever started us */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		if (a->o.log_fd > 0) {
			dup2(a->o.log_fd, 1);
			dup2(a->o.log_fd, 2);
		} else {
			dup2(2, 1); /* keep stdout clean for --json */
		}
		if (a->o.tls)
			setenv("UCX_TLS", a->o.tls, 1);
		setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
		for (int i = 0; i < 8 && a->o.env[i]; i++) {
			char *eq = strchr(a->env[i], '=');

			if (eq) {
				*eq = '\0';
				setenv(a->env[i], eq + 1, 1);
			}
		}
		execvp(argv[0], (char *const *)argv);
		fprintf(stderr, "agent: exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	a->pid = pid;
	a->status = 0;
	pb_track_pid(pid);
	return 0;
}

int pb_agent_stop(struct pb_agent *a)
{
	uint64_t deadline;
	int st = -1;

	if (a->pid <= 0)
		return a->status;
	kill(a->pid, SIGTERM);
	/* an agent under valgrind needs longer to wind down */
	deadline = pdx_now_ns() +
		   (getenv("PDX_AGENT_WRAPPER") ? 30000000000ULL : 2000000000ULL);
	for (;;) {
		pid_t r = waitpid(a->pid, &st, WNOHANG);

		if (r == a->pid || (r < 0 && errno != EINTR))
			break;
		if (pdx_now_ns() >= deadline) {
			fprintf(stderr, "agent %d: no exit 2 s after SIGTERM, killing\n",
				(int)a->pid);
			kill(a->pid, SIGKILL);
			while (waitpid(a->pid, &st, 0) < 0 && errno == EINTR)
				;
			break;
		}
		sleep_ms(10);
	}
	pb_untrack_pid(a->pid);
	a->pid = 0;
	a->status = st;
	return st;
}

void pb_agent_kill(struct pb_agent *a, int sig)
{
	if (a->pid <= 0)
		return;
	kill(a->pid, sig);
	if (sig == SIGKILL) {
		while (waitpid(a->pid, &a->status, 0) < 0 && errno == EINTR)
			;
		pb_untrack_pid(a->pid);
		a->pid = 0;
	}
}

bool pb_agent_alive(struct pb_agent *a)
{
	pid_t r;

	if (a->pid <= 0)
		return false;
	r = waitpid(a->pid, &a->status, WNOHANG);
	if (r == 0)
		return true;
	pb_untrack_pid(a->pid);
	a->pid = 0;
	return false;
}

/* The ports this process handed out lately: each is handed out once,
 * since the process given it may not have bound it yet when the next
 * port is asked for (two agents of one test got one port). */
#define GIVEN_MAX 64
static int given[GIVEN_MAX];
static unsigned n_given;

static bool given_before(int port)
{
	unsigned n = n_given < GIVEN_MAX ? n_given : GIVEN_MAX;

	for (unsigned k = 0; k < n; k++)
		if (given[k] == port)
			return true;
	return false;
}

static int give(int port)
{
	if (port > 0)
		given[n_given++ % GIVEN_MAX] = port;
	return port;
}

int pb_free_port(const char *host)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	uint64_t rng = pdx_now_ns() ^ ((uint64_t)getpid() << 32);
	socklen_t sl = sizeof(sa);
	int fd, port = -1;

	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		return -1;
	for (int i = 0; i < 64; i++) {
		int cand = 20000 + (int)(pdx_splitmix64(&rng) % 12768);

		if (given_before(cand))
			continue;
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd < 0)
			return -1;
		sa.sin_port = htons((uint16_t)cand);
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			close(fd);
			return give(cand);
		}
		close(fd);
		if (errno == EADDRNOTAVAIL)
			return give(cand); /* not an address of this namespace */
	}
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return -1;
	sa.sin_port = 0;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
		port = ntohs(sa.sin_port);
	close(fd);
	return give(port);
}

int pb_default_agent_bin(char *out, size_t len)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	char *slash;

	if (n <= 0)
		return -1;
	self[n] = '\0';
	slash = strrchr(self, '/');
	if (!slash)
		return -1;
	*slash = '\0';
	/* the build tree: build/bench/ and build/agent/ */
	if ((size_t)snprintf(out, len, "%s/../agent/pdx-agent", self) >= len)
		return -1;
	if (access(out, X_OK) == 0)
		return 0;
	/* an installed tree: both in bin/ */
	if ((size_t)snprintf(out, len, "%s/pdx-agent", self) >= len)
		return -1;
	if (access(out, X_OK) == 0)
		return 0;
	/* neither: name the build-tree path in the error */
	snprintf(out, len, "%s/../agent/pdx-agent", self);
	return 0;
}

pdx_status_t pb_register_retry(struct pdx_engine *e,
			       const struct pdx_shm_pool *p, char *peer,
			       size_t peer_len, int total_ms,
			       struct pb_agent *agent)
{
	return pb_register_regions_retry(e, &p->layout, &p->region, 1, NULL,
					 peer, peer_len, total_ms, agent);
}

pdx_status_t pb_register_regions_retry(struct pdx_engine *e,
				       const struct pdx_kv_layout *layout,
				       const struct pdx_engine_region *regions,
				       size_t n_regions,
				       const struct pdx_engine_cuda_events *events,
				       char *peer, size_t peer_len,
				       int total_ms, struct pb_agent *agent)
{
	uint64_t deadline = pdx_now_ns() + (uint64_t)total_ms * 1000000ULL;

	for (;;) {
		pdx_status_t st = pdx_engine_register_cuda(
			e, layout, regions, n_regions, events, peer, peer_len);

		if (st != PDX_ETIMEDOUT)
			return st;
		if (agent && !pb_agent_alive(agent)) {
			fprintf(stderr, "agent at %s ended (wait status 0x%x) before answering register\n",
				agent->o.engine, agent->status);
			return PDX_EIO;
		}
		if (pdx_now_ns() >= deadline)
			return PDX_ETIMEDOUT;
		sleep_ms(50);
	}
}

int pb_run(const char *const argv[], bool quiet)
{
	pid_t pid;
	int st;

	fflush(NULL);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		if (quiet) {
			int fd = open("/dev/null", O_WRONLY);

			if (fd >= 0) {
				dup2(fd, 1);
				dup2(fd, 2);
			}
		} else {
			dup2(2, 1);
		}
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
	while (waitpid(pid, &st, 0) < 0) {
		if (errno != EINTR)
			return -1;
	}
	if (!WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st) == 127 ? -1 : WEXITSTATUS(st);
}
