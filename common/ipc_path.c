/* Binding at ipc://PATH without taking it from someone else (ipc_path.h). */
#include "common/ipc_path.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define IPC_PREFIX "ipc://"

static const char *file_kind(mode_t m)
{
	if (S_ISREG(m))
		return "a regular file";
	if (S_ISDIR(m))
		return "a directory";
	if (S_ISLNK(m))
		return "a symbolic link";
	return "a special file";
}

/* 0: the bind may go ahead (nothing there, a stale socket of ours, or
 * something the bind itself will refuse with ZeroMQ's reason); -1: what
 * is at the path is someone else's, err says whose and what to do. */
static int path_check(const char *addr, const char *path, const char *who,
		      char *err, size_t errlen)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct stat st;
	int fd, rc, e;

	/* an abstract name (@...) or a path too long for sun_path: the
	 * bind refuses it with ZeroMQ's reason */
	if (path[0] == '@' || strlen(path) >= sizeof(sun.sun_path))
		return 0;
	if (lstat(path, &st))
		return 0; /* nothing there: the usual case */
	if (!S_ISSOCK(st.st_mode)) {
		snprintf(err, errlen,
			 "cannot bind %s: %s is %s, not a socket (the bind "
			 "would remove it); give this %s a path of its own",
			 addr, path, file_kind(st.st_mode), who);
		return -1;
	}
	memcpy(sun.sun_path, path, strlen(path));
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	rc = connect(fd, (struct sockaddr *)&sun, sizeof(sun));
	e = errno;
	close(fd);
	/* EAGAIN: a listener whose backlog is full, still a listener */
	if (rc == 0 || e == EAGAIN) {
		snprintf(err, errlen,
			 "cannot bind %s: another process serves it (a socket "
			 "of uid %u that accepts connections); give this %s a "
			 "path of its own",
			 addr, (unsigned)st.st_uid, who);
		return -1;
	}
	if (e == EACCES || e == EPERM) {
		snprintf(err, errlen,
			 "cannot bind %s: it is a socket of uid %u, which this "
			 "user (uid %u) may not connect to: another user's "
			 "process serves it or left it; give this %s a path "
			 "of its own",
			 addr, (unsigned)st.st_uid, (unsigned)geteuid(), who);
		return -1;
	}
	if (e == ECONNREFUSED && st.st_uid != geteuid()) {
		snprintf(err, errlen,
			 "cannot bind %s: a socket of uid %u that nobody "
			 "listens on (another user's process left it): remove "
			 "it, or give this %s a path of its own",
			 addr, (unsigned)st.st_uid, who);
		return -1;
	}
	return 0; /* ECONNREFUSED: ours, its process died; replaced */
}

int pdx_ipc_bind(void *sock, pdx_ipc_bind_fn bind_fn, const char *addr,
		 const char *who, struct pdx_ipc_path *out, char *err,
		 size_t errlen)
{
	const char *path = addr + strlen(IPC_PREFIX);
	struct stat st;
	mode_t old;
	int rc, e;

	*out = (struct pdx_ipc_path){0};
	if (strncmp(addr, IPC_PREFIX, strlen(IPC_PREFIX)) != 0) {
		if (bind_fn(sock, addr) == 0)
			return 0;
		e = errno;
		/* ZeroMQ takes tcp://NAME:PORT as a network interface's name:
		 * a host name ("localhost", a node's) is "No such device" */
		snprintf(err, errlen, "cannot bind %s: %s%s", addr, strerror(e),
			 e == ENODEV ? " (a bind takes an IP address or a "
				       "network interface's name, not a host "
				       "name: give the address it resolves "
				       "to)"
			 : e == EADDRINUSE
			     ? " (another process listens there, another "
			       "deployment's perhaps: pick another port)"
			     : "");
		return -1;
	}
	if (path_check(addr, path, who, err, errlen))
		return -1;
	/* ZeroMQ binds an ipc address in the calling thread: the socket file
	 * is created owner-only, never for a moment as the umask says */
	old = umask(S_IRWXG | S_IRWXO);
	rc = bind_fn(sock, addr);
	e = errno;
	umask(old);
	if (rc) {
		snprintf(err, errlen, "cannot bind %s: %s", addr, strerror(e));
		return -1;
	}
	if (path[0] == '@' || strlen(path) >= sizeof(out->path) ||
	    lstat(path, &st))
		return 0; /* an abstract name: no file to own or remove */
	(void)chmod(path, S_IRUSR | S_IWUSR);
	memcpy(out->path, path, strlen(path) + 1);
	out->dev = st.st_dev;
	out->ino = st.st_ino;
	out->bound = true;
	return 0;
}

void pdx_ipc_path_remove(struct pdx_ipc_path *p)
{
	struct stat st;

	if (!p || !p->bound)
		return;
	if (lstat(p->path, &st) == 0 && st.st_dev == p->dev &&
	    st.st_ino == p->ino)
		unlink(p->path);
	p->bound = false;
}
