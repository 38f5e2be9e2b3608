/* UCX, reduced to what an agent needs: one context and worker, endpoints
 * with peer-error handling, a few large registered regions, and four
 * non-blocking operations (put, get, active-message send, flush).
 *
 * Threading: everything runs on the thread that owns the worker.
 * Callbacks: an operation that returns PDX_OK always completes later,
 * through its callback, from inside pdx_ucx_progress() (never inside the
 * call that started it); one that returns an error never calls back.
 * This layer logs nothing; it returns status codes.
 */
#ifndef PDX_TRANSPORT_UCX_H
#define PDX_TRANSPORT_UCX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/status.h>

struct pdx_ucx;
struct pdx_ucx_mem;
struct pdx_ucx_ep;
struct pdx_ucx_rkey;

typedef void (*pdx_ucx_done_cb)(void *arg, pdx_status_t status);
typedef void (*pdx_ucx_ep_error_cb)(void *arg, pdx_status_t status);

/* An active message arrived. If rndv is true, data is a descriptor that
 * must be passed to pdx_ucx_am_recv() (or pdx_ucx_am_drop()) before the
 * handler returns; otherwise data points to len bytes valid only during
 * the call. */
typedef void (*pdx_ucx_am_cb)(void *arg, const void *hdr, size_t hdr_len,
			      void *data, size_t len, bool rndv);

pdx_status_t pdx_ucx_new(struct pdx_ucx **out);

/* Whether UCX_TLS lets in a transport of names (NULL-terminated, each
 * matched as a whole entry): a list that names one, or an exclusion list
 * (^...) that names none; unset lets in every transport. (A setting of a
 * transport not in use makes UCX warn "invalid configuration".) */
bool pdx_ucx_tls_lets_in(const char *const *names);
/* Lets endpoints' closes finish, then destroys the worker: every operation
 * has called back when this returns, or never will (a request the worker
 * never completed: what its callback would have freed is the caller's to
 * free). Memory used by operations may be unregistered and freed after
 * this; only pdx_ucx_mem_free(), pdx_ucx_am_drop() (a no-op now) and
 * pdx_ucx_free() may follow. A worker still holding sends queued for want
 * of room after up to a second of progress (peers that no longer read
 * them) is not destroyed but left to the process's exit, unprogressed
 * (UCX 1.13 crashed purging some of them): false then. For a process about
 * to exit. */
bool pdx_ucx_stop(struct pdx_ucx *u);
/* pdx_ucx_stop() if not done, then the context (kept, reachable, with a
 * worker left to the exit). */
void pdx_ucx_free(struct pdx_ucx *u);

/* The worker's event fd: readable when progress may have work. */
int pdx_ucx_fd(const struct pdx_ucx *u);

/* What is left once pdx_ucx_progress() returns. */
enum pdx_ucx_more {
	PDX_UCX_ARMED, /* nothing: the event fd wakes the caller */
	PDX_UCX_MORE,  /* completions still coming: call again after
			* the caller's other work, at once */
	PDX_UCX_POLL,  /* the fd could not be armed: UCX has work it only
			* polls for (a send waiting for a stalled peer):
			* call again soon, the fd may stay quiet */
};

/* Drives the worker until it has been idle for spin_ns (0: at once) and
 * re-arms the event fd, or until it has run budget_ns (0: no bound) with
 * completions still coming, which a long transfer's stream of them would
 * otherwise make seconds. Spinning a little while operations are in
 * flight saves a sleep and wake-up per chunk on streaming lanes such as
 * TCP. */
enum pdx_ucx_more pdx_ucx_progress(struct pdx_ucx *u, uint64_t spin_ns,
				   uint64_t budget_ns);

/* The worker address to give peers; valid until pdx_ucx_free(). */
void pdx_ucx_address(const struct pdx_ucx *u, const void **addr, size_t *len);

/* Sets the handler of active-message id (below 8: PDX_EINVAL else). */
pdx_status_t pdx_ucx_am_handler(struct pdx_ucx *u, unsigned id,
				pdx_ucx_am_cb cb, void *arg);
/* Receives rendezvous data straight into dst (len bytes); cb fires when it
 * is there. */
pdx_status_t pdx_ucx_am_recv(struct pdx_ucx *u, void *desc, void *dst,
			     size_t len, pdx_ucx_done_cb cb, void *arg);
void pdx_ucx_am_drop(struct pdx_ucx *u, void *desc);

/* Registers [addr, addr + len): once per region, never per block. */
pdx_status_t pdx_ucx_mem_register(struct pdx_ucx *u, void *addr, size_t len,
				  struct pdx_ucx_mem **out);
/* The same for memory of a given kind: cuda means GPU memory, which only a
 * UCX built with CUDA support can register (pdx_ucx_has_cuda). */
pdx_status_t pdx_ucx_mem_register_type(struct pdx_ucx *u, void *addr,
				       size_t len, bool cuda,
				       struct pdx_ucx_mem **out);
/* This UCX moves GPU memory itself (ucp_context_query's memory types
 * include CUDA): the agents may put from GPU to GPU memory. */
bool pdx_ucx_has_cuda(struct pdx_ucx *u);
void pdx_ucx_mem_free(struct pdx_ucx *u, struct pdx_ucx_mem *m);
/* Packed rkey for peers; free *buf with pdx_ucx_rkey_buf_free(). */
pdx_status_t pdx_ucx_mem_rkey(struct pdx_ucx *u, struct pdx_ucx_mem *m,
			      void **buf, size_t *len);
void pdx_ucx_rkey_buf_free(void *buf);

/* Connects to a peer worker address. With peer_errors, err_cb fires at
 * most once, when the peer is found dead; the endpoint is then unusable but
 * must still be closed with pdx_ucx_ep_close(). UCX 1.13's shared-memory
 * transports cannot report peer failures, so a same-host endpoint is made
 * without (peer_errors false) or it could not use shared memory at all.
 * PDX_EINVAL: addr (len bytes) is too short or of an unknown version. */
pdx_status_t pdx_ucx_ep_new(struct pdx_ucx *u, const void *addr, size_t len,
			    bool peer_errors, pdx_ucx_ep_error_cb err_cb,
			    void *arg,
			    struct pdx_ucx_ep **out);
/* UCX 1.13 numbers the endpoints a worker makes to another (1st, 2nd,
 * ...) and pairs each with the peer's of the same number. The number of
 * the endpoint with peer_errors that pdx_ucx_ep_new() to addr would give
 * now: the one in use, or the next made. A peer whose number is higher
 * cut its endpoint and made another since: ours is paired with the one
 * it closed. */
uint32_t pdx_ucx_ep_sn(struct pdx_ucx *u, const void *addr, size_t len);

/* The next pdx_ucx_ep_new() to addr with peer_errors gives the endpoint
 * numbered sn, which pairs with the peer's of that number: the one in
 * use, numbered lower, is cut (pdx_ucx_ep_cut()), and those numbered in
 * between are made and closed at once. Nothing happens when sn is not
 * higher. PDX_EINVAL: a bad address, or sn more than PDX_UCX_SKIP_MAX
 * ahead (no peer gets there by cutting endpoints). */
#define PDX_UCX_SKIP_MAX 64
pdx_status_t pdx_ucx_ep_skip_to(struct pdx_ucx *u, const void *addr,
				size_t len, uint32_t sn);

/* Lets go of ep. Made with peer_errors, its UCX endpoint is the one every
 * pdx_ucx_ep_new() to the same worker address gives until it fails or is
 * cut (UCX 1.13 pairs the endpoints of two workers by how many each side
 * made to the other: made anew at each handshake, one made on one side
 * only shifted every later pairing onto stale ones): it stays open, and
 * operations on it go on, for the next; once it failed it is force-closed
 * with its last pdx_ucx_ep. An endpoint made without peer_errors cannot
 * be closed in UCX 1.13: it stays open, and pdx_ucx_ep_new() to the same
 * worker address gives it again, until pdx_ucx_stop(). NULL-safe. */
void pdx_ucx_ep_close(struct pdx_ucx_ep *ep);

/* pdx_ucx_ep_close(), and the UCX endpoint is given to no new
 * pdx_ucx_ep: it is force-closed with its last one (operations
 * outstanding on it complete with an error). For a peer found lost or
 * forgotten, whose data must not land any more. NULL-safe. */
void pdx_ucx_ep_cut(struct pdx_ucx_ep *ep);

/* Its error callback fires no more (it stays usable until closed). */
void pdx_ucx_ep_mute(struct pdx_ucx_ep *ep);

/* Whether it was made with peer_errors: an operation on it ends (in
 * error) once the peer is found dead. */
bool pdx_ucx_ep_reports_errors(const struct pdx_ucx_ep *ep);

/* Whether a and b are on one UCX endpoint (both made to one worker
 * address, and the first neither failed nor cut since). */
bool pdx_ucx_ep_same(const struct pdx_ucx_ep *a, const struct pdx_ucx_ep *b);

pdx_status_t pdx_ucx_rkey_unpack(struct pdx_ucx_ep *ep, const void *buf,
				 size_t len, struct pdx_ucx_rkey **out);
void pdx_ucx_rkey_free(struct pdx_ucx_rkey *rk);

/* Writes len bytes at src (inside registered region src_mem) to remote_addr
 * in the peer's region described by rkey. */
pdx_status_t pdx_ucx_put(struct pdx_ucx_ep *ep, const void *src, size_t len,
			 struct pdx_ucx_mem *src_mem, uint64_t remote_addr,
			 struct pdx_ucx_rkey *rkey, pdx_ucx_done_cb cb,
			 void *arg);

/* Reads len bytes at remote_addr in the peer's region described by rkey
 * into dst (inside registered region dst_mem): a pull; complete (the bytes
 * are here) when cb fires. */
pdx_status_t pdx_ucx_get(struct pdx_ucx_ep *ep, void *dst, size_t len,
			 struct pdx_ucx_mem *dst_mem, uint64_t remote_addr,
			 struct pdx_ucx_rkey *rkey, pdx_ucx_done_cb cb,
			 void *arg);

#define PDX_UCX_AM_HDR_MAX 64

/* Sends an active message (header copied, at most PDX_UCX_AM_HDR_MAX
 * bytes; payload used until cb). */
pdx_status_t pdx_ucx_am_send(struct pdx_ucx_ep *ep, unsigned id,
			     const void *hdr, size_t hdr_len, const void *src,
			     size_t len, struct pdx_ucx_mem *src_mem,
			     pdx_ucx_done_cb cb, void *arg);
/* The same eagerly, whatever its size: the receiver's handler gets the
 * whole payload (never rndv), for a small message that must arrive in
 * one piece. The payload is copied: src is the caller's again on return
 * (and nothing is left to free if UCX never calls back). */
pdx_status_t pdx_ucx_am_send_eager(struct pdx_ucx_ep *ep, unsigned id,
				   const void *hdr, size_t hdr_len,
				   const void *src, size_t len,
				   pdx_ucx_done_cb cb, void *arg);
/* The same by rendezvous, whatever its size: the receiver's handler sees
 * rndv and fetches the payload when it has room for it, so a receiver with
 * a bounded buffer pool holds back the sender instead of queueing copies;
 * cb fires once the payload is at the receiver. */
pdx_status_t pdx_ucx_am_send_rndv(struct pdx_ucx_ep *ep, unsigned id,
				  const void *hdr, size_t hdr_len,
				  const void *src, size_t len,
				  struct pdx_ucx_mem *src_mem,
				  pdx_ucx_done_cb cb, void *arg);

/* Completes when every operation started on ep is complete at the peer. */
pdx_status_t pdx_ucx_flush(struct pdx_ucx_ep *ep, pdx_ucx_done_cb cb,
			   void *arg);

#endif
