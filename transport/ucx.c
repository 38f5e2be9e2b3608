/* UCX context, worker, memory and the requests the operations wait on
 * (see ucx.h): the bottom of transport/. Endpoints are ucx_ep.c's, the
 * operations on them ucx_io.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utlist.h>

#include "common/clock.h"
#include "transport/ucx_internal.h"

bool pdx_ucx_tls_lets_in(const char *const *names)
{
	const char *tls = getenv("UCX_TLS");

	if (!tls || !*tls)
		return true;
	for (; *names; names++) {
		size_t n = strlen(*names);

		for (const char *s = strstr(tls, *names); s;
		     s = strstr(s + 1, *names)) {
			bool start = s == tls || s[-1] == ',' || s[-1] == '^';
			bool end = s[n] == '\0' || s[n] == ',';

			if (start && end)
				return tls[0] != '^';
		}
	}
	return tls[0] == '^';
}

/* UCX 1.13 has no RMA lane for memory an agent registers on one host:
 * a put over shared memory is emulated, an active message into the
 * receiver's FIFO (64 slots by default) and one acknowledging message back
 * into the sender's. The receiver's agent must run to empty its FIFO, so
 * a busy host (more runnable processes than cores) moves at most a FIFO's
 * worth a time slice: a TP leg's 1 GiB of 1 KiB token rows (a million
 * puts) took 15 to 60 s at load 7 to 13 on 2 cores, past the 30 s
 * --xfer-timeout-ms, where it takes 1.1 s idle. A longer FIFO cuts the
 * hand-offs (each slot has an 8 KiB receive buffer: 8 MiB of /dev/shm per
 * shared-memory transport at 1024). Unless the user chose. */
#define SM_FIFO_SIZE "1024"

pdx_status_t pdx_ucx_new(struct pdx_ucx **out)
{
	ucp_params_t cp = {
		.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
		.features = UCP_FEATURE_RMA | UCP_FEATURE_AM |
			    UCP_FEATURE_WAKEUP,
		.name = "pdx-agent",
	};
	ucp_worker_params_t wp = {
		.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
		.thread_mode = UCS_THREAD_MODE_SINGLE,
	};
	ucp_config_t *cfg = NULL;
	struct pdx_ucx *u;
	ucs_status_t s;

	u = calloc(1, sizeof(*u));
	if (!u)
		return PDX_ENOMEM;
	s = ucp_config_read(NULL, NULL, &cfg);
	if (s != UCS_OK)
		goto free_u;
	/* UCX's TCP transport connects with a blocking connect() by default
	 * (UCX_TCP_CONN_NB=n), inside ucp_ep_create(): a peer whose UCX port
	 * a firewall drops held the agent's whole loop for the kernel's SYN
	 * retries (about 130 s). Unless the user chose, it does not block.
	 * (The key is the transport's own name for it: "TCP_CONN_NB" is
	 * refused as unknown.) */
	if (!getenv("UCX_TCP_CONN_NB") &&
	    pdx_ucx_tls_lets_in((const char *const[]){"tcp", "all", NULL}) &&
	    ucp_config_modify(cfg, "CONN_NB", "y") != UCS_OK)
		fprintf(stderr, "ucx: cannot set UCX_TCP_CONN_NB=y\n");
	if (!getenv("UCX_MM_FIFO_SIZE") && !getenv("UCX_SYSV_FIFO_SIZE") &&
	    !getenv("UCX_POSIX_FIFO_SIZE") &&
	    pdx_ucx_tls_lets_in((const char *const[]){"sm", "shm", "mm", "posix",
						     "sysv", "all", NULL}) &&
	    ucp_config_modify(cfg, "MM_FIFO_SIZE", SM_FIFO_SIZE) != UCS_OK)
		fprintf(stderr, "ucx: cannot set UCX_MM_FIFO_SIZE=%s\n",
			SM_FIFO_SIZE);
	s = ucp_init(&cp, cfg, &u->ctx);
	ucp_config_release(cfg);
	if (s != UCS_OK)
		goto free_u;
	s = ucp_worker_create(u->ctx, &wp, &u->worker);
	if (s != UCS_OK)
		goto cleanup_ctx;
	s = ucp_worker_get_address(u->worker, &u->addr, &u->addr_len);
	if (s != UCS_OK)
		goto destroy_worker;
	s = ucp_worker_get_efd(u->worker, &u->efd);
	if (s != UCS_OK)
		goto release_addr;
	*out = u;
	return PDX_OK;

release_addr:
	ucp_worker_release_address(u->worker, u->addr);
destroy_worker:
	ucp_worker_destroy(u->worker);
cleanup_ctx:
	ucp_cleanup(u->ctx);
free_u:
	free(u);
	return from_ucs(s);
}

static void op_free(struct op *o)
{
	free(o->payload);
	free(o);
}

static void fire_deferred(struct pdx_ucx *u)
{
	while (u->deferred) {
		struct op *o = u->deferred;

		u->deferred = o->next;
		o->cb(o->arg, PDX_OK);
		op_free(o);
	}
}

/* Whether the worker holds no send it has queued for want of room (UCX's
 * arm refuses while one waits: see BUSY_ROUNDS), progressing it while
 * its peers take them: at most STOP_DRAIN_NS, and no longer than
 * STOP_IDLE_NS without progress (a peer that stopped reading, or left).
 * Once armed, what peers send us is no longer read, so nothing new
 * queues up behind it. */
#define STOP_DRAIN_NS 1000000000ULL
#define STOP_IDLE_NS 100000000ULL

static bool worker_drain(struct pdx_ucx *u)
{
	uint64_t start = pdx_now_ns(), last = start, t = start;

	/* a peer that keeps sending keeps it busy: the bound holds anyway */
	while (t - start < STOP_DRAIN_NS && t - last < STOP_IDLE_NS) {
		if (ucp_worker_progress(u->worker) || u->deferred) {
			fire_deferred(u);
			last = t = pdx_now_ns();
			continue;
		}
		if (ucp_worker_arm(u->worker) != UCS_ERR_BUSY)
			return true;
		/* on a busy host the peer needs the CPU to read */
		nanosleep(&(struct timespec){ 0, 100000 }, NULL);
		t = pdx_now_ns();
	}
	return false;
}

/* Workers left to the exit (pdx_ucx_stop()): reachable, so that leak
 * checkers do not count what UCX holds as lost. */
static struct pdx_ucx *abandoned;

bool pdx_ucx_stop(struct pdx_ucx *u)
{
	if (!u || !u->worker)
		return true;
	fire_deferred(u); /* endpoint closes deferred from UCX's callbacks too */
	/* Let endpoint closes finish so their requests are not leaked. */
	for (int i = 0; i < 100000 && u->closing > 0; i++)
		ucp_worker_progress(u->worker);
	/* UCX 1.13 crashed destroying a worker that still queued an emulated
	 * put's acknowledgement (a put over shared memory is an active
	 * message, answered by one) for a peer whose FIFO was full: purging
	 * it, ucp_worker_destroy() unregisters memory by a datatype the
	 * acknowledgement never set (SIGSEGV in ucp_mem_rereg_mds, under
	 * ucp_ep_purge_lanes). What the worker cannot send now is left to
	 * the process's exit, unpurged: no callback comes for it (as for a
	 * request UCX never completes, below). */
	if (!worker_drain(u)) {
		u->abandoned = true;
	} else {
		ucp_worker_release_address(u->worker, u->addr);
		ucp_worker_destroy(u->worker); /* and the kept endpoints */
	}
	u->worker = NULL;
	if (u->eps_free)
		u->eps_free(u->eps);
	u->eps = NULL;
	u->eps_free = NULL;
	/* Requests the worker never completed (UCX 1.13 leaves a rendezvous
	 * send to a force-closed shared-memory endpoint pending), and calls
	 * the worker's going queued: their callbacks will not fire now, so
	 * what they held is the caller's to free (ucx.h). */
	while (u->pending) {
		struct op *o = u->pending;

		DL_DELETE2(u->pending, o, pending_prev, pending_next);
		op_free(o);
	}
	while (u->deferred) {
		struct op *o = u->deferred;

		u->deferred = o->next;
		op_free(o);
	}
	return !u->abandoned;
}

void pdx_ucx_free(struct pdx_ucx *u)
{
	if (!u)
		return;
	pdx_ucx_stop(u);
	if (u->abandoned) { /* the worker still uses the context */
		u->next_abandoned = abandoned;
		abandoned = u;
		return;
	}
	ucp_cleanup(u->ctx);
	free(u);
}

int pdx_ucx_fd(const struct pdx_ucx *u)
{
	return u->efd;
}

/* Arming fails (busy) while UCX has work it cannot be woken for, such as
 * a send waiting for room in a frozen receiver's shared-memory FIFO (UCX
 * 1.13): it polls for that room. After BUSY_ROUNDS such failures without
 * progress the caller gets control back, to poll again a little later
 * rather than spin here deaf to everything else. */
#define BUSY_ROUNDS 4

enum pdx_ucx_more pdx_ucx_progress(struct pdx_ucx *u, uint64_t spin_ns,
				   uint64_t budget_ns)
{
	uint64_t start = budget_ns ? pdx_now_ns() : 0;
	uint64_t idle_since = spin_ns ? pdx_now_ns() : 0;
	unsigned busy = 0;

	for (;;) {
		if (ucp_worker_progress(u->worker) || u->deferred) {
			fire_deferred(u);
			if (spin_ns || budget_ns) {
				idle_since = pdx_now_ns();
				if (budget_ns && idle_since - start >= budget_ns)
					return PDX_UCX_MORE;
			}
			busy = 0;
			continue;
		}
		if (spin_ns && pdx_now_ns() - idle_since < spin_ns)
			continue;
		if (ucp_worker_arm(u->worker) != UCS_ERR_BUSY)
			return PDX_UCX_ARMED;
		if (++busy == BUSY_ROUNDS)
			return PDX_UCX_POLL;
	}
}

void pdx_ucx_address(const struct pdx_ucx *u, const void **addr, size_t *len)
{
	*addr = u->addr;
	*len = u->addr_len;
}

struct op *ucx_op_new(struct pdx_ucx *u, pdx_ucx_done_cb cb, void *arg)
{
	struct op *o = calloc(1, sizeof(*o));

	if (o) {
		o->cb = cb;
		o->arg = arg;
		o->u = u;
		DL_PREPEND2(u->pending, o, pending_prev, pending_next);
	}
	return o;
}

/* Off the pending list: ended, or never started. */
static void op_unlink(struct op *o)
{
	DL_DELETE2(o->u->pending, o, pending_prev, pending_next);
}

void ucx_op_drop(struct op *o)
{
	op_unlink(o);
	op_free(o);
}

/* Done at once: on the deferred list, for the next progress. */
static void op_defer(struct op *o)
{
	op_unlink(o);
	o->next = o->u->deferred;
	o->u->deferred = o;
}

pdx_status_t ucx_op_started(struct op *o, ucs_status_ptr_t req)
{
	if (UCS_PTR_IS_ERR(req)) {
		ucx_op_drop(o);
		return from_ucs(UCS_PTR_STATUS(req));
	}
	if (req == NULL)
		op_defer(o);
	return PDX_OK;
}

pdx_status_t ucx_call_soon(struct pdx_ucx *u, pdx_ucx_done_cb cb, void *arg)
{
	struct op *o = ucx_op_new(u, cb, arg);

	if (!o)
		return PDX_ENOMEM;
	op_defer(o);
	return PDX_OK;
}

static void op_done(void *request, ucs_status_t status, void *user_data)
{
	struct op *o = user_data;

	op_unlink(o);
	o->cb(o->arg, from_ucs(status));
	op_free(o);
	ucp_request_free(request);
}

static void op_recv_done(void *request, ucs_status_t status, size_t length,
			 void *user_data)
{
	op_done(request, status, user_data);
}

ucp_request_param_t ucx_op_param(struct op *o, struct pdx_ucx_mem *mem)
{
	ucp_request_param_t p = {
		/* no UCP_OP_ATTR_FLAG_NO_IMM_CMPL: with it UCX calls back
		 * inside the call for an operation done at once, before the
		 * caller counted it; without, it returns NULL (ucx_op_started) */
		.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
				UCP_OP_ATTR_FIELD_USER_DATA,
		.cb.send = op_done,
		.user_data = o,
	};

	if (mem) {
		p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
		p.memh = mem->memh;
	}
	return p;
}

static ucs_status_t am_trampoline(void *arg, const void *hdr, size_t hdr_len,
				  void *data, size_t len,
				  const ucp_am_recv_param_t *param)
{
	struct am_handler *h = arg;
	bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;

	h->cb(h->arg, hdr, hdr_len, data, len, rndv);
	return rndv ? UCS_INPROGRESS : UCS_OK;
}

pdx_status_t pdx_ucx_am_handler(struct pdx_ucx *u, unsigned id,
				pdx_ucx_am_cb cb, void *arg)
{
	ucp_am_handler_param_t p = {
		.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
			      UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
			      UCP_AM_HANDLER_PARAM_FIELD_CB |
			      UCP_AM_HANDLER_PARAM_FIELD_ARG,
		.id = id,
		.flags = UCP_AM_FLAG_WHOLE_MSG,
		.cb = am_trampoline,
	};

	if (id >= AM_IDS)
		return PDX_EINVAL;
	u->am[id] = (struct am_handler){ .cb = cb, .arg = arg, .u = u };
	p.arg = &u->am[id];
	return from_ucs(ucp_worker_set_am_recv_handler(u->worker, &p));
}

pdx_status_t pdx_ucx_am_recv(struct pdx_ucx *u, void *desc, void *dst,
			     size_t len, pdx_ucx_done_cb cb, void *arg)
{
	struct op *o = ucx_op_new(u, cb, arg);
	ucp_request_param_t p = {
		.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
				UCP_OP_ATTR_FIELD_USER_DATA,
		.cb.recv_am = op_recv_done,
	};

	if (!o) {
		ucp_am_data_release(u->worker, desc);
		return PDX_ENOMEM;
	}
	p.user_data = o;
	return ucx_op_started(o, ucp_am_recv_data_nbx(u->worker, desc, dst, len,
							 &p));
}

void pdx_ucx_am_drop(struct pdx_ucx *u, void *desc)
{
	if (u->worker) /* after pdx_ucx_stop() the descriptor went with it */
		ucp_am_data_release(u->worker, desc);
}

bool pdx_ucx_has_cuda(struct pdx_ucx *u)
{
	ucp_context_attr_t attr = { .field_mask = UCP_ATTR_FIELD_MEMORY_TYPES };

	return ucp_context_query(u->ctx, &attr) == UCS_OK &&
	       (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA));
}

pdx_status_t pdx_ucx_mem_register(struct pdx_ucx *u, void *addr, size_t len,
				  struct pdx_ucx_mem **out)
{
	return pdx_ucx_mem_register_type(u, addr, len, false, out);
}

pdx_status_t pdx_ucx_mem_register_type(struct pdx_ucx *u, void *addr,
				       size_t len, bool cuda,
				       struct pdx_ucx_mem **out)
{
	ucp_mem_map_params_t p = {
		.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
			      UCP_MEM_MAP_PARAM_FIELD_LENGTH |
			      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
		.address = addr,
		.length = len,
		.memory_type = cuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST,
	};
	struct pdx_ucx_mem *m = calloc(1, sizeof(*m));
	ucs_status_t s;

	if (!m)
		return PDX_ENOMEM;
	s = ucp_mem_map(u->ctx, &p, &m->memh);
	if (s != UCS_OK) {
		free(m);
		return from_ucs(s);
	}
	*out = m;
	return PDX_OK;
}

void pdx_ucx_mem_free(struct pdx_ucx *u, struct pdx_ucx_mem *m)
{
	if (!m)
		return;
	ucp_mem_unmap(u->ctx, m->memh);
	free(m);
}

pdx_status_t pdx_ucx_mem_rkey(struct pdx_ucx *u, struct pdx_ucx_mem *m,
			      void **buf, size_t *len)
{
	return from_ucs(ucp_rkey_pack(u->ctx, m->memh, buf, len));
}

void pdx_ucx_rkey_buf_free(void *buf)
{
	if (buf)
		ucp_rkey_buffer_release(buf);
}
