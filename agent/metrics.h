/* The agent's Prometheus metrics, served at GET /metrics on --metrics
 * HOST:PORT (off by default) by an evhttp server on the agent's loop:
 * transfers by outcome and data path, their bytes and durations,
 * handshakes, lease renewals and dropped notifications, counted where
 * each happens; peers by state, live transfers and the engine's
 * registration, read from the agent when rendered. Names start with
 * pdx_agent_ (docs/configuration.md lists them).
 *
 * The loop's thread. The counting calls count whether or not the server
 * is on; rendering changes nothing, so the server's callback does not
 * settle the agent.
 */
#ifndef PDX_AGENT_METRICS_H
#define PDX_AGENT_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/prom.h"

struct agent;
struct evhttp;
struct xfer;

#define METRICS_OUTCOMES 3 /* sent, received, failed */
#define METRICS_PATHS 7	   /* enum data_path; DATA_AUTO: none chosen */

struct agent_metrics {
	uint64_t xfers[METRICS_OUTCOMES][METRICS_PATHS];
	uint64_t bytes[2][METRICS_PATHS]; /* by role: send, recv */
	struct pdx_prom_hist duration[2]; /* completed, by role */
	uint64_t handshakes[2];		  /* refused, ok */
	uint64_t renewals;		  /* leases a ping renewed */
	struct evhttp *http;		  /* NULL: --metrics is off */
};

/* --metrics HOST:PORT (HOST may be [IPv6]): HOST into host (len bytes),
 * PORT into port. 0, or -1 when it is not of that form. */
int metrics_addr_parse(const char *addr, char *host, size_t len,
		       uint16_t *port);

/* With a->cfg.metrics_addr, binds the server there and logs its address
 * ("metrics on http://HOST:PORT/metrics", the port the kernel chose for
 * 0). 0, or -1 with the reason logged. */
int metrics_start(struct agent *a);
/* Closes the server; before the loop is freed. */
void metrics_stop(struct agent *a);

/* x ended (its outcome decided, its operations drained): counted once,
 * by outcome, role and d, its peer's data path (an enum data_path, which
 * agent.h defines after this header; DATA_AUTO: no handshake held); its
 * duration if it completed. */
void metrics_xfer_ended(struct agent *a, const struct xfer *x, int d);
/* A handshake this agent settled: a peer's hello or hello_ack accepted
 * or refused here, or a hello_nack from the peer (refused). */
void metrics_handshake(struct agent *a, bool ok);
/* A peer's ping renewed the lease of one of our sent transfers. */
void metrics_lease_renewed(struct agent *a);

#endif
