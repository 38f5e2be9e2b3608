/* Binding a ZeroMQ socket at ipc://PATH without taking the path from
 * someone else, and removing it at exit only while it is still ours.
 *
 * ZeroMQ's ipc bind unlinks whatever is at the path first: a running
 * agent's socket (its engines then reach the newcomer), another user's
 * (in a directory both may write), a regular file given by mistake. So
 * what is there is looked at before: a socket that accepts a connection
 * has a listener, one this user may not connect to is another user's,
 * anything else is no socket; all three are refused with why. A socket of
 * ours that refuses the connection was left by a process that died, and
 * the bind replaces it. Two processes binding in the same instant can
 * still race between the look and the bind; that is not the mistake this
 * guards against.
 *
 * The bound socket is made owner-only (0600): the processes that connect
 * (an agent's engine, the other ranks of a tensor-parallel instance) run
 * as its user, as they must already to map its 0600 KV pool.
 *
 * Returns codes and writes reasons into the caller's buffer; logs nothing.
 * Call from one thread at start (the bind runs under umask 077).
 */
#ifndef PDX_COMMON_IPC_PATH_H
#define PDX_COMMON_IPC_PATH_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* zmq_bind()'s shape, so this file needs no ZeroMQ. */
typedef int (*pdx_ipc_bind_fn)(void *sock, const char *addr);

/* What was bound: the path and the socket file's identity. Zeroed: none. */
struct pdx_ipc_path {
	char path[108];
	dev_t dev;
	ino_t ino;
	bool bound;
};

/* Binds sock at addr through bind_fn. addr ipc://PATH: checked as above,
 * bound owner-only, recorded in *out. Any other address is bound as is
 * (*out stays unbound). Returns 0; or -1 with err saying "cannot bind
 * ADDR: why" (who: the program's role, e.g. "agent", in the advice). */
int pdx_ipc_bind(void *sock, pdx_ipc_bind_fn bind_fn, const char *addr,
		 const char *who, struct pdx_ipc_path *out, char *err,
		 size_t errlen);

/* Unlinks the socket file bound through pdx_ipc_bind(), unless what is at
 * the path now is another file (someone replaced it meanwhile). NULL-safe
 * and safe on an unbound one. */
void pdx_ipc_path_remove(struct pdx_ipc_path *p);

#endif
