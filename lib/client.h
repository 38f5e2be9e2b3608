/* The engine client's insides (include/pdx/engine.h is its face): the
 * link's state and what its files ask of each other. Internal to libpdx
 * (pdx__ names): none of this is exported (lib/libpdx.map).
 *
 * Its files, from the bottom up: each calls only files listed above it,
 * never one below (what a lower file must tell an upper one, it leaves in
 * struct pdx_engine for the upper one to read).
 *
 *   last_error.c why the last call failed (pdx_engine_last_error)
 *   call.c       a public call's entry and exit: one thread at a time, not
 *                in a forked child; a free from another thread deferred to
 *                the call's end
 *   inflight.c   the transfers in flight, the event queue, the events made
 *                here when the link is lost
 *   direct.c     the direct lane's socket: connect, frames out and in
 *   link.c       the sockets: open, close, frames in and out (on the direct
 *                lane once both sides switched to it), the fd
 *   parse.c      what the agent's messages say, read from their bytes
 *   meta.c       the bytes beside the KV an event carries: shelved until
 *                the event is handed out (pdx_engine_event_meta)
 *   incoming.c   what the agent says, taken off the link: events queued,
 *                refusals made events, the answer to a register sent again
 *   liveness.c   the agent going away (the monitor, transfers failed) and
 *                coming back (the register sent again); the link's status
 *   events.c     the event API: next, wait
 *   register.c   register: checked, packed, sent, its answer awaited
 *   announce.c   send, recv, layer_done, token, hold, abort
 *   cuda.c       a GPU engine's CUDA side: the driver, regions from device
 *                pointers, the interprocess events and their recording
 *   cuda_streams.c  those events tied to the link: register_cuda_streams,
 *                layer_done_stream
 *   engine.c     the engine's life: connect, free
 */
#ifndef PDX_LIB_CLIENT_H
#define PDX_LIB_CLIENT_H

#include <pdx/engine.h>

#include <stdbool.h>
#include <sys/types.h>
#include <uthash.h>
#include <zmq.h>

#include "common/log.h"
#include "common/mp.h"

#define PDX__PROTOCOL_VERSION 1

struct pdx__cuda;
struct pdx__meta;

/* The direct lane (direct.c; docs/protocol.md, "The direct lane"). */
struct pdx__lane {
	int fd;	  /* -1: none */
	bool tx;  /* our marker went on ZeroMQ: we send on the lane */
	bool rx;  /* the agent's came: we read the lane */
	uint8_t *in, *out; /* bytes read, not yet handed out; not yet sent */
	size_t in_len, in_off, in_cap;
	size_t out_len, out_off, out_cap;
};

/* What a "registered" answer offered: the lane's name and token. */
struct pdx__lane_offer {
	char name[108];
	uint8_t token[16];
	bool given;
};

/* One message off the link, from ZeroMQ or the lane; pdx__frame_close()
 * when done with it (the lane's is valid until the next read). */
struct pdx__frame {
	zmq_msg_t msg;
	bool zmq;
	const void *data;
	size_t len;
};

/* A transfer announced on the link whose event has not come yet. */
struct pdx__inflight {
	struct pdx_xfer_id id;
	uint64_t t_first_ns; /* announced (or held) */
	/* held (pdx_engine_hold), not announced yet: the agent's event
	 * says it failed while our request waited in the queue */
	bool held;
	UT_hash_handle hh;
};

struct pdx_engine {
	void *ctx;
	void *sock;
	unsigned fork_generation; /* of the process that connected (call.c) */
	pid_t pid;         /* that process, for the refusal in a forked child */
	int busy;          /* PDX__BUSY_ bits (call.c; __atomic) */
	/* an eventfd every wait of a call polls beside the link: written by
	 * pdx_engine_free() from another thread (call.c), never read */
	int wake;
	/* engine.c's: frees all an engine holds; run by call.c at the end of
	 * a call that another thread's pdx_engine_free() came during */
	void (*destroy)(struct pdx_engine *e);
	int told_busy;     /* a call refused for it was logged */
	const char *call;  /* which one, for the one refused beside it */
	int timeout_ms;
	int liveness_ms;
	uint32_t xfer_timeout_ms;
	uint32_t tp_rank, tp_size; /* pdx_engine_set_tp(); size 0: none */
	char kv_dtype[PDX_KV_DTYPE_MAX]; /* pdx_engine_set_kv_dtype(); "": none */
	void *mon;         /* PAIR: the socket monitor's connection events */
	int efd;           /* epoll over both sockets' ZMQ_FDs and the lane's
			    * fd: pdx_engine_fd() */
	struct pdx__lane lane;
	/* a ZeroMQ message taken while the lane was read: what the lane
	 * holds goes first (link.c) */
	zmq_msg_t zheld;
	bool zheld_ok;
	void *reg;         /* the last accepted register message, to resend */
	size_t reg_len;
	char peer[PDX_ADDR_MAX]; /* what that register answered */
	bool up;           /* a connection's handshake completed, not lost since */
	bool registered;   /* that connection carries our register */
	uint64_t down_ns;  /* when the link was lost (0: never was) */
	uint64_t relink_ns; /* the last try to register again */
	bool registering;   /* that register is out, its answer to come */
	/* another engine registered with the agent since ours: not
	 * registered again by itself (the two would take turns), only by
	 * pdx_engine_register() or on a new connection (the agent restarted) */
	bool displaced;
	char why_down[PDX_REASON_MAX];
	char why[512];     /* why the last call failed: pdx_engine_last_error */
	struct pdx__cuda *cuda; /* the events of register_cuda_streams, or NULL */
	struct pdx__inflight *live; /* announced or held, their event to come */
	/* FIFO of events that arrived while register waited for its answer */
	struct pdx_engine_event *q;
	size_t q_cap;
	size_t q_head;
	size_t q_len;
	struct pdx__meta *metas;    /* meta.c: of events not handed out yet */
	struct pdx__meta *meta_out; /* of the last event handed out */
};

/* last_error.c: each public call taking an engine starts with
 * pdx__why_clear(); each of its failures says why with pdx__fail(), where
 * the failure is first met (the callers pass the status on). */
void pdx__why_clear(struct pdx_engine *e);
pdx_status_t pdx__fail(struct pdx_engine *e, pdx_status_t st, const char *fmt,
		       ...) __attribute__((format(printf, 3, 4)));
/* The same, and the reason logged at lvl too (a failure the engine's
 * operator should see even when the caller does not ask why). */
pdx_status_t pdx__fail_log(struct pdx_engine *e, enum pdx_log_level lvl,
			   pdx_status_t st, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* call.c: each public call taking an engine enters it first (PDX_EINVAL
 * for NULL, while another thread is in a call on it, in a forked child;
 * why cleared) and leaves it with its status: st = pdx__enter(e, "send");
 * if (st == PDX_OK) st = pdx__leave(e, work(e)). */
pdx_status_t pdx__enter(struct pdx_engine *e, const char *call);
pdx_status_t pdx__leave(struct pdx_engine *e, pdx_status_t st);
/* busy: a call is under way; pdx_engine_free() came (from another thread,
 * during it); that free still touches the engine (its wake-up) */
#define PDX__BUSY_CALL 1
#define PDX__BUSY_FREED 2
#define PDX__BUSY_FREEING 4
/* pdx_engine_free() in a process that is not a forked child: false, the
 * caller destroys e now; true, another thread is in a call on e, woken
 * (e->wake), and that call's pdx__leave() destroys it (e->destroy). */
bool pdx__free_defer(struct pdx_engine *e);
/* Whether the engine was freed during the call under way, and the
 * failure a wait in it returns then (at once: the free woke it). */
bool pdx__freed(const struct pdx_engine *e);
pdx_status_t pdx__freed_fail(struct pdx_engine *e, const char *what);
/* The fork generation of this process, for an engine connecting here
 * (the first call starts counting forks; PDX_ENOMEM: it could not), and
 * whether e was connected in another process (a forked child's parent). */
pdx_status_t pdx__fork_generation(unsigned *out);
bool pdx__forked(const struct pdx_engine *e);

/* inflight.c */
bool pdx__inflight_has(struct pdx_engine *e, const struct pdx_xfer_id *x);
void pdx__inflight_add(struct pdx_engine *e, struct pdx__inflight *t,
		       const struct pdx_xfer_id *x);
bool pdx__inflight_take(struct pdx_engine *e, const struct pdx_xfer_id *x);
/* x held, not announced: in flight till its event, an announcement (its
 * event is then the announced transfer's) or our abort of it. */
void pdx__inflight_hold(struct pdx_engine *e, const struct pdx_xfer_id *x);
bool pdx__inflight_held(struct pdx_engine *e, const struct pdx_xfer_id *x);
/* an announcement of x went out: a held x is announced now (true), else
 * t is added (false: the caller lets go of t either way) */
bool pdx__inflight_announced(struct pdx_engine *e, struct pdx__inflight *t,
			     const struct pdx_xfer_id *x);
/* our abort of x went out: held only, it ends here (its event, should
 * the agent send one, is dropped) */
void pdx__inflight_unhold(struct pdx_engine *e, const struct pdx_xfer_id *x);
/* Each transfer in flight ends now, failed with st and e->why_down. */
void pdx__inflight_fail_all(struct pdx_engine *e, pdx_status_t st);
void pdx__inflight_free(struct pdx_engine *e);
int pdx__queue_push(struct pdx_engine *e, const struct pdx_engine_event *ev);
bool pdx__queue_pop(struct pdx_engine *e, struct pdx_engine_event *ev);
/* false: dropped (not in flight) or lost (the queue full) */
bool pdx__queue_keep(struct pdx_engine *e, const struct pdx_engine_event *ev);

/* direct.c: write 0 sent or kept, -1 the lane broke (errno), -2 too
 * much kept; read 1 a frame (*buf valid until the next read), 0 none
 * (the socket drained), -1 the lane ended; flush -1 the lane broke. */
int pdx__direct_open(struct pdx_engine *e, const char *name,
		     const void *token, size_t token_len);
int pdx__direct_write(struct pdx_engine *e, const void *buf, size_t len);
int pdx__direct_flush(struct pdx_engine *e);
/* the fd's interest again, after lane.rx changed */
void pdx__direct_rearm(struct pdx_engine *e);
int pdx__direct_read(struct pdx_engine *e, const void **buf, size_t *len);
/* close: forked, in a child, where the epoll instance is the parent's */
void pdx__direct_close(struct pdx_engine *e, bool forked);

/* link.c */
pdx_status_t pdx__link_open(struct pdx_engine *e, const char *agent);
void pdx__link_close(struct pdx_engine *e);
int pdx__ms_left(uint64_t deadline_ns);
pdx_status_t pdx__link_send(struct pdx_engine *e, const void *buf, size_t len,
			    bool wait);
int pdx__link_recv(struct pdx_engine *e, struct pdx__frame *f);
void pdx__frame_close(struct pdx__frame *f);
/* Waits up to timeout_ms for the link (and its monitor, when monitor) to
 * have something, or for e->wake: zmq_poll()'s answer. A caller's loop
 * asks pdx__freed() before it waits again (e->wake stays readable). */
int pdx__link_wait(struct pdx_engine *e, int timeout_ms, bool monitor);
/* Takes up a register answer's offer of a direct lane (after the monitor
 * was read: the lane belongs to the connection that answered). */
void pdx__link_lane_open(struct pdx_engine *e,
			 const struct pdx__lane_offer *o);
/* The lane ends (why): what follows goes on ZeroMQ. */
void pdx__link_lane_close(struct pdx_engine *e, const char *why);

/* parse.c */
enum pdx__msg { PDX__MSG_SKIP, PDX__MSG_EVENT, PDX__MSG_OTHER };
int pdx__get_str_trunc(const msgpack_object *map, const char *key, char *out,
		       size_t outlen);
enum pdx__msg pdx__classify(const struct pdx__frame *f, msgpack_unpacked *up,
			    char *op, size_t oplen, struct pdx_engine_event *ev);
/* A "registered" answer's offer of a direct lane (o->given false: none). */
void pdx__lane_offer_read(const msgpack_object *m, struct pdx__lane_offer *o);
int pdx__register_answer(const msgpack_object *m, const char *op,
			 char *peer_addr, size_t peer_addr_len,
			 pdx_status_t *st, char *why, size_t why_len);
/* After a "registered": warns when the engine named a KV element type
 * (kv_dtype) that the answer does not say back: an older agent, which
 * may not compare it (one before libpdx 0.6 ignores it). */
void pdx__kv_dtype_heard(const msgpack_object *m, const char *kv_dtype);

/* meta.c: an event's meta shelved as it is read (event: its map), handed
 * out with it (x NULL: none); pdx__event_keep() shelves it and queues the
 * event (pdx__queue_keep), dropping the meta of an event not kept */
void pdx__meta_shelve(struct pdx_engine *e, const msgpack_object *event,
		      const struct pdx_engine_event *ev);
void pdx__meta_hand_out(struct pdx_engine *e, const struct pdx_xfer_id *x);
void pdx__event_keep(struct pdx_engine *e, const msgpack_object *event,
		     const struct pdx_engine_event *ev);
void pdx__meta_free(struct pdx_engine *e);

/* incoming.c */
pdx_status_t pdx__drain(struct pdx_engine *e);
bool pdx__on_other(struct pdx_engine *e, const msgpack_object *m,
		   const char *op, struct pdx_engine_event *ev);

/* liveness.c */
void pdx__link_watch(struct pdx_engine *e);
void pdx__relink(struct pdx_engine *e);

/* register.c */
pdx_status_t pdx__register(struct pdx_engine *e,
			   const struct pdx_kv_layout *layout,
			   const struct pdx_engine_region *regions,
			   size_t n_regions,
			   const struct pdx_engine_cuda_events *ev,
			   const char *peer_addr, size_t peer_addr_len);
pdx_status_t pdx__peer_out(struct pdx_engine *e, char *peer_addr,
			   size_t peer_addr_len);

/* announce.c: layer_done (slot UINT32_MAX: none), for layer_done_stream */
pdx_status_t pdx__layer_done(struct pdx_engine *e, uint32_t layer,
			     uint32_t slot, const struct pdx_xfer_id *xfers,
			     size_t n);

/* cuda.c */
pdx_status_t pdx__cuda_events_new(struct pdx_engine *e, int ordinal,
				  uint32_t slots, uint32_t layers,
				  struct pdx__cuda **out);
void pdx__cuda_events_of(const struct pdx__cuda *c,
			 struct pdx_engine_cuda_events *out);
pdx_status_t pdx__cuda_record(struct pdx_engine *e, uint32_t layer,
			      void *stream, uint32_t *slot);
void pdx__cuda_free(struct pdx__cuda *c);

#endif
