/* The pdx-agent's state, shared by the files of agent/: one event loop
 * (libevent) drives the engine link, the peer link and the UCX worker. */
#ifndef PDX_AGENT_AGENT_H
#define PDX_AGENT_AGENT_H

#include <event2/event.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>
#include <uthash.h>

#include <pdx/engine.h>
#include <pdx/layout.h>

#include "agent/am.h"
#include "kernels/kv_kernels.h"
#include "agent/coalesce.h"
#include "agent/curve.h"
#include "agent/ended.h"
#include "agent/gpu.h"
#include "agent/metrics.h"
#include "agent/trace.h"
#include "common/mp.h"
#include "agent/xfer_sm.h"
#include "common/clock.h"
#include "common/ipc_path.h"
#include "transport/ucx.h"

#define NOTIFY_MAX 4 /* --notify collectors */
#define PEERS_MAX 512 /* peers known at once at most (peer_make_room()) */
/* File descriptors: an idle agent's (UCX, ZeroMQ, the loop: about 42
 * measured), and each peer's (its ZeroMQ connection and UCX's) */
#define AGENT_FDS_BASE 64
#define AGENT_FDS_PER_PEER 3

/* How bytes move to a peer (docs/architecture.md, "Data path"). Host
 * memory: ipc, put or am. GPU memory (docs/gpu.md): cuda-put (a UCX with
 * CUDA support puts GPU to GPU), cuda-ipc (same host: our stream copies
 * into the peer's memory opened with CUDA IPC), staged (gather to pinned
 * host memory, UCX messages, scatter on the receiver's GPU). */
enum data_path {
	DATA_AUTO,
	DATA_IPC,
	DATA_PUT,
	DATA_AM,
	DATA_CUDA_PUT,
	DATA_CUDA_IPC,
	DATA_STAGED,
};

static inline bool data_path_gpu(enum data_path d)
{
	return d == DATA_CUDA_PUT || d == DATA_CUDA_IPC || d == DATA_STAGED;
}

const char *data_path_name(enum data_path d);
/* The option's spelling: "ipc", "cuda-ipc", ... ("auto" for none). */
const char *data_path_key(enum data_path d);

struct xfer;
struct agent;

/* Tensor parallelism (docs/protocol.md, "TP legs"): an engine's rank of
 * its TP size; {0, 1} without TP. */
struct tp_rank {
	uint32_t rank, size;
};

/* The KV heads one leg moves: heads [src_head, src_head + n) of the
 * sender's blocks land at [dst_head, dst_head + n) of the receiver's.
 * n == 0: whole blocks (equal TP, MLA's latent), unless the two sides'
 * blocks differ in order: all heads then (tp_order_slice). */
struct tp_slice {
	uint32_t src_head, dst_head, n;
};

/* An active message a data path's receiver takes (agent/am.h). */
struct data_path_am {
	enum am_id id;
	pdx_ucx_am_cb on_message;
};

/* One data path, behind the operations the driver (push.c) calls; a
 * peer's is chosen once, when its hello is applied (path_choice.c). */
struct data_path_ops {
	/* Once both sides' blocks are known, before the first push: what
	 * the path needs of them (runs of blocks); NULL: nothing. */
	pdx_status_t (*ready)(struct xfer *x);
	/* Pushes n computed layers from `layer` on into the receiver's
	 * blocks; n is 1 unless layer_runs (one GPU launch moves them). */
	pdx_status_t (*push)(struct xfer *x, uint32_t layer, uint32_t n);
	bool layer_runs;
	/* Every layer pushed and every operation ended: gets every byte to
	 * the receiver, then "done" (complete.c); NULL: our copies are
	 * there when they end, "done" goes at once. */
	pdx_status_t (*flush)(struct xfer *x);
	/* The data messages its receiver takes, each by its own id. */
	const struct data_path_am *am;
	uint32_t n_am;
};

/* The paths, a file each: path_ipc.c, path_put.c, path_am.c,
 * path_cuda_put.c, path_cuda_ipc.c, staged.c. */
extern const struct data_path_ops data_path_ipc_ops, data_path_put_ops,
	data_path_am_ops, data_path_cuda_put_ops, data_path_cuda_ipc_ops,
	data_path_staged_ops;

struct agent_config {
	const char *engine_addr; /* ipc://... the engine link */
	bool no_engine_direct;   /* --engine-direct off: ZeroMQ only */
	const char *listen_addr; /* tcp://HOST:PORT the peer link */
	const char *advertise;   /* peer address given out, if not listen's */
	/* tcp://... collectors (pdx-proxy's --notify-bind), optional; each
	 * gets every notification (two proxies in front of one engine) */
	const char *notify_addr[NOTIFY_MAX];
	unsigned n_notify;
	const char *metrics_addr; /* HOST:PORT of /metrics, optional */
	enum data_path data_path;
	bool pull; /* receiver: read the sender's blocks unless the engine's
		    * recv says otherwise (--pull; docs/protocol.md, "Pull") */
	uint32_t xfer_timeout_ms;
	uint32_t handshake_timeout_ms;
	uint32_t lease_ms;	   /* sender: KV kept for a receiver that has
				    * not asked yet, renewed by its holds */
	uint32_t layer_timeout_ms; /* sender: bound between computed layers */
	uint32_t heartbeat_ms;	   /* ping period to peers we transfer with */
	uint32_t peer_timeout_ms;  /* silence that declares such a peer dead */
	uint32_t max_xfers; /* bound on live transfers, pending wants included */
	uint32_t staging_mb;	/* GPU memory: bound on the staged path's
				 * pinned host buffers (and as much device) */
	uint32_t staging_chunk_mb; /* one staged message at most */
	const char *curve_key;	 /* our CURVE certificate; NULL: no CURVE */
	const char *curve_peers; /* members: address and public key */
};

/* The documented defaults (docs/configuration.md); options change them. */
static inline struct agent_config agent_config_defaults(void)
{
	return (struct agent_config){ .xfer_timeout_ms = 30000,
				      .handshake_timeout_ms = 5000,
				      .lease_ms = 10000,
				      .layer_timeout_ms = 10000,
				      .heartbeat_ms = 1000,
				      .peer_timeout_ms = 5000,
				      .max_xfers = 4096,
				      .staging_mb = 256,
				      .staging_chunk_mb = 16 };
}

/* One registered region of the engine's memory, mapped here (host) or
 * opened with CUDA IPC (GPU). */
struct region {
	void *addr;
	bool cuda;
	uint8_t ipc[PDX_CUDA_IPC_BYTES]; /* cuda: the engine's handle */
	uint64_t size;
	char shm_name[256];
	struct pdx_ucx_mem *mem;
	void *rkey;
	size_t rkey_len;
};

struct registration {
	bool ok;
	struct pdx_kv_layout layout;
	struct region *regions;
	uint32_t n_regions;
	uint8_t engine_id[256]; /* ZeroMQ ROUTER identity of the engine */
	size_t engine_id_len;
	int engine_fd;	    /* its ZeroMQ connection's (engine_watch.c) */
	bool cuda;	    /* its regions are GPU memory (all of them) */
	int device;	    /* cuda: the engine's device */
	void **events;	    /* cuda: slots x layers "layer computed" events */
	uint32_t event_slots; /* 0: none; layer_done means written */
	struct tp_rank tp;    /* register's "tp" */
	char kv_dtype[PDX_KV_DTYPE_MAX]; /* register's "kv_dtype"; "": none */
};

struct remote_region {
	uint64_t addr;
	uint64_t size;
	struct pdx_ucx_rkey *rkey;
	char shm_name[256];
	uint8_t *map; /* ipc: the region mapped here */
	bool cuda;
	uint8_t ipc[PDX_CUDA_IPC_BYTES]; /* cuda: its engine's handle */
	void *dptr; /* cuda-ipc: the region opened here */
};

/* An endpoint of a dropped handshake, and the rkeys unpacked on it,
 * kept while transfers need it (peer_reset). */
struct peer_ep_kept {
	struct peer_ep_kept *next;
	uint64_t kept_ns; /* since when */
	struct pdx_ucx_ep *ep;
	struct pdx_ucx_rkey **rkeys;
	uint32_t n_rkeys;
};

enum peer_state { PEER_NEW, PEER_HELLO_SENT, PEER_READY, PEER_REFUSED };

struct peer {
	char addr[PDX_ADDR_MAX];
	UT_hash_handle hh;
	struct agent *agent;
	void *dealer; /* ZeroMQ DEALER connected to the peer's ROUTER */
	enum peer_state state;
	char refusal[PDX_REASON_MAX];
	/* what its transfers fail with: PDX_EINCOMPAT (the two do not
	 * pair), PDX_EPEER (it has no engine: its end, not a mismatch) */
	pdx_status_t refusal_st;
	uint64_t instance;
	bool same_host;
	bool peer_shm; /* its UCX may use shared memory */
	bool stale;    /* stopped answering: hello again before the next use */
	/* we took a new instance: the handshake is made anew at the
	 * peer's answer to our hello (its rkeys and maps; the UCX endpoint
	 * to its worker is the same one, transport/ucx.h) */
	bool ep_renew;
	bool ep_failed; /* UCX found it dead; the endpoint awaits closing */
	bool cuda;	/* its engine's KV is GPU memory */
	bool cuda_ucx;	/* its UCX moves GPU memory */
	bool done_ucx;	/* it takes "done" by UCX on the ipc lanes */
	bool stops;	/* it answers a receiver's "abort" with "stopped" */
	bool slices;	/* it takes "slice" messages on the put lane too */
	/* staged path, same host: its staging mapped here (staged.c) */
	bool staged_shared;
	uint8_t *staging_map;
	size_t staging_len;
	uint32_t staging_slots;
	uint64_t staging_slot_bytes;
	enum data_path path; /* chosen at the handshake (path_choice.c) */
	const struct data_path_ops *ops; /* path's operations */
	struct pdx_kv_layout layout;
	struct tp_rank tp; /* its hello's "tp" */
	struct pdx_ucx_ep *ep;
	/* its UCX worker's address as its last hello said, kept past
	 * peer_reset(): our hellos tell it the number of our endpoint to
	 * that worker (handshake.c) */
	uint8_t *worker;
	size_t worker_len;
	/* the "ucx_ep" number our last hello to it said; -1: none said (we
	 * had not heard its worker: a peer forgotten and met again) */
	int64_t sn_told;
	struct remote_region *regions;
	uint32_t n_regions;
	/* endpoints of dropped handshakes kept, with their rkeys, while
	 * transfers still need them (peer_reset) */
	struct peer_ep_kept *ep_kept;
	uint64_t hello_sent_ns;
	uint64_t heard_ns; /* the last message from it */
	/* it restarted while wants of ours to its old instance were
	 * unanswered (xfer want_unsure): REWANT_HELLO, a hello goes once
	 * the message that said so is handled; REWANT_ACK, it went, and
	 * its answer (after any refusal of those wants) ends the wait */
	uint8_t rewant;
	bool watched;	   /* we had transfers with it at the last beat */
	bool busy;	   /* scratch of a beat: transfers with it now */
	bool stuck;	   /* its UCX endpoint is stuck: lost at the next beat */
	bool named;	   /* scratch of peers_mark_named(): a transfer names it */
	/* an operation on its endpoint finished: the latest of its
	 * transfers' op_done_ns, gathered at each beat (liveness.c) */
	uint64_t ucx_done_ns;
	/* bytes of slice buffers with it in flight, and transfers with it
	 * waiting for room (slice_bufs.c) */
	uint64_t slice_out;
	uint32_t slice_waits;
	struct peer_return *ret; /* our DEALER's connects, until one joins */
	struct event *reply_ev;	 /* what it answers on our DEALER */
	/* it said it cannot reach us at our address (hello_nack
	 * "unreachable"), while our hello waits: the hello's bound says it */
	char cannot_reach_us[PDX_REASON_MAX];
};

enum xfer_role { XFER_SEND, XFER_RECV };

struct xfer {
	struct pdx_xfer_id id;
	UT_hash_handle hh;
	struct agent *agent;
	enum xfer_role role;
	bool announced;   /* our engine named it (send/recv) */
	bool held;        /* receiver: our engine queued it (hold) */
	/* more senders it holds it with (hold named several: a rank taking
	 * heads from prefill ranks of another TP size), beside x->peer */
	struct peer **held_also;
	uint32_t n_held_also;
	bool finished;    /* outcome decided; freed when inflight drains */
	uint64_t ended_ns; /* when it finished */
	uint64_t op_done_ns; /* when a UCX operation of its finished */
	uint64_t ops_since_ns; /* its UCX operations in flight since */
	bool event_sent;
	bool released;    /* out of the table, on the dead list */
	struct xfer *next_dead;
	struct peer *peer; /* the only agent this transfer may go to/come from */
	uint64_t peer_instance; /* the peer's incarnation we began with */
	uint64_t era; /* agent->retired when it began (engine_link.c) */
	/* the endpoint of its peer's dropped handshake, kept while it needs
	 * it (peer_reset) */
	struct peer_ep_kept *ep_kept;
	/* that endpoint was cut: its operations in flight end with it, and
	 * do not tell whether the peer's endpoint now is stuck */
	bool ep_kept_cut;
	char peer_addr[PDX_ADDR_MAX];
	uint32_t *blocks; /* ours, token order */
	uint32_t *remote_blocks; /* the other side's: the receiver's (send),
				  * the sender's (a pull's receiver) */
	uint32_t n_remote;
	uint32_t n_blocks;
	uint32_t skip; /* leading blocks not transferred */
	struct pdx_xfer_sm sm; /* sender */
	struct pdx_run *runs;  /* sender: coalesced runs, once blocks known */
	size_t n_runs;
	bool path_ready;       /* sender: the path's ready() ran */
	uint32_t inflight;     /* UCX operations referencing this transfer */
	uint64_t bytes;        /* payload bytes moved */
	uint64_t am_bytes;     /* receiver: bytes that arrived as messages */
	int64_t first_token;   /* the prefill's first token, -1: not given */
	uint8_t *meta;         /* the engine's bytes beside the KV (xfer_set_meta) */
	size_t meta_len;
	uint64_t am_expected;  /* receiver: from "done" */
	struct pdx_kv_plan *plan;      /* GPU: our blocks [skip, n) */
	struct pdx_kv_plan *peer_plan; /* cuda-ipc sender: the receiver's */
	bool done_seen;        /* receiver: "done" arrived */
	bool want_sent;        /* receiver: "want" went to the sender */
	bool wanted_again;     /* receiver: its want was refused for want
				* of a handshake, and sent again after one */
	/* receiver: its want went to the peer's instance before the one
	 * whose hello just came, nothing of it was heard, and it is not
	 * known which one took it: it waits for the new one's answer
	 * (refused: nothing moved, it is asked again; else it fails) */
	bool want_unsure;
	bool pull;	       /* the receiver reads the sender's blocks once
				* all layers are computed (pull.c) */
	bool pulled_sent;      /* pull's receiver: its reads ended: "pulled" */
	/* pull's sender: "readable" went, so the receiver may be reading
	 * our memory (on the put lane our UCX worker answers its gets
	 * from it) until "pulled", its "stopped" or its abort */
	bool readable_sent;
	/* A receiver that gave up while the sender may still write into its
	 * blocks tells its engine only once the sender said "stopped" (the
	 * engine reuses the blocks at its event), the peer is gone, or
	 * --peer-timeout-ms passed; so does a pull's sender that gave up
	 * while the receiver may still read its memory by UCX get (and its
	 * memory, its engine gone, is kept that long: engine_link.c). */
	bool await_stopped;
	/* sender, or a pull's receiver: "stopped" once its operations
	 * (a pull's reads) ended */
	bool owe_stopped;
	/* sender, or a pull's receiver: "abort" once its operations ended */
	bool owe_abort;
	/* sender: the endpoint flushed before that "stopped" or "abort"
	 * (complete_stop_flush) */
	bool stop_flushed;
	/* pull's receiver: the next layer to read; with pull_whole (the
	 * sender's whole blocks, pull.c) the tensor and position too */
	uint32_t pull_layer, pull_tensor, pull_index;
	bool pull_whole;
	/* waits for room in slice_bufs.c (a pull's: its next buffer), each
	 * holding x: not UCX operations (liveness.c) */
	uint32_t room_waits;
	uint32_t timeout_ms;
	struct event *timer;
	uint64_t begun_ns;    /* the current phase began (xfer_arm) */
	uint64_t lease_ns;    /* sender before "want": kept until then */
	uint64_t progress_ns; /* sender: the last layer computed */
	uint64_t t_first_ns;
	uint64_t marks[MARK_N]; /* PDX_AGENT_TRACE: trace.h */
	pdx_status_t status;
	char reason[PDX_REASON_MAX];
	char peer_abort[PDX_REASON_MAX]; /* the peer gave up before we began */
	/* TP p != d (tp_legs.c): the engine's transfer is a group of legs,
	 * each an ordinary transfer with one peer. */
	struct xfer *group;	/* a leg: its group, held (inflight) by it */
	struct tp_group *tp;	/* a group: its legs */
	struct tp_slice slice;	/* a leg: the heads it moves */
	bool order_slice;	/* slice is all heads: the orders differ */
	struct tp_rank peer_tp;	/* a leg: the peer's rank, as listed */
	/* queued to go on from the loop (xfer_yield): how, and where */
	void (*later)(struct xfer *x);
	struct xfer *later_prev, *later_next;
};

/* How a transfer's end reaches the files above xfer.c, which main.c (or
 * a harness in its place) installs: xfer.c decides the outcome, these
 * carry it out, so the transfer table calls nothing above itself. */
struct xfer_ops {
	/* Our engine's event, "sent", "received" or "failed" (engine_link.c). */
	void (*engine_event)(struct agent *a, struct xfer *x, const char *kind);
	/* The collector's notification of the same outcome (notify.c). */
	void (*notify)(struct agent *a, struct xfer *x, const char *kind);
	/* Tells the agent at addr: op "abort" (ours) or "error" (unknown). */
	void (*tell_peer)(struct agent *a, const char *addr, const char *op,
			  const struct pdx_xfer_id *xfer, const char *reason);
	/* A leg or a group of legs decided its outcome (tp_legs.c). */
	void (*legs_decided)(struct xfer *x);
	/* Before a sender's owed "stopped" or "abort": true when a flush
	 * of its endpoint began, at whose end x is released again
	 * (complete.c); NULL: none. */
	bool (*stop_flush)(struct xfer *x);
};

/* slice_bufs.c's state: buffers kept for the next slice, those UCX has
 * not finished with, and what waits for room, in order. */
struct slice_bufs {
	struct slice_buf *bufs, *live; /* kept; and in use */
	uint32_t n_bufs;
	uint64_t bytes_out; /* of buffers counted (slice_buf_count) */
	/* of those, each peer's up to its share: what the budget bounds */
	uint64_t shares_out;
	uint64_t waited; /* transfers that waited for room, ever (metrics) */
	struct slice_wait *waits; /* in order (utlist) */
	bool stopping; /* the transfers are gone: callbacks free only */
	bool resuming; /* in slice_bufs_resume() */
};

/* A message from the engine link, whichever way it came (engine_on_msg). */
typedef void (*engine_msg_fn)(struct agent *a, const void *id, size_t id_len,
			      const void *buf, size_t len);

#define ENGINE_DIRECT_PENDING 4

/* engine_direct.c's state: the direct lane of the engine link. */
struct engine_direct {
	int lfd;	    /* listening (valid while lev) */
	struct event *lev;  /* NULL: no lane offered (--engine-direct off) */
	char name[48];	    /* its abstract socket name, without the NUL */
	engine_msg_fn on_msg;
	uint8_t token[16];  /* of the last offer */
	bool offered;	    /* that offer not taken yet */
	uint8_t id[256];    /* the engine connection offered to */
	size_t id_len;
	struct lane *pending[ENGINE_DIRECT_PENDING]; /* token unchecked */
	struct lane *lane;  /* that connection's lane, token checked */
	struct lane *draining; /* a lane whose end came, sending what it is
				* still owed before it closes */
	bool tx, rx;	    /* our marker went: we send on it; the engine's
			     * came: we read it */
};

/* A ZeroMQ socket's monitor, read from the loop (zmonitor.c). */
struct zmonitor {
	void *sock; /* the socket watched */
	void *mon;  /* PAIR: its events */
	struct event *ev;
};

/* What a DEALER's connects met (connect_watch.c). */
struct connect_watch {
	struct zmonitor mon;
	uint32_t seen;	    /* its ZMQ_EVENT_* bits so far */
	uint64_t trying_ns; /* a connect under way since (0: none) */
	bool refused;	    /* a connect ended at once */
	bool dropped;	    /* a connect went unanswered */
};

/* Whether our advertised address reaches this agent: advertise_check.c
 * sends a probe there at start, peer_dispatch.c takes it back. */
struct advertise_check {
	void *sock;	     /* DEALER to a->peer_addr, while the probe is out */
	struct connect_watch conn; /* its connects */
	struct event *timer; /* the bound for the probe's return */
	uint8_t nonce[16];   /* ours: a probe with another came elsewhere */
	uint64_t sent_ns;
	bool sent;	     /* a probe went: what follows counts */
	bool reached;	     /* it came back */
	bool peer_heard;     /* a peer's message came: peers reach us */
	bool late;	     /* not back at the bound, for sure: said, and
			      * transfers whose hello goes unanswered blame
			      * this agent */
	bool loopback;	     /* our address is a loopback one */
	char why[48];	     /* what the connection's events said, if late */
	uint64_t other_ns;   /* another agent's probe, last said */
};

/* engine_watch.c's state: the engine link's monitor, and which
 * descriptors' connections closed (and were not accepted again). */
struct engine_watch {
	struct zmonitor mon;
	uint8_t *closed; /* by descriptor: 1 closed */
	size_t n;
};

/* A collector of transfer notifications (--notify): a PUSH socket of its
 * own (one socket connected to two would deal the messages out between
 * them), its handshakes watched (notify_watch.c). */
struct notify_target {
	const char *addr;
	void *sock;
	struct zmonitor mon;
	struct event *bound; /* NOTIFY_BOUND_MS after start: met yet? */
	bool refused; /* the last handshake there failed */
	bool met;     /* a handshake there succeeded */
	bool connected; /* a connection there was made (its handshake
			 * follows) */
};

struct agent {
	struct agent_config cfg;
	const struct xfer_ops *xfer_ops;
	/* agent_settle(), installed by main.c: the timers and GPU completions
	 * of the files below it end with it without calling up. */
	void (*settle)(struct agent *a);
	struct event_base *base;
	void *zctx;
	void *engine_sock; /* ROUTER, ipc:// */
	struct engine_direct direct; /* beside it (engine_direct.c) */
	struct pdx_ipc_path engine_ipc; /* its socket file, removed at stop */
	void *peer_sock;   /* ROUTER, tcp:// */
	struct notify_target notify[NOTIFY_MAX]; /* cfg.n_notify of them */
	struct event *engine_ev, *peer_ev, *ucx_ev, *sig_int, *sig_term,
		*sig_hup;
	struct event *ucx_poll_ev; /* polls UCX while it cannot be armed */
	struct event *beat_ev; /* heartbeat timer (liveness.c) */
	uint64_t beat_ns;      /* when it last ran */
	/* what held the loop since, knowingly (a mapping touched page by
	 * page: about 1.5 s a GiB on a VM, common/prefault.h): the next
	 * beat, late, says it */
	const char *held_by;
	/* the last warning of a layer_done naming a transfer not announced
	 * (at most one a second: engine_link.c) */
	uint64_t early_layer_done_ns;
	struct pdx_ucx *ucx;
	char peer_addr[PDX_ADDR_MAX];
	char host_id[192];
	uint64_t instance;
	struct registration reg;
	/* registrations ended whose memory waits for the UCX operations on
	 * it to end (engine_link.c) */
	struct registration_left *left;
	/* registrations retired so far: only a transfer begun before the
	 * last (its era below this) may still be on their memory */
	uint64_t retired;
	/* the engine's connection closed since it registered: the next
	 * register draws a new instance and says it to every peer */
	bool engine_left;
	/* the ZeroMQ connection the engine message in hand came on
	 * (ZMQ_SRCFD), -1 for one off the direct lane (main.c) */
	int engine_msg_fd;
	/* the ROUTER's name for the connection the peer message in hand
	 * came on (main.c), NULL for none */
	const void *peer_route;
	size_t peer_route_len;
	const struct peer_return_ops *peer_return; /* NULL: none */
	unsigned peer_returns; /* peers whose connects are watched */
	struct engine_watch engine_watch; /* the engine link's connections */
	struct zmonitor peer_watch;	  /* the peer link's accepts */
	struct advertise_check advertise; /* does peer_addr reach us? */
	unsigned long long nofile;	  /* the descriptor limit (ulimit -n) */
	struct peer *peers;
	unsigned peers_ep_kept; /* endpoints peer_reset() kept, all peers */
	struct xfer *xfers;
	/* transfers that gave the loop back and go on from it (xfer_yield) */
	struct xfer *later;
	struct event *later_ev;
	uint64_t turn_ns; /* the loop's turn began */
	struct xfer *dead; /* released, freed by xfers_reap() */
	struct pdx_ended *ended; /* recently ended transfers, with why */
	struct agent_metrics metrics; /* metrics.c: counts, /metrics */
	struct pdx_curve *curve; /* NULL: the peer link is not secured */
	struct gpu *gpu;	 /* the engine's device, once it registered GPU
				  * memory (agent/gpu.h) */
	struct staging *staging; /* the staged path's buffers (staged.c) */
	void *zap_sock;		 /* REP: CURVE's ZAP handler */
	struct event *zap_ev;
	uint32_t n_xfers;
	uint64_t ops_inflight; /* UCX operations of all transfers */
	struct slice_bufs slices; /* TP slices' buffers (slice_bufs.c) */
	uint64_t notify_dropped;
	bool trace; /* PDX_AGENT_TRACE=1: transfers are stamped (trace.h) */
	/* PDX_AGENT_NO_SLICES=1: our hello leaves out "slices", as a
	 * version 3 agent's did (tests of the put lane's put per row) */
	bool no_slices;
};

/* We hold a working handshake with p (it may be being refreshed). */
static inline bool peer_known(const struct peer *p)
{
	return p && p->ep && !p->ep_failed;
}

/* zsend.c: sends a msgpack buffer as one frame on sock (ROUTER: after
 * identity). */
int agent_zsend(void *sock, const void *id, size_t id_len, const void *buf,
		size_t len);

/* A UCX operation starts or ends on x's blocks. */
static inline void xfer_hold(struct xfer *x)
{
	if (!x->inflight++)
		x->ops_since_ns = pdx_now_ns();
	x->agent->ops_inflight++;
}

static inline void xfer_unhold(struct xfer *x)
{
	x->inflight--;
	x->agent->ops_inflight--;
	/* its endpoint moves (liveness.c); not through x->peer, which at
	 * stop is freed before UCX cancels what is left */
	x->op_done_ns = pdx_now_ns();
}

/* x waits for room for slices (slice_bufs.c): held, so that it stays
 * until its turn, but no UCX operation (no op_done_ns stamp: liveness.c,
 * peer.c) and nothing for the loop to spin for. */
static inline void xfer_hold_wait(struct xfer *x)
{
	x->inflight++;
	x->room_waits++;
}

static inline void xfer_unhold_wait(struct xfer *x)
{
	x->inflight--;
	x->room_waits--;
}

/* x's holds that are operations (UCX, GPU work), not waits for room. */
static inline uint32_t xfer_ops_out(const struct xfer *x)
{
	return x->inflight - x->room_waits;
}

/* A step of x's control path, stamped when tracing (trace.h). */
static inline void xfer_mark(struct xfer *x, enum xfer_mark m)
{
	if (x->agent->trace)
		x->marks[m] = pdx_now_ns();
}

/* main.c: runs everything ready (messages, UCX completions) until nothing
 * is; every event callback ends with it (a->settle below main.c). */
void agent_settle(struct agent *a);

/* engine_direct.c: the engine link's direct lane (docs/protocol.md, "The
 * direct lane"). listen: opens its socket, frames read off it go to on_msg
 * (main.c gives engine_on_msg). offer: the fields of a "registered"
 * answer to the connection id that offer the lane (none while that
 * connection has one; another's lane is closed). marker: that
 * connection's {"op": "direct"} came on ZeroMQ. send_frame: a message for
 * the engine connection id, on its lane when it has one, else on ZeroMQ
 * (-1: dropped, link busy or gone). */
int engine_direct_listen(struct agent *a, engine_msg_fn on_msg);
void engine_direct_offer(struct agent *a, const void *id, size_t id_len,
			 struct pdx_mp_msg *ans);
void engine_direct_marker(struct agent *a, const void *id, size_t id_len);
/* drop: the lane of connection id ends (another registered). catch_up:
 * a ZeroMQ message from connection id came: what its lane holds goes
 * first (an engine that closed its lane and went on on ZeroMQ). */
void engine_direct_drop(struct agent *a, const void *id, size_t id_len);
void engine_direct_catch_up(struct agent *a, const void *id, size_t id_len);
int engine_send_frame(struct agent *a, const void *id, size_t id_len,
		      const void *buf, size_t len);
void engine_direct_stop(struct agent *a);

/* engine_link.c */
void engine_on_msg(struct agent *a, const void *id, size_t id_len,
		   const void *buf, size_t len);
void engine_send_event(struct agent *a, struct xfer *x, const char *kind);
/* the engine's connection closed (engine_watch.c): its registration ends,
 * its memory is released and its peers are told */
void engine_gone(struct agent *a);
/* the memory of registrations ended, once no UCX operation is on it
 * (each turn of the loop); all of it, at stop */
void registrations_left_release(struct agent *a);
void registration_clear(struct agent *a);

/* engine_watch.c: the engine link's connections watched; drain: the
 * events so far (before an engine message off ZeroMQ: a connection that
 * closed is seen before one that took its descriptor); closed: the
 * connection a message came on (ZMQ_SRCFD) had closed when it was read */
int engine_watch_start(struct agent *a);
void engine_watch_drain(struct agent *a);
bool engine_watch_closed(struct agent *a, int fd);
void engine_watch_stop(struct agent *a);

/* peer_watch.c: a peer's connection the peer link could not accept (no
 * descriptor left) is said, at most once a second */
int peer_watch_start(struct agent *a);
void peer_watch_stop(struct agent *a);

/* advertise_check.c: a probe to our own advertised address, which
 * peers answer at, and a warning when it does not come back */
int advertise_check_start(struct agent *a);
void advertise_check_stop(struct agent *a);

/* peer_return.c: whether our answers reach a peer at its address, and
 * what it answers on our DEALER to it. Called, when installed, by peer.c
 * (opened: its DEALER made, before its connect; closed: before the DEALER
 * closes), handshake.c (answered: we answered its hello, which came on
 * a->peer_route) and peer_send.c (sent: we sent on its DEALER). */
struct peer_return_ops {
	void (*opened)(struct agent *a, struct peer *p);
	void (*answered)(struct agent *a, struct peer *p);
	void (*sent)(struct peer *p);
	bool (*unreached)(struct agent *a, struct peer *p, char *why,
			  size_t len);
	void (*closed)(struct agent *a, struct peer *p);
};
extern const struct peer_return_ops peer_return_ops;

/* peer_send.c: tells p our engine's registration of a->instance ended
 * ({"op": "gone"}) */
void tell_gone(struct agent *a, struct peer *p);

/* peer_send.c: every message to a peer, built in one place */
struct peer_msg {
	struct pdx_mp_msg m; /* add fields with pdx_mp_msg_*(&pm.m, ...) */
	const char *op;
};
/* Starts {"op": op, "from": our address} with "xfer" and "reason" when
 * given; the caller adds its fields and sends it. */
void peer_msg_begin(struct peer_msg *pm, const struct agent *a, const char *op,
		    const struct pdx_xfer_id *xfer, const char *reason);
/* Sends it on p's DEALER and frees it, whatever happens: PDX_ENOMEM when
 * building it ran out of memory, PDX_EPEER when the socket refused it
 * (both logged, with the op and the peer). */
pdx_status_t peer_msg_send(struct peer_msg *pm, struct peer *p);
/* The same on a DEALER of no peer's (addr: its address, for the log). */
pdx_status_t peer_msg_send_on(struct peer_msg *pm, void *dealer,
			      const char *addr);
/* The same on our ROUTER (router), to the connection named route: an
 * answer over the connection a peer's message came on (peer_return.c). */
pdx_status_t peer_msg_reply(struct peer_msg *pm, void *router,
			    const void *route, size_t route_len,
			    const char *addr);
/* A message of no fields but those peer_msg_begin() writes. */
pdx_status_t peer_send(struct agent *a, struct peer *p, const char *op,
		       const struct pdx_xfer_id *xfer, const char *reason);

/* peer.c: a DEALER for addr with the peer link's options (heartbeats,
 * bounds, CURVE), not connected; NULL (logged) when it cannot */
void *peer_dealer_new(struct agent *a, const char *addr);

/* peer.c: the peers we know, by address */
/* create: a peer met for the first time gets its DEALER; NULL when it
 * cannot be connected (or, without create, is not known). */
struct peer *peer_lookup(struct agent *a, const char *addr, bool create);
/* Drops p's handshake: its regions, rkeys and UCX endpoint (closed by
 * force, so nothing more of ours lands there or of theirs here); the next
 * use says hello. An endpoint a transfer still needs (our operations in
 * flight on it, a pull's gets among them; or the peer's gets of our
 * memory, a pull we send whose "stopped" we await) is kept, with its
 * rkeys, until it no longer does, or made no progress for
 * --peer-timeout-ms (a pull's sender, with no operation of its own on it
 * to count: --peer-timeout-ms after it was kept); its errors are no
 * longer p's. Closed, it cut the
 * gets short: the receiver said "stopped" while the sender's UCX worker
 * still had answers to them queued, read from memory the sender releases
 * at that word, or the sender dropped the gets unanswered. */
void peer_reset(struct agent *a, struct peer *p);
/* peer_reset(), every endpoint of p cut, the kept ones too: operations
 * on them end, and the next handshake makes a new UCX endpoint (a peer
 * found lost, or stuck). peer_reset() lets the UCX endpoint stay open for
 * the next handshake with that worker (transport/ucx.h). */
void peer_cut(struct agent *a, struct peer *p);
/* Closes the endpoints peer_reset() kept that no transfer needs any
 * more, or that made no progress for --peer-timeout-ms, as it says (after
 * each turn of the loop). */
void peers_kept_release(struct agent *a);
/* Forgets p: its handshake, its DEALER, its entry. Only a peer no
 * transfer names (peers_mark_named). */
void peer_free(struct agent *a, struct peer *p);
/* Sets each peer's named: a transfer, live or ended with operations
 * still out, names it (its peer, or one it is held with). */
void peers_mark_named(struct agent *a);
void peer_send_to_addr(struct agent *a, const char *addr, const char *op,
		       const struct pdx_xfer_id *xfer, const char *reason);
void peers_free(struct agent *a);

/* handshake.c: hello, hello_ack, hello_nack */
/* The peer at addr, with a hello sent when it needs one (never met, its
 * hello unanswered in time, quiet or stale). */
struct peer *peer_get(struct agent *a, const char *addr);

/* The error answering a message from a peer we hold no handshake with. */
#define PEER_NO_HANDSHAKE "no handshake with you: send hello first"
/* The error answering a want whose to_instance is not ours: nothing of
 * it was sent, and the receiver asks again with our instance. */
#define PEER_STALE_WANT \
	"want: sent to this agent's earlier instance (it restarted, or its " \
	"engine registered again): nothing sent; want again with the " \
	"instance of its hello"
/* The error answering a want marked "renewed" (first sent to an earlier
 * instance of ours) whose transfer our engine has not announced. */
#define PEER_RENEWED_UNKNOWN \
	"want renewed after this agent restarted: its engine has not " \
	"announced the transfer (its earlier instance's are not its own)"
enum { REWANT_NONE, REWANT_HELLO, REWANT_ACK };
/* Their hello or hello_ack: parsed, checked, applied, or refused. */
void handshake_on_hello(struct agent *a, const char *from,
			const msgpack_object *m, bool is_ack);
void handshake_on_nack(struct agent *a, struct peer *p,
		       const msgpack_object *m);
/* The peer became ready or refused: move its transfers on. */
void xfers_peer_ready(struct agent *a, struct peer *p);

/* path_choice.c: a peer's data path, chosen when its hello is applied */
/* UCX may use shared-memory transports (UCX_TLS does not leave them out). */
bool path_ucx_has_shm(void);
/* Sets p->path from both sides' hellos and --data-path; a forced path
 * that cannot work is refused with why. staging: the peer's hello's. */
pdx_status_t path_choose(struct agent *a, struct peer *p,
			 const msgpack_object *staging, char *err,
			 size_t errlen);

/* peer_dispatch.c: the peer link's messages as they arrive */
/* user: with CURVE, the address listed for the sender's key. */
void peer_on_msg(struct agent *a, const void *buf, size_t len,
		 const char *user);
/* What p answered on our DEALER to it: a hello_nack of a peer that cannot
 * reach us at our address (peer_return.c); anything else is dropped. */
void peer_on_reply(struct agent *a, struct peer *p, const void *buf,
		   size_t len);

/* xfer.c */
struct xfer *xfer_find(struct agent *a, const struct pdx_xfer_id *id);
struct xfer *xfer_new(struct agent *a, const struct pdx_xfer_id *id,
		      enum xfer_role role, const char *peer_addr,
		      uint32_t timeout_ms);
/* Decides the outcome: failed with status and reason. tell_peer sends an
 * abort to the peer. The engine hears once no operation uses the blocks. */
void xfer_fail(struct xfer *x, pdx_status_t status, bool tell_peer,
	       const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void xfer_succeed(struct xfer *x);
/* x, when it is a send our engine left open (no peer named), is p's from
 * now on: p presented its id first (want, or a hold in its ping). */
void xfer_claim(struct xfer *x, struct peer *p);
/* x entered a new phase (announced, "want" known, held): its bounds
 * count from now. */
void xfer_begin_phase(struct xfer *x);
/* Re-arms x's timer for the nearest of its bounds: the phase's timeout,
 * the sender's lease before "want", the sender's gap between layers. */
void xfer_arm(struct xfer *x);
/* The engine's bytes beside the KV, a copy (len 0: none); PDX_ENOMEM. */
pdx_status_t xfer_set_meta(struct xfer *x, const void *data, size_t len);
/* The fields an engine event and a notification share (docs/protocol.md):
 * xfer, kind, status, reason, bytes, t_first, t_last, first_token. */
void xfer_pack_outcome(struct pdx_mp_msg *m, const struct xfer *x,
		       const char *kind);
/* Once a finished transfer's operations drained: its event to the engine,
 * and out of the table. */
void xfer_maybe_release(struct xfer *x);
/* A push of ours (not a TP group or leg) that moved bytes: some may still
 * be on their way once its operations ended here (a put over TCP), so its
 * "stopped" or "abort" waits for the endpoint's flush (stop_flush). */
bool xfer_pushed(const struct xfer *x);
/* The sender said "stopped" (or is gone): a receiver that waited for it
 * (await_stopped) tells its engine now. */
void xfer_stop_heard(struct xfer *x);
/* The loop's turn may move data this long (layers already computed: a
 * whole prompt at once, for every transfer whose layer_done came in the
 * turn) before the transfers give it back, so that the engine link, the
 * peers and the heartbeats are not kept waiting for seconds. */
#define TURN_SLICE_NS 2000000
/* True, with x queued to go on by fn(x) from the loop (then settled),
 * once TURN_SLICE_NS passed since the turn began (a->turn_ns: set by
 * agent_settle() and by the queue's own turn); false (nothing done)
 * before. A transfer leaves the queue when it leaves the table. */
bool xfer_yield(struct xfer *x, void (*fn)(struct xfer *x));
/* Fails the peer's transfers; with instance != 0 only those begun with that
 * incarnation of it (a restarted peer knows nothing of them). */
void xfers_peer_failed(struct agent *a, struct peer *p, uint64_t instance,
		       pdx_status_t status, const char *reason);
/* The agent stops: every transfer ends here quietly (no event, no peer
 * told) and is freed, but for those a UCX operation still names, which
 * its cancelled callback reads after the endpoints close: xfers_reap()
 * frees them once UCX is gone. */
void xfers_free(struct agent *a);
/* Frees released transfers; only agent_settle() calls it (and the agent's
 * stop, last). */
void xfers_reap(struct agent *a);

/* complete.c: a transfer's data operations finishing */
/* A data operation on x's blocks ended (the UCX callback form: _cb). */
void complete_op_ended(struct xfer *x, pdx_status_t status);
void complete_op_ended_cb(void *arg, pdx_status_t status);
/* Once every layer was pushed and every operation ended: the path's
 * flush, then "done". */
void complete_try_flush(struct xfer *x);
/* The flush of the paths whose bytes UCX moves: its flush, then "done". */
pdx_status_t complete_flush_ucx(struct xfer *x);
/* xfer_ops.stop_flush: a sender's endpoint flushed before its "stopped"
 * or "abort", where its bytes went by UCX (a put over TCP may still be
 * on its way when it ended here). */
bool complete_stop_flush(struct xfer *x);
/* Receiver: once "done" came and what it announced arrived, success. */
void complete_try_received(struct xfer *x);
/* Receiver: the sender's "done" (either link) says what it sent. */
void complete_done_heard(struct xfer *x, uint64_t bytes, uint64_t am_bytes,
			 int64_t first_token);
/* UCX's handler of AM_DONE: "done" on the ipc and cuda-ipc lanes. */
void complete_on_done_am(void *arg, const void *hdr, size_t hdr_len,
			 void *data, size_t len, bool rndv);
/* Every byte is at the receiver (flushed, or read by a pull): "done" to
 * it, and x succeeds. */
void complete_send_done(struct xfer *x);

/* host_path.c: what the host paths share (ipc, put, am; cuda-put) */
uint8_t *host_block_addr(const struct registration *g, uint32_t layer,
			 uint32_t tensor, uint32_t block);
/* x's runs of blocks, once both sides' blocks are known (the ready of
 * ipc, put, am and cuda-put). */
pdx_status_t host_plan_runs(struct xfer *x);
/* One run of one tensor of one layer: our blocks (what a push sends, where
 * a pull reads into)... */
struct host_run {
	uint8_t *src;
	struct pdx_ucx_mem *mem; /* our region's UCX registration */
	uint64_t len;
	/* ...and the peer's: region ri at off (to_peer only) */
	uint32_t ri;
	uint64_t off;
};
typedef pdx_status_t (*host_run_fn)(struct xfer *x, uint32_t layer,
				    uint32_t t, const struct pdx_run *r,
				    const struct host_run *at);
/* Where count of the peer's blocks from `block` of tensor t of layer lie
 * in its regions (at->ri, at->off); PDX_ERANGE past their sizes. */
pdx_status_t host_peer_at(const struct xfer *x, uint32_t layer, uint32_t t,
			  uint32_t block, uint32_t count, struct host_run *at);
/* fn on each run of each tensor of layer; to_peer: with where it lands in
 * the peer's regions, checked against their sizes (PDX_ERANGE). */
pdx_status_t host_each_run(struct xfer *x, uint32_t layer, bool to_peer,
			   host_run_fn fn);
/* A UCX operation on x's blocks of len bytes began. */
void host_op_started(struct xfer *x, uint64_t len);

/* mapped_copy.c: piece p from the block at src to the block at dst,
 * pools mapped here from shared memory; false when one faulted (SIGBUS:
 * its owner shrank it), the copy left part done. */
bool mapped_copy_piece(uint8_t *dst, const uint8_t *src,
		       const struct pdx_kv_piece *p);

/* path_ipc.c: layer of n sender legs of one group (TP p != d) on the ipc
 * lane, each moving its slice of the heads of the same blocks of ours,
 * block by block: every leg's pieces of a block before the next one, so
 * our blocks are read once and in order (legs in the order of their
 * heads). A leg alone reads halves (HND) or rows (NHD) of every block,
 * strided (docs/benchmarking.md, "TP legs against equal TP"). */
pdx_status_t path_ipc_legs_layer(struct xfer *const *legs, uint32_t n,
				 uint32_t layer);

/* path_put.c: every run of one layer put by UCX, from wherever the
 * memory is (cuda-put's puts too). */
pdx_status_t path_put_layer(struct xfer *x, uint32_t layer);

/* push.c: the data path's driver */
/* A sender whose receiver's blocks are known: the path's ready() once
 * (runs of blocks); false while it cannot push yet, or it failed. */
bool push_prepare(struct xfer *x);
/* Pushes every layer ready now; once all are, the flush and "done". */
void push_try(struct xfer *x);
/* Registers each active message's handler (agent/am.h) with our UCX. */
pdx_status_t push_am_register(struct agent *a);

/* pull.c: the receiver reads the sender's blocks (docs/protocol.md, "Pull") */
/* Why x's receiver cannot pull over the lane to p; NULL: it can. */
const char *pull_refusal(const struct agent *a, const struct peer *p);
/* Sender: once every layer is computed, "readable" with our blocks. */
void pull_offer(struct xfer *x);
/* Receiver: the sender's "readable": read its blocks into ours. */
void pull_on_readable(struct xfer *x, const msgpack_object *m);
/* Sender: the receiver's "pulled": it has what it read; "done". */
void pull_on_pulled(struct xfer *x, const msgpack_object *m);

/* liveness.c: heartbeats, silent peers (docs/protocol.md) */
int liveness_start(struct agent *a);
void liveness_stop(struct agent *a);

/* gpu_plan.c: a GPU transfer's plans */
/* Our plan (and the receiver's, for cuda-ipc) once the blocks are known. */
pdx_status_t gpu_plan_xfer(struct xfer *x);
/* Segments (staging blocks) per layer of x: tensors * (n_blocks - skip). */
uint64_t gpu_layer_segments(const struct xfer *x);

/* gpu_path.c: GPU memory (docs/gpu.md) */
/* A launch on our stream for x began (st == PDX_OK): x is held until its
 * completion ends it. Returns st. */
pdx_status_t gpu_launched(struct xfer *x, pdx_status_t st);
/* layer_done with a slot: our stream waits for that event. PDX_EIO when
 * the wait could not be queued: the layer's copies must not go then (they
 * would read it whether or not it was computed). */
pdx_status_t gpu_layer_computed(struct agent *a, uint32_t layer,
				uint32_t slot);

/* am_place.c: where the am lane's data messages land. */
struct am_place {
	uint32_t layer, tensor, index; /* index into the receiver's blocks */
};
/* The header of AM_RUN and AM_SLICE alike (agent/am.h). */
void am_place_header(uint8_t hdr[AM_RUN_BYTES], const struct xfer *x,
		     uint32_t layer, uint32_t t, uint32_t index);
/* The transfer a data message's header names (*at from it), if it is one
 * we await data for; NULL if not or if the header is not one. */
struct xfer *am_place_xfer(struct agent *a, const void *hdr, size_t hdr_len,
			   struct am_place *at);
/* Whether x awaits data for its n blocks from at, of a layer and tensor
 * that exist. */
bool am_place_awaited(const struct xfer *x, const struct am_place *at,
		      uint64_t n);
/* Where n of x's blocks from at lie in our pool; NULL unless they are
 * awaited and consecutive there. */
uint8_t *am_place_blocks(struct xfer *x, const struct am_place *at, uint64_t n);
/* A message for nothing we await: logged (the first of each transfer at
 * warn), a rendezvous payload released. */
void am_place_drop(struct agent *a, const void *hdr, size_t hdr_len,
		   void *data, size_t len, bool rndv);
/* A rendezvous payload of x (arg) arrived, or could not. */
void am_place_received(void *arg, pdx_status_t status);

/* am_slice.c: a TP leg's heads on the am lane, packed */
/* Pushes x's slice of layer, or queues it until there is room. */
pdx_status_t am_slice_push(struct xfer *x, uint32_t layer);
/* AM_SLICE's handler: unpacked into the blocks it names. */
void am_slice_on_message(void *agent, const void *hdr, size_t hdr_len,
			 void *data, size_t len, bool rndv);

/* slice_bufs.c: the buffers slices pass through, and their bound */
#define SLICE_BUF_MAX (1u << 20) /* a buffer kept for the next slice */
struct slice_buf {
	struct slice_buf *next, *prev; /* on the live or the kept list */
	struct agent *agent;
	struct xfer *x;
	struct am_place at; /* the first block's position, layer, tensor */
	uint32_t count;	    /* blocks */
	uint32_t gets;	    /* pull: gets into it still in flight */
	pdx_status_t status; /* pull: the first of them to fail */
	bool counted;	    /* within the bound (slice_buf_count) */
	uint64_t len;
	size_t cap;
	uint8_t bytes[];
};
/* A buffer of len bytes for x (a kept one where it fits); NULL: out of
 * memory. */
struct slice_buf *slice_buf_get(struct agent *a, struct xfer *x, size_t len);
/* b is in flight: it counts against the bound until slice_buf_put(). */
void slice_buf_count(struct agent *a, struct slice_buf *b);
/* b is done with: kept or freed (what waits is not resumed:
 * slice_bufs_resume()). */
void slice_buf_put(struct agent *a, struct slice_buf *b);
/* Blocks a buffer of SLICE_BUF_MAX holds, of blocks of per bytes each:
 * one at least. */
uint32_t slice_buf_blocks(uint64_t per);
/* Whether x may take buffers now (for a layer, or a pull's next). */
bool slice_bufs_room(const struct xfer *x);
typedef void (*slice_resume_fn)(struct xfer *x, uint32_t layer);
/* x waits for room (layer: a push's, for resume), held meanwhile
 * (xfer_hold_wait), after what waits already; resume is called, the hold
 * released, when its turn comes, or at the next slice_bufs_resume() once
 * x has finished (never once the agent stops). */
pdx_status_t slice_bufs_wait(struct xfer *x, uint32_t layer,
			     slice_resume_fn resume);
/* The waits of finished transfers, then the others in order while there
 * is room for their peer: after each counted buffer ends, before its
 * transfer goes on (what waits goes first), and at each heartbeat (for
 * a transfer that failed while the buffers ahead of it hang). */
void slice_bufs_resume(struct agent *a);
/* The agent stops, before its transfers are freed: waiting layers
 * dropped, and buffers still in flight free only themselves. */
void slice_bufs_stop(struct agent *a);
/* The buffers freed, once UCX is gone (nothing calls back). */
void slice_bufs_free(struct agent *a);

/* staged.c: the staged path's bounded buffers and messages */
/* Its buffers, once GPU memory is registered (their name is in hellos). */
pdx_status_t staged_init(struct agent *a);
/* At stop, after pdx_ucx_stop() (no callback can come): chunks lent to a
 * peer, the slots and their memory. */
void staged_free(struct agent *a);
/* The hello's field "staging": {"name", "slots", "slot_bytes"}. */
void staged_pack_hello(struct agent *a, struct pdx_mp_msg *m);
/* Same host: maps and pins the peer's staging named in its hello. */
bool staged_peer_map(struct agent *a, struct peer *p,
		     const msgpack_object *staging);
void staged_peer_unmap(struct agent *a, struct peer *p);
/* p is gone: our slots lent to it are ours again. */
void staged_peer_gone(struct agent *a, struct peer *p);
/* The agent stops (its transfers are about to be freed): chunks waiting
 * for a slot are dropped, and those still on their way only free
 * themselves. */
void staged_stop(struct agent *a);

/* tp_slice.c: which KV heads a pair of TP ranks exchange (pure) */
/* The leg's id: the engine's transfer id xfer with its last four bytes,
 * big-endian, XORed with 0x80000000 | sender << 16 | receiver. */
void tp_leg_id(const struct pdx_xfer_id *xfer, uint32_t sender,
	       uint32_t receiver, struct pdx_xfer_id *out);
/* The heads sender s and receiver r share of `heads` KV heads (the full
 * count, kv_heads * size on either side) in *out; false when none. */
bool tp_slice_of(uint32_t heads, struct tp_rank s, struct tp_rank r,
		 struct tp_slice *out);
/* Whether the receiver r of TP takes from sender s (MLA: one sender gives
 * each receiver the latent; *skip_all: s only gets a want that asks for
 * nothing, so that every sender hears from max(1, d / p) receivers). */
bool tp_mla_pair(struct tp_rank s, struct tp_rank r, bool *skip_all);
/* Why a size or pair of sizes cannot be resharded; NULL when it can. */
const char *tp_size_refusal(uint32_t size, char *why, size_t len);
/* Why layouts a (ours, of TP ta) and b (of TP tb), the same but in
 * kv_heads, cannot exchange heads; NULL: they can. */
const char *tp_heads_refusal(const struct pdx_kv_layout *a, struct tp_rank ta,
			     const struct pdx_kv_layout *b, struct tp_rank tb,
			     char *why, size_t len);
/* Why x cannot go to or come from p (a leg not the rank it was listed
 * as, or a slice its path cannot move, its heads' or its blocks'
 * conversion); NULL: it can. */
const char *tp_peer_refusal(const struct xfer *x, const struct peer *p,
			    char *why, size_t len);
/* Why a leg with slice s cannot take path; NULL: it can (pushed or
 * pulled: pull.c says which lanes pull). */
const char *tp_slice_refusal(const struct tp_slice *s, enum data_path path,
			     struct tp_rank from, struct tp_rank to, char *why,
			     size_t len);
/* x moves whole blocks (equal TP sizes, or MLA's latent) to or from p:
 * where p's blocks are in the other order (NHD, HND), every head as a
 * slice (x->order_slice), converted on the way; else whole blocks again.
 * Decided anew each time p's hello is known, before a want or a push. */
void tp_order_slice(struct xfer *x, const struct peer *p);
/* Whether x's slice of each block is more than one row, from the
 * sender's blocks to the receiver's: a TP leg's heads of NHD blocks (a
 * row per token), or blocks converted to the other order (a row per head
 * and token). */
bool tp_slice_in_rows(const struct xfer *x);
/* Bytes of s's heads in one block of layout l (either order). */
uint64_t tp_slice_block_bytes(const struct tp_slice *s,
			      const struct pdx_kv_layout *l);
typedef pdx_status_t (*tp_piece_fn)(struct xfer *x, const void *ctx,
				    const struct pdx_kv_piece *p);
/* fn on each block's piece of s's heads in a run of count blocks of one
 * tensor (offsets from the run's first byte on each side), src's blocks
 * in either order and dst's in either. */
pdx_status_t tp_slice_each_piece(struct xfer *x, const struct tp_slice *s,
				 const struct pdx_kv_layout *src,
				 const struct pdx_kv_layout *dst, uint32_t count,
				 tp_piece_fn fn, const void *ctx);

/* tp_legs.c: an engine's transfer with TP p != d as a group of legs */
/* Decode side, recv with "peers" (rank order): the peer of equal TP in
 * peer (returns 0), or 1 when legs are needed, or -1 with why. */
int tp_legs_pick(const struct agent *a, const msgpack_object *peers,
		 char *peer, size_t len, char *why, size_t whylen);
/* Decode side: x (announced, blocks known) gets a leg from every prefill
 * rank that holds our heads. */
void tp_legs_recv(struct xfer *x, const msgpack_object *peers);
/* Prefill side: a want for leg id of the engine's transfer `of`. */
void tp_legs_want(struct agent *a, struct peer *p, const struct pdx_xfer_id *id,
		  const struct pdx_xfer_id *of, uint32_t *blocks, uint32_t n,
		  uint32_t skip, bool pull);
/* Prefill side: p, of another TP size than ours, may hold x (its pings
 * renew x's lease) without claiming it: x is our engine's open send, or
 * a group of legs. */
bool tp_legs_holder(const struct agent *a, const struct peer *p,
		    const struct xfer *x);
/* Prefill side: an abort from p (of another TP size) for id, our
 * engine's open send or group, or a leg of it we have not heard of: that
 * transfer fails (or, not announced yet, fails when it is). True when id
 * is such a transfer or leg. */
bool tp_legs_abort(struct agent *a, struct peer *p, const struct pdx_xfer_id *id,
		   const char *reason);
/* Prefill side: our engine announced group x, or computed a layer of it
 * (layer >= 0), or gave what goes beside the KV (first token, meta): its
 * legs follow. */
void tp_legs_announced(struct xfer *x);
void tp_legs_layer_done(struct xfer *x, uint32_t layer);
void tp_legs_beside(struct xfer *x);
/* xfer_ops.legs_decided: a leg's outcome counts into its group; a group
 * that failed fails its other legs. */
void tp_legs_decided(struct xfer *x);

/* notify.c */
void notify_xfer(struct agent *a, struct xfer *x, const char *kind);
/* zmonitor.c: open watches sock's events (ZMQ_EVENT_* bits) by cb on the
 * loop, -1 when it cannot; next: the event waiting, -1 for none (its
 * value: a descriptor for connection events); close: before sock closes. */
int zmonitor_open(struct agent *a, struct zmonitor *z, void *sock,
		  const char *name, int events, event_callback_fn cb,
		  void *arg);
int zmonitor_next(struct zmonitor *z, uint16_t *event, uint32_t *value);
void zmonitor_close(struct zmonitor *z);

/* connect_watch.c: open watches the connects of sock (a DEALER, before
 * its zmq_connect) by cb on the loop, which calls read; joined: a ZeroMQ
 * peer took a connection; why: what the connects met when none did, true
 * when that is sure (packets dropped are not). close: before sock closes. */
int connect_watch_open(struct agent *a, struct connect_watch *w, void *sock,
		       const char *name, event_callback_fn cb, void *arg);
void connect_watch_read(struct connect_watch *w);
bool connect_watch_joined(const struct connect_watch *w);
bool connect_watch_why(const struct connect_watch *w, char *why, size_t len);
void connect_watch_close(struct connect_watch *w);

/* notify_watch.c: watches a collector's connections (t->sock, made): -1
 * when it cannot. notify_unwatch() before the socket closes. */
int notify_watch(struct agent *a, struct notify_target *t, unsigned i);
void notify_unwatch(struct notify_target *t);

#endif
