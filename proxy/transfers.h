/* The transfers this proxy set up, until the agents report them finished:
 * the part of an instance's load that outlives its requests (a prefill
 * engine holds a request's KV after answering, until it is sent).
 *
 * With --notify-bind the proxy binds a ZeroMQ PULL socket, the agents
 * (started with --notify at that address) push one xfer_event per
 * finished transfer (docs/protocol.md, section 3), and each transfer
 * counts in its prefill and its decode instance's `xfers` until that
 * side's agent reports it: "sent" or "failed" from the prefill agent,
 * "received" or "failed" from the decode agent. A transfer nobody
 * reports (a lost notification, an engine that never announced it) is
 * dropped after --transfer-timeout, said at warn (once a second, with
 * how many more since). Without --notify-bind nothing is
 * counted and every call here is a no-op.
 *
 * One thread: the proxy's loop.
 */
#ifndef PDX_PROXY_TRANSFERS_H
#define PDX_PROXY_TRANSFERS_H

#include <stddef.h>
#include <stdint.h>

#include "common/clock.h"
#include "common/ipc_path.h"

struct event;
struct event_base;
struct pdx_inst;
struct pdx_transfer;

#define PDX_TRANSFERS_MAX 65536 /* counted at once; more are not counted */

/* The agents' data paths (pdx-agent --data-path), as notifications name
 * them. */
#define PDX_TRANSFER_PATHS 6
extern const char *const pdx_transfer_paths[PDX_TRANSFER_PATHS];

struct pdx_transfers {
	void *zctx, *sock; /* NULL: not listening */
	struct pdx_ipc_path ipc; /* an ipc:// --notify-bind's socket file */
	struct event *ev, *sweep;
	struct pdx_transfer *table; /* by xfer id (uthash) */
	unsigned n;
	uint64_t timeout_ns;
	/* counters for /metrics */
	uint64_t events;   /* notifications read */
	uint64_t unknown;  /* of those, for no transfer counted here */
	uint64_t expired;  /* transfers dropped unreported */
	struct pdx_said expired_said; /* their warning, once a second */
	uint64_t bad;	   /* messages that were not an xfer_event */
	/* transfers the sending agents reported sent, and their bytes, by
	 * the data path they moved by (pdx_transfer_paths) */
	uint64_t sent[PDX_TRANSFER_PATHS], sent_bytes[PDX_TRANSFER_PATHS];
	char endpoint[160]; /* the bound address */
};

/* Binds addr (tcp://HOST:PORT; port * picks one, see endpoint); -1 with
 * the reason in err. */
int pdx_transfers_open(struct pdx_transfers *t, struct event_base *base,
		       const char *addr, unsigned timeout_s, char *err,
		       size_t errlen);
void pdx_transfers_close(struct pdx_transfers *t);

/* The transfer xfer_id (32 hex digits) between p and d starts: both
 * count it. Either may be NULL (no agent on that side). */
void pdx_transfers_start(struct pdx_transfers *t, const char *xfer_id,
			 struct pdx_inst *p, struct pdx_inst *d);

/* No transfer xfer_id will happen after all (the prefill failed, or
 * answered without kv_transfer_params): stop counting it. */
void pdx_transfers_forget(struct pdx_transfers *t, const char *xfer_id);

#endif
