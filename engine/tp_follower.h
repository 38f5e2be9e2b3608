/* A follower rank of a tensor-parallel instance (--tp-rank R > 0): no
 * HTTP and no scheduler; it joins the leader at --tp-leader and does
 * what the leader's messages say (engine/tp_wire.h) on its own KV pool
 * (its heads only, kv_pool.h) and its own agent: writes every forward
 * pass, makes every transfer, checks the KV it receives, and tells the
 * leader each pass written and each transfer's event.
 *
 * Its end comes when the leader refuses it or, once heard, is silent
 * for liveness_ms: the loop is left and pdx_tp_follower_failed() is
 * true (the process exits 1, as a supervisor restarts the instance).
 *
 * One thread: the loop's.
 */
#ifndef PDX_ENGINE_TP_FOLLOWER_H
#define PDX_ENGINE_TP_FOLLOWER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <pdx/status.h>

#include "engine/kv_link.h"
#include "engine/kv_pool.h"
#include "engine/opts.h"

struct pdx_tp_follower;

struct pdx_tp_follower_params {
	struct event_base *base;
	const char *leader; /* --tp-leader */
	uint32_t rank, size;
	const char *model;	  /* its name, for the leader's check */
	enum pdx_engine_role role; /* for the leader's check too */
	struct pdx_kv_pool *pool; /* borrowed */
	struct pdx_kv_link *link; /* borrowed: its own agent */
	uint32_t liveness_ms;
};

/* Connects and says hello (the leader may come later). On failure the
 * reason is in err: PDX_EIO or PDX_ENOMEM. */
pdx_status_t pdx_tp_follower_new(const struct pdx_tp_follower_params *p,
				 struct pdx_tp_follower **out, char *err,
				 size_t errlen);

/* Aborts its transfers; NULL-safe. */
void pdx_tp_follower_free(struct pdx_tp_follower *f);

/* The loop was left because the leader refused it or went away. */
bool pdx_tp_follower_failed(const struct pdx_tp_follower *f);

#endif
