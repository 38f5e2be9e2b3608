/* One ZeroMQ send for the engine link and the peer link: never blocking,
 * a full queue is the caller's failure to report. Kept apart from main.c
 * (which owns the sockets) so the links below it call nothing above them;
 * the fuzz harness has its own. */
#include <zmq.h>

#include "agent/agent.h"

int agent_zsend(void *sock, const void *id, size_t id_len, const void *buf,
		size_t len)
{
	if (id && zmq_send(sock, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
		return -1;
	return zmq_send(sock, buf, len, ZMQ_DONTWAIT) < 0 ? -1 : 0;
}
