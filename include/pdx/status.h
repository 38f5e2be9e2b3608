/* pdx status codes: one enum for the whole system.
 *
 * PDX_OK is zero; failures are negative and grouped by what they break:
 * -1..-99 a single request or transfer, -100..-199 a peer, -200.. the agent
 * or the engine link itself. PDX_EAGAIN is not a failure: "nothing now".
 */
#ifndef PDX_STATUS_H
#define PDX_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pdx_status {
	PDX_OK = 0,
	PDX_EAGAIN = 1, /* nothing available now; poll the fd and retry */

	/* one request or transfer fails */
	PDX_EINVAL = -1,     /* bad argument or malformed message */
	PDX_ERANGE = -2,     /* block id, layer or length outside the layout */
	PDX_ENOENT = -3,     /* unknown transfer */
	PDX_EEXIST = -4,     /* transfer id already in use */
	PDX_ETIMEDOUT = -5,  /* a bounded wait ran out */
	PDX_ECANCELED = -6,  /* aborted by an engine or a peer */
	PDX_EPERM = -7,      /* not allowed for this peer */
	PDX_ETOOBIG = -8,    /* message or request over a configured bound */

	/* one peer is unusable */
	PDX_EPEER = -100,    /* peer unreachable or died */
	PDX_EINCOMPAT = -101,/* handshake refused: protocol or layout differs */

	/* the agent or the link to it */
	PDX_ENOMEM = -200,
	PDX_EIO = -201,      /* socket, shared memory or UCX failure */
	PDX_ENOTREG = -202,  /* engine has not registered its KV memory */
	PDX_EAGENT = -203,   /* the engine's own agent went away (link lost):
				its transfer's blocks may still be touched by
				it or its peer for a while (engine.h) */
} pdx_status_t;

/* A static, lowercase description of the status; never NULL. */
const char *pdx_status_str(pdx_status_t status);

#ifdef __cplusplus
}
#endif
#endif
