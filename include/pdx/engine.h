/* Engine client API: how an engine talks to the pdx-agent beside it.
 *
 * The link is ZeroMQ (DEALER to the agent's ROUTER at an ipc:// address)
 * carrying msgpack maps, described field by field in docs/protocol.md; this
 * library is one implementation of it, for C and C++ engines.
 *
 * Threading: a struct pdx_engine belongs to one thread at a time (an
 * engine calling from two threads locks around every call). A call made
 * while another thread is in one on the same engine fails at once with
 * PDX_EINVAL, doing nothing (the first is logged); but pdx_engine_free(),
 * which frees the engine as the call returns (see there). In a child
 * forked after pdx_engine_connect() every call on the parent's engine
 * fails with PDX_EINVAL but pdx_engine_free(): the child connects its own.
 * Calls that announce or abort transfers return at once; their outcome
 * arrives later as an event. When the agent is away (dead, restarting)
 * they fail at once with PDX_EPEER. After the agent restarted (the link
 * connected again), the next call registers again first, as the last
 * pdx_engine_register() did, without waiting for the answer: any later
 * call takes it, and announcements fail with PDX_EPEER until then (retry
 * them a little later).
 *
 * Liveness: the link notices its agent's death (its connection closes)
 * at once and a frozen agent (heartbeats unanswered) within liveness_ms;
 * every transfer in flight then fails at once with PDX_EAGENT, and
 * pdx_engine_link_status() says the agent is away, and why, until it is
 * back and registered again. The blocks of a PDX_EAGENT transfer must not
 * be reused at once: an agent that only froze goes on when it resumes,
 * and the peer agent may write into them until it notices ours is gone
 * (its --peer-timeout-ms).
 *
 * Events are read with pdx_engine_next_event();
 * pdx_engine_fd() becomes readable when events may be waiting. Like
 * ZeroMQ's own fd it is edge-triggered: after it fires, and after any call
 * of this API (which may read the socket and queue events), call
 * pdx_engine_next_event() until it returns PDX_EAGAIN before sleeping on
 * the fd again.
 *
 * Every announced transfer ends in exactly one event, the agent's or, when
 * the link is lost, one made here. Transfer ids must be unique: announcing
 * an id that is in flight returns PDX_EEXIST and sends nothing (the one in
 * flight goes on); one that ended is spent (its new announcement fails,
 * PDX_ECANCELED, "ended before this announcement of it"). Events not
 * taken yet wait, unbounded, and the link stays up meanwhile.
 */
#ifndef PDX_ENGINE_H
#define PDX_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include <pdx/layout.h>
#include <pdx/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PDX_XFER_ID_BYTES 16
#define PDX_ADDR_MAX 256
#define PDX_REASON_MAX 256
#define PDX_META_MAX 65536 /* pdx_engine_meta(): bytes beside the KV */
#define PDX_KV_DTYPE_MAX 32 /* pdx_engine_set_kv_dtype(): a name's bytes, NUL too */

/* 128 random bits, minted by whoever pairs the prefill and decode sides. */
struct pdx_xfer_id {
	uint8_t b[PDX_XFER_ID_BYTES];
};

enum pdx_mem_type {
	PDX_MEM_SHM = 0,  /* POSIX shared memory object, mapped by the agent */
	PDX_MEM_CUDA = 1, /* GPU memory, opened by the agent with CUDA IPC */
};

#define PDX_CUDA_IPC_BYTES 64 /* sizeof(cudaIpcMemHandle_t), cudaIpcEventHandle_t */

struct pdx_engine_region {
	enum pdx_mem_type type;
	const char *shm_name;  /* PDX_MEM_SHM: the shm_open() name */
	uint64_t size;         /* bytes */
	/* PDX_MEM_CUDA: the allocation's handle (cudaIpcGetMemHandle of the
	 * region's first byte, which must be the start of a cudaMalloc
	 * allocation) and the device it lives on */
	uint8_t cuda_ipc[PDX_CUDA_IPC_BYTES];
	int cuda_device;
};

/* A GPU engine's "layer computed" signals: interprocess CUDA events
 * (cudaEventCreateWithFlags(cudaEventInterprocess | cudaEventDisableTiming),
 * then cudaIpcGetEventHandle), slots x layers of them. A forward pass uses
 * one slot s; when layer l is computed the engine records event
 * handles[s * layers + l] on its compute stream and then says
 * pdx_engine_layer_done_slot(l, s). The agent waits on that event on its
 * own stream, so the engine never synchronises. The engine cycles the
 * slots, so a recording is not replaced while the agent may still be
 * about to wait on it: slots bounds how many forward passes may be
 * queued ahead of the agent (4 is plenty). Without events, "layer_done"
 * means the layer's bytes are already in memory. */
struct pdx_engine_cuda_events {
	const uint8_t (*handles)[PDX_CUDA_IPC_BYTES]; /* slots * layers */
	uint32_t slots;
};

/* The longest bound a transfer may ask for (an hour). */
#define PDX_XFER_TIMEOUT_MAX_MS 3600000u

struct pdx_engine_params {
	const char *agent;     /* the agent's engine address, ipc://... */
	int timeout_ms;        /* bound on synchronous calls; 0 = 10000 */
	/* per transfer, at most PDX_XFER_TIMEOUT_MAX_MS; 0 = the agent's
	 * default */
	uint32_t xfer_timeout_ms;
	int liveness_ms;       /* a hung agent is noticed within; 0 = 1000 */
};

enum pdx_event_kind {
	PDX_EVENT_SENT = 0,     /* prefill side: all bytes are at the receiver */
	PDX_EVENT_RECEIVED = 1, /* decode side: all bytes are in its blocks */
	PDX_EVENT_FAILED = 2,   /* either side: see status and reason */
};

struct pdx_engine_event {
	struct pdx_xfer_id xfer;
	enum pdx_event_kind kind;
	pdx_status_t status;   /* PDX_OK unless failed */
	uint64_t bytes;        /* payload bytes moved */
	uint64_t t_first_ns;   /* CLOCK_MONOTONIC: transfer announced */
	uint64_t t_last_ns;    /* CLOCK_MONOTONIC: event emitted */
	int64_t first_token;   /* received: the prefill's first token (see
				  pdx_engine_token()), or -1 */
	char reason[PDX_REASON_MAX];
};

struct pdx_engine;

/* Connects to the agent. Does not wait for it to be up. */
pdx_status_t pdx_engine_connect(const struct pdx_engine_params *params,
				struct pdx_engine **out);

/* Closes the link, which ends the registration: the agent fails the
 * transfers in flight, their events unheard, and lets go of the memory
 * (abort them and take their events first: a receive's blocks may be
 * written until then). NULL-safe. From another thread while a call on e is under way, it
 * returns at once; that call fails with PDX_EINVAL (a wait in it woken)
 * and frees e as it returns. A call made after it returned is a use of
 * freed memory. */
void pdx_engine_free(struct pdx_engine *e);

/* Registers the engine's KV memory and layout with the agent and waits for
 * its answer. On success writes the agent's peer address (the one to give
 * the other side of a transfer) to peer_addr (NULL: not wanted; give
 * PDX_ADDR_MAX bytes): PDX_ETOOBIG when it does not fit, though the agent
 * holds the registration all the same (pdx_engine_peer_addr() gives the
 * address). Registering again replaces the previous registration and
 * fails the transfers that used it. */
pdx_status_t pdx_engine_register(struct pdx_engine *e,
				 const struct pdx_kv_layout *layout,
				 const struct pdx_engine_region *regions,
				 size_t n_regions, char *peer_addr,
				 size_t peer_addr_len);

/* Tensor parallelism: this engine is rank `rank` of a TP instance of
 * `size` ranks (a power of two; rank r holds KV heads [r * H / size,
 * (r + 1) * H / size) of H, kv_heads = H / size in its layout; MLA's
 * latent is on every rank). Takes effect at the next register (and is
 * kept for the registers sent again); without it, 0 of 1. The agents then
 * reshard between prefill and decode instances of other TP sizes
 * (docs/protocol.md, "TP legs"). */
pdx_status_t pdx_engine_set_tp(struct pdx_engine *e, uint32_t rank,
			       uint32_t size);

/* The KV's element type by name, PyTorch's: "bfloat16", "float16",
 * "float8_e4m3fn", "float8_e5m2" (compared byte for byte; at most PDX_KV_DTYPE_MAX - 1 bytes of letters, digits,
 * '_', '.', '-'; "" or NULL: none). The layout knows only dtype_bytes, so
 * a bfloat16 engine and a float16 one paired and each read the other's KV
 * as its own; agents whose engines both name one refuse to pair when the
 * names differ (docs/protocol.md, "hello"). Takes effect at the next
 * register, and is kept for the registers sent again. Added in 0.6. */
pdx_status_t pdx_engine_set_kv_dtype(struct pdx_engine *e, const char *name);

/* The same, for a GPU engine with "layer computed" events (NULL: none). */
pdx_status_t pdx_engine_register_cuda(struct pdx_engine *e,
				      const struct pdx_kv_layout *layout,
				      const struct pdx_engine_region *regions,
				      size_t n_regions,
				      const struct pdx_engine_cuda_events *events,
				      char *peer_addr, size_t peer_addr_len);

/* Prefill side: transfer xfer will be produced in these blocks (in token
 * order) and may be pushed only to the agent at peer. peer NULL leaves the
 * receiver open: the first agent to ask for xfer gets it (its id is then
 * the only credential; docs/security.md). */
pdx_status_t pdx_engine_send(struct pdx_engine *e, const struct pdx_xfer_id *xfer,
			     const char *peer, const uint32_t *blocks,
			     size_t n_blocks);

/* Prefill side: layer is computed for these transfers. */
pdx_status_t pdx_engine_layer_done(struct pdx_engine *e, uint32_t layer,
				   const struct pdx_xfer_id *xfers, size_t n);

/* The same, for an engine registered with CUDA events: the event of slot
 * `slot` for this layer has been recorded. */
pdx_status_t pdx_engine_layer_done_slot(struct pdx_engine *e, uint32_t layer,
					uint32_t slot,
					const struct pdx_xfer_id *xfers,
					size_t n);

/* A GPU engine's CUDA side. These calls use the CUDA driver
 * (libcuda.so.1), loaded at their first use: libpdx itself links no CUDA
 * and the rest of it works the same where there is none. Where the driver
 * is missing or finds no device they fail with PDX_EIO and say so. They
 * serve engines on the CUDA runtime's (the device's primary) context, as
 * PyTorch and vLLM are. */

/* The region holding the device memory [ptr, ptr + size), e.g. one layer's
 * KV tensor, and where that memory starts in it: fills *out (PDX_MEM_CUDA;
 * the handle of the whole allocation ptr lies in, its size and device)
 * and *offset (ptr minus the allocation's base). A layout then names the
 * tensor as (that region's index, *offset + its own offsets).
 *
 * Tensors carved from one allocation (PyTorch's caching allocator does
 * that) give the same region: the same base, ptr - *offset, and the same
 * handle bytes. Register each allocation once: key the regions by base.
 *
 * Shared with the agent by legacy CUDA IPC (cuIpcGetMemHandle), which
 * only cudaMalloc-style memory allows. Refused, saying which, with
 * PDX_EINVAL: memory CUDA does not know (plain host memory), pinned host
 * memory, managed memory, memory mapped with the virtual memory
 * management API (cuMemCreate: vLLM's sleep mode, PyTorch's
 * expandable_segments), memory from a stream-ordered pool
 * (cudaMallocAsync). PDX_ERANGE when [ptr, ptr + size) runs past its
 * allocation. why (why_len bytes, may be NULL) gets the reason. */
pdx_status_t pdx_engine_cuda_region(const void *ptr, uint64_t size,
				    struct pdx_engine_region *out,
				    uint64_t *offset, char *why,
				    size_t why_len);

/* pdx_engine_register_cuda() with "layer computed" events that libpdx
 * makes itself: slots x layers interprocess events (1 <= slots <= 64; see
 * struct pdx_engine_cuda_events), in the primary context of the device of
 * the first PDX_MEM_CUDA region (there must be one). They live until the
 * engine is freed or registers again; then pdx_engine_layer_done_stream()
 * says "layer done". */
pdx_status_t pdx_engine_register_cuda_streams(
    struct pdx_engine *e, const struct pdx_kv_layout *layout,
    const struct pdx_engine_region *regions, size_t n_regions, uint32_t slots,
    char *peer_addr, size_t peer_addr_len);

/* Prefill side, registered by pdx_engine_register_cuda_streams(): layer
 * is computed, for these transfers, by the work queued so far on stream
 * (a cudaStream_t / CUstream of that context; NULL: the legacy default
 * stream). Records the layer's event on it (cuEventRecord: nothing waits)
 * and says layer_done with its slot; the agent waits on the event on its
 * own stream. Call it once per layer per forward pass with all that
 * pass's transfers, layers ascending: a layer not above the last one
 * recorded starts a new forward pass, which takes the next slot. */
pdx_status_t pdx_engine_layer_done_stream(struct pdx_engine *e, uint32_t layer,
					  void *stream,
					  const struct pdx_xfer_id *xfers,
					  size_t n);

/* Prefill side, optional: the first token sampled for xfer, carried to
 * the receiver in its "received" event so the decode side starts from it
 * at once. Call before the last layer_done. */
pdx_status_t pdx_engine_token(struct pdx_engine *e,
			      const struct pdx_xfer_id *xfer, uint32_t token);

/* Prefill side, optional: up to PDX_META_MAX bytes the engine sends beside
 * the KV (an engine's per-request metadata: SGLang's auxiliary rows), handed
 * to the receiver with its "received" event (pdx_engine_event_meta()).
 * Call before the last layer_done; a second call replaces the first. */
pdx_status_t pdx_engine_meta(struct pdx_engine *e,
			     const struct pdx_xfer_id *xfer, const void *data,
			     size_t len);

/* Decode side: the bytes the sender attached (pdx_engine_meta()) to the
 * transfer of the last event pdx_engine_next_event() or
 * pdx_engine_wait_event() returned; *len 0 (and *data NULL) when it carried
 * none. Valid until the next of those calls. */
pdx_status_t pdx_engine_event_meta(struct pdx_engine *e, const void **data,
				   size_t *len);

/* Decode side: receive xfer from the agent at peer into these blocks (in
 * token order, as many as the sender's). The first skip_tokens tokens are
 * already held: whole blocks among them are not transferred. */
pdx_status_t pdx_engine_recv(struct pdx_engine *e, const struct pdx_xfer_id *xfer,
			     const char *peer, const uint32_t *blocks,
			     size_t n_blocks, uint32_t skip_tokens);

/* How a transfer's bytes move (docs/protocol.md, "Pull"). */
enum pdx_xfer_mode {
	PDX_XFER_DEFAULT = 0, /* the decode agent's choice: push, or pull
			       * when it runs with --pull */
	PDX_XFER_PUSH = 1,    /* the sender writes each layer into our
			       * blocks as soon as its engine computed it */
	PDX_XFER_PULL = 2,    /* our agent reads the sender's blocks once
			       * its engine computed every layer: for a
			       * prefill engine that cannot say when one
			       * layer is computed (host memory; the ipc and
			       * put lanes) */
};

struct pdx_recv_opts {
	uint32_t skip_tokens;    /* as pdx_engine_recv()'s */
	enum pdx_xfer_mode mode;
	/* TP: every prefill rank's agent, rank order (n_peers of them; the
	 * peer argument may then be NULL). Our agent takes from those that
	 * hold our heads. n_peers 0: the peer argument. */
	const char *const *peers;
	uint32_t n_peers;
};

/* pdx_engine_recv() with options; opts NULL: skip_tokens 0, the agent's
 * mode. */
pdx_status_t pdx_engine_recv_opts(struct pdx_engine *e,
				  const struct pdx_xfer_id *xfer,
				  const char *peer, const uint32_t *blocks,
				  size_t n_blocks,
				  const struct pdx_recv_opts *opts);

/* Decode side, optional: a request whose KV comes from the agent at peer
 * waits in our queue (no blocks yet). Until pdx_engine_recv() or an abort,
 * the agent renews the sender's lease on that KV with its heartbeats, for
 * at most the agent's --xfer-timeout-ms. Without it, the sender keeps the
 * KV --lease-ms after announcing it. A held transfer that fails before its
 * pdx_engine_recv() (the sender's agent lost, that bound passed, the link
 * to our agent lost, or the hold refused: a peer no agent listens at,
 * such as port 0 or a wildcard host) ends in a failed event, so the
 * queued request can end now; after pdx_engine_recv() its one event is
 * the receive's, and after pdx_engine_abort() or pdx_engine_abort_at()
 * there is none. */
pdx_status_t pdx_engine_hold(struct pdx_engine *e,
			     const struct pdx_xfer_id *xfer, const char *peer);

/* Either side: abort the transfer here and at the peer. */
pdx_status_t pdx_engine_abort(struct pdx_engine *e,
			      const struct pdx_xfer_id *xfer);

/* Either side, for a transfer never announced here (no pdx_engine_send or
 * pdx_engine_recv; e.g. a decode request that left while queued): the
 * agent tells the agent at peer to abort it, so the peer's engine frees
 * its blocks now rather than at its timeout. peer "" is PDX_EINVAL. */
pdx_status_t pdx_engine_abort_at(struct pdx_engine *e,
				 const struct pdx_xfer_id *xfer,
				 const char *peer);

/* Readable (edge-triggered) when events may be waiting, or the link's
 * state may have changed. */
int pdx_engine_fd(const struct pdx_engine *e);

/* PDX_OK when the agent is there and holds our registration (or nothing
 * was registered yet), reason "" then; PDX_EPEER while it is away or not
 * registered again yet, with why (and since when) in reason. The state as of the
 * last call that read the link (pdx_engine_next_event() and every
 * announcement do); never waits. */
pdx_status_t pdx_engine_link_status(const struct pdx_engine *e, char *reason,
				    size_t reason_len);

/* The agent's peer address, as its last answer to a register said (""
 * before one): the one to give the other side of a transfer. An agent
 * restarted at another address (--advertise changed, --listen port 0)
 * answers the library's register again with its new one, which this
 * then gives (since 0.5). */
const char *pdx_engine_peer_addr(const struct pdx_engine *e);

/* Why the last call on e that failed (returned a negative status)
 * failed, in words; "" when it said nothing more than its status. Valid
 * until the next call on e. Every call taking an engine sets it when it
 * fails, except pdx_engine_link_status(), which has its own reason. */
const char *pdx_engine_last_error(const struct pdx_engine *e);

/* Takes the next event; PDX_EAGAIN when there is none now. */
pdx_status_t pdx_engine_next_event(struct pdx_engine *e,
				   struct pdx_engine_event *ev);

/* Waits up to timeout_ms (-1: forever) for the next event; PDX_ETIMEDOUT
 * when none came in time. A signal does not end the wait (its handler
 * runs, the wait goes on): to stop on one, wait in slices or on
 * pdx_engine_fd() beside a signalfd or self-pipe. */
pdx_status_t pdx_engine_wait_event(struct pdx_engine *e, int timeout_ms,
				   struct pdx_engine_event *ev);

/* The library's own messages (warnings, errors; with "debug", what it
 * drops) go to stderr, prefixed "libpdx". Their level is "info" or, when
 * the library is loaded, the environment's PDX_LOG_LEVEL; this sets it:
 * "error", "warn", "info" or "debug" (PDX_EINVAL for another name). For
 * the whole process: call it before the links are in use. */
pdx_status_t pdx_engine_set_log_level(const char *name);

/* Fills id with 128 bits from the system's random source (NULL:
 * PDX_EINVAL). */
pdx_status_t pdx_xfer_id_random(struct pdx_xfer_id *id);

/* Writes the 32 lowercase hex digits and a NUL to out[33] (id NULL: ""). */
void pdx_xfer_id_hex(const struct pdx_xfer_id *id, char out[33]);

#ifdef __cplusplus
}
#endif
#endif
