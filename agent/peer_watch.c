/* The peer link's accepts watched. ZeroMQ drops a connection it cannot
 * accept (no descriptor left) without a word: every peer's hello went
 * unanswered ("no answer to our hello ... is an agent listening there"
 * in the peer's log) and nothing was said here. Said at most once a
 * second, with the limit. */
#define PDX_LOG_TOPIC "peer"
#include <errno.h>
#include <zmq.h>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/log.h"

static void on_event(evutil_socket_t fd, short what, void *arg)
{
	static uint64_t said_ns;
	struct agent *a = arg;
	uint16_t ev;
	uint32_t err;

	(void)fd, (void)what;
	while (zmonitor_next(&a->peer_watch, &ev, &err) == 0) {
		if (ev != ZMQ_EVENT_ACCEPT_FAILED ||
		    !pdx_once_a_second(&said_ns))
			continue;
		if (err == EMFILE || err == ENFILE)
			log_warn("peer link: a peer's connection not accepted: "
				 "out of file descriptors (the limit is %llu, "
				 "ulimit -n; a peer takes about %d)",
				 a->nofile, AGENT_FDS_PER_PEER);
		else
			log_warn("peer link: a peer's connection not accepted: "
				 "%s", zmq_strerror((int)err));
	}
}

int peer_watch_start(struct agent *a)
{
	if (zmonitor_open(a, &a->peer_watch, a->peer_sock, "peer",
			  ZMQ_EVENT_ACCEPT_FAILED, on_event, a))
		return -1;
	on_event(-1, 0, a); /* its fd is edge-triggered */
	return 0;
}

void peer_watch_stop(struct agent *a)
{
	zmonitor_close(&a->peer_watch);
}
