/* Endpoints to peer workers (see ucx.h): one UCX endpoint per peer worker,
 * shared by every pdx_ucx_ep made to it, kept for good when made without
 * peer error handling (the same host over shared memory) and closed once
 * it failed or was cut when made with it (over TCP); and the numbers UCX
 * pairs the endpoints of two workers by. */
#include <stdlib.h>
#include <string.h>

#include "transport/ucx_ep.h"
#include "transport/ucx_internal.h"

/* A packed worker address begins with a byte whose low four bits are
 * its format's version (UCX's 0 and 1 so far), then a 64-bit uuid. */
#define UCX_ADDR_HEADER_BYTES 9
#define UCX_ADDR_VERSION_MASK 0x0f
#define UCX_ADDR_VERSION_MAX 1

/* A UCX endpoint to a peer worker, and the pdx_ucx_eps on it (its users).
 *
 * Kept: one made without peer error handling (a same-host peer over shared
 * memory) cannot be closed in UCX 1.13: ucp_ep_close_nbx refuses
 * UCP_EP_CLOSE_FLAG_FORCE for it (UCS_ERR_INVALID_PARAM), and a flushing
 * close leaves an endpoint the peer connected back to alive until the
 * worker is destroyed. Each one holds the peer's shared-memory segments
 * attached: an agent made a new one at every hello of a restarted peer
 * engine and kept them all. The next endpoint to that worker is the same
 * one; it goes with the worker.
 *
 * Shared (not kept): one with peer error handling (a peer over TCP), the
 * next endpoint to that worker until it fails or is cut. UCX 1.13 pairs
 * the endpoints of two workers by a sequence number each side counts per
 * peer worker (ucp_ep_match: its k-th ucp_ep_create() to the peer with the
 * peer's k-th to us, and a wireup request with no endpoint of ours waiting
 * makes an internal one, kept unexpected until our next ucp_ep_create()
 * claims it). An agent made an endpoint at each handshake and closed the
 * one before: once one side had made one the other had not (a handshake
 * the other refused), each side's next endpoint was paired with a stale
 * one of the other's, whose far end was closed, and transfers over it
 * timed out or were found dead ("timed out") right after the handshake,
 * again at every handshake after (test engine_left, new_engine_tcp
 * pulled). Made once per peer worker, the endpoints stay paired. It is
 * closed once no pdx_ucx_ep names it after it failed or was cut.
 *
 * The record lives as long as the worker: it is UCX's error handler's
 * argument, and UCX may call that for an endpoint already closed (its
 * error handling runs from a later progress): a wrapper freed by then was
 * read after its free, and a prefill agent crashed after a healed
 * partition. */
struct worker_ep {
	struct worker_ep *next;
	struct eps *eps;
	ucp_ep_h ep;	/* NULL once closed */
	bool kept;	/* without peer error handling: never closed */
	unsigned refs;	/* pdx_ucx_eps on it */
	bool failed;	/* UCX found the peer dead (a shared one) */
	bool cut;	/* pdx_ucx_ep_cut(): closed at the last close */
	struct pdx_ucx_ep *users;
	uint32_t sn;	/* UCX's sequence number for it (struct worker_sn) */
	size_t len;
	uint8_t addr[]; /* the peer's worker address */
};

/* How many endpoints this worker made to a peer worker: UCX numbers each
 * one (its conn_sn, ucp_ep_match_get_sn() at every ucp_ep_create() to a
 * worker address, failed ones too) and pairs ours with the peer's of the
 * same number. A side that closed its endpoint and made another is one
 * ahead: the other side's endpoint is then paired with a closed one, and
 * its own next with the stale one the first made before (a peer found
 * silent by one side only, its endpoint cut: the other side's first pull
 * after timed out). pdx_ucx_ep_sn() tells the number, which the peer
 * gives pdx_ucx_ep_skip_to(). */
struct worker_sn {
	struct worker_sn *next;
	uint32_t made;
	size_t len;
	uint8_t addr[];
};

/* A worker's endpoint records (its u->eps), made with its first endpoint
 * and freed once it is destroyed (eps_free). */
struct eps {
	struct pdx_ucx *u;
	struct worker_ep *all;
	struct worker_sn *sns;
	bool reap_due; /* a shared endpoint no one uses failed: to close */
};

static void eps_free(void *arg)
{
	struct eps *eps = arg;

	while (eps->all) { /* their endpoints went with the worker */
		struct worker_ep *w = eps->all;

		eps->all = w->next;
		free(w);
	}
	while (eps->sns) {
		struct worker_sn *n = eps->sns;

		eps->sns = n->next;
		free(n);
	}
	free(eps);
}

/* u's records, made now if it has none (NULL without memory). */
static struct eps *eps_of(struct pdx_ucx *u)
{
	struct eps *eps = u->eps;

	if (!eps && (eps = calloc(1, sizeof(*eps)))) {
		eps->u = u;
		u->eps = eps;
		u->eps_free = eps_free;
	}
	return eps;
}

static void closed(void *request, ucs_status_t status, void *user_data)
{
	struct pdx_ucx *u = user_data;

	(void)status;
	u->closing--;
	ucp_request_free(request);
}

static void worker_ep_close(struct worker_ep *w)
{
	ucp_request_param_t p = {
		.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
				UCP_OP_ATTR_FIELD_USER_DATA |
				UCP_OP_ATTR_FIELD_FLAGS,
		.flags = UCP_EP_CLOSE_FLAG_FORCE,
		.cb.send = closed,
		.user_data = w->eps->u,
	};
	ucs_status_ptr_t req;

	if (!w->ep || w->kept)
		return;
	req = ucp_ep_close_nbx(w->ep, &p);
	w->ep = NULL; /* no error callback for it from now on */
	if (UCS_PTR_IS_PTR(req))
		w->eps->u->closing++;
}

static bool worker_ep_done(const struct worker_ep *w)
{
	return w->ep && !w->refs && (w->failed || w->cut);
}

/* The shared endpoints no one uses that failed or were cut since,
 * closed: from the next progress, as UCX's error callback may not. */
static void reap(void *arg, pdx_status_t st)
{
	struct eps *eps = arg;

	(void)st;
	eps->reap_due = false;
	for (struct worker_ep *w = eps->all; w; w = w->next)
		if (worker_ep_done(w))
			worker_ep_close(w);
}

/* Without memory for it, a failed endpoint no one uses stays open until
 * the next one fails, or the worker goes. */
static void reap_soon(struct eps *eps)
{
	if (!eps->reap_due && ucx_call_soon(eps->u, reap, eps) == PDX_OK)
		eps->reap_due = true;
}

/* Every user is told. A shared endpoint fails once, and is given to no
 * new user after; a kept one is the next user's still, and tells each
 * failure. */
static void ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	struct worker_ep *w = arg;
	pdx_status_t st = status == UCS_OK ? PDX_EPEER : from_ucs(status);
	struct pdx_ucx_ep *e;

	if (w->ep != ep || w->failed)
		return;
	if (!w->kept) {
		w->failed = true;
		if (worker_ep_done(w))
			reap_soon(w->eps);
	}
	/* a callback may close any of the users (a peer's failure lets go
	 * of the endpoints it kept): from the head again after each */
	for (e = w->users; e; e = e->next_user)
		e->told = false;
	for (e = w->users; e;) {
		if (e->told || !e->err_cb) {
			e = e->next_user;
			continue;
		}
		e->told = true;
		e->err_cb(e->arg, st);
		e = w->users;
	}
}

/* UCX trusts an address it unpacks: a header of another version aborts
 * the process (an assertion), and one shorter than its header is read
 * past. The rest it describes itself, and only a peer link that admits
 * members alone (CURVE) keeps crafted ones out: this keeps out garbage. */
static bool addr_plausible(const uint8_t *addr, size_t len)
{
	return len >= UCX_ADDR_HEADER_BYTES &&
	       (addr[0] & UCX_ADDR_VERSION_MASK) <= UCX_ADDR_VERSION_MAX;
}

static struct worker_sn *worker_sn(struct eps *eps, const void *addr,
				    size_t len, bool make)
{
	struct worker_sn *n;

	for (n = eps->sns; n; n = n->next)
		if (n->len == len && memcmp(n->addr, addr, len) == 0)
			return n;
	if (!make || !(n = calloc(1, sizeof(*n) + len)))
		return NULL;
	n->len = len;
	memcpy(n->addr, addr, len);
	n->next = eps->sns;
	eps->sns = n;
	return n;
}

/* The endpoint to addr of that kind that a new pdx_ucx_ep would be on. */
static struct worker_ep *worker_ep_live(struct eps *eps, const void *addr,
					size_t len, bool kept)
{
	for (struct worker_ep *w = eps->all; w; w = w->next)
		if (w->ep && !w->failed && !w->cut && w->kept == kept &&
		    w->len == len && memcmp(w->addr, addr, len) == 0)
			return w;
	return NULL;
}

/* An endpoint to addr made now, on eps->all, counted (struct worker_sn). */
static pdx_status_t worker_ep_make(struct eps *eps, const void *addr,
				   size_t len, bool kept,
				   struct worker_ep **out)
{
	ucp_ep_params_t p = {
		.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
			      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
			      UCP_EP_PARAM_FIELD_ERR_HANDLER,
		.address = addr,
		.err_mode = kept ? UCP_ERR_HANDLING_MODE_NONE
				 : UCP_ERR_HANDLING_MODE_PEER,
		/* a kept one needs it too: without a handler UCX 1.13 aborts
		 * the agent when a CMA read finds the peer gone (tp_reshard) */
		.err_handler = { .cb = ep_error },
	};
	struct worker_sn *n = worker_sn(eps, addr, len, true);
	struct worker_ep *w = calloc(1, sizeof(*w) + len);
	pdx_status_t st;

	if (!w || !n) {
		free(w);
		return PDX_ENOMEM;
	}
	w->eps = eps;
	w->kept = kept;
	w->len = len;
	memcpy(w->addr, addr, len);
	p.err_handler.arg = w;
	w->sn = n->made++; /* UCX takes the number before it may fail */
	st = from_ucs(ucp_ep_create(eps->u->worker, &p, &w->ep));
	if (st) {
		free(w);
		return st;
	}
	w->next = eps->all;
	eps->all = w;
	*out = w;
	return PDX_OK;
}

static uint32_t sn_of(struct eps *eps, const void *addr, size_t len)
{
	struct worker_ep *w = worker_ep_live(eps, addr, len, false);
	struct worker_sn *n;

	if (w)
		return w->sn;
	n = worker_sn(eps, addr, len, false);
	return n ? n->made : 0;
}

uint32_t pdx_ucx_ep_sn(struct pdx_ucx *u, const void *addr, size_t len)
{
	return u->eps ? sn_of(u->eps, addr, len) : 0;
}

pdx_status_t pdx_ucx_ep_skip_to(struct pdx_ucx *u, const void *addr,
				size_t len, uint32_t sn)
{
	struct eps *eps = eps_of(u);
	struct worker_ep *live, *w;
	struct worker_sn *n;

	if (!eps)
		return PDX_ENOMEM;
	if (!addr_plausible(addr, len))
		return PDX_EINVAL;
	if (sn <= sn_of(eps, addr, len))
		return PDX_OK;
	n = worker_sn(eps, addr, len, false);
	if (sn - (n ? n->made : 0) > PDX_UCX_SKIP_MAX)
		return PDX_EINVAL;
	live = worker_ep_live(eps, addr, len, false);
	if (live) { /* paired with one the peer closed */
		live->cut = true;
		if (!live->refs)
			worker_ep_close(live);
	}
	/* each made and closed at once: one the peer made and closed waits
	 * here unexpected under that number, and goes with it */
	for (n = worker_sn(eps, addr, len, false); !n || n->made < sn;
	     n = worker_sn(eps, addr, len, false)) {
		pdx_status_t st = worker_ep_make(eps, addr, len, false, &w);

		if (st == PDX_OK) {
			w->cut = true;
			worker_ep_close(w);
		} else if (st == PDX_ENOMEM) {
			return st;
		}
	}
	return PDX_OK;
}

pdx_status_t pdx_ucx_ep_new(struct pdx_ucx *u, const void *addr, size_t len,
			    bool peer_errors, pdx_ucx_ep_error_cb err_cb,
			    void *arg,
			    struct pdx_ucx_ep **out)
{
	struct eps *eps = eps_of(u);
	struct worker_ep *w;
	struct pdx_ucx_ep *e;
	pdx_status_t st;

	if (!addr_plausible(addr, len))
		return PDX_EINVAL;
	if (!eps || !(e = calloc(1, sizeof(*e))))
		return PDX_ENOMEM;
	w = worker_ep_live(eps, addr, len, !peer_errors);
	if (!w && (st = worker_ep_make(eps, addr, len, !peer_errors, &w))) {
		free(e);
		return st;
	}
	e->u = u;
	e->ep = w->ep;
	e->w = w;
	e->err_cb = err_cb;
	e->arg = arg;
	e->next_user = w->users;
	w->users = e;
	w->refs++;
	*out = e;
	return PDX_OK;
}

bool pdx_ucx_ep_reports_errors(const struct pdx_ucx_ep *e)
{
	return !e->w->kept;
}

bool pdx_ucx_ep_same(const struct pdx_ucx_ep *a, const struct pdx_ucx_ep *b)
{
	return a && b && a->ep == b->ep;
}

void pdx_ucx_ep_mute(struct pdx_ucx_ep *e)
{
	if (e)
		e->err_cb = NULL;
}

void pdx_ucx_ep_close(struct pdx_ucx_ep *e)
{
	struct worker_ep *w;
	struct pdx_ucx_ep **pp;

	if (!e)
		return;
	w = e->w;
	for (pp = &w->users; *pp; pp = &(*pp)->next_user)
		if (*pp == e) {
			*pp = e->next_user;
			break;
		}
	e->err_cb = NULL;
	w->refs--;
	/* closing calls back the operations it ends, at once: e may be used
	 * there still (a flush on its peer's endpoint, which UCX refuses
	 * now), as its caller has not let go of it yet */
	if (worker_ep_done(w))
		worker_ep_close(w);
	free(e);
}

void pdx_ucx_ep_cut(struct pdx_ucx_ep *e)
{
	if (e && !e->w->kept)
		e->w->cut = true;
	pdx_ucx_ep_close(e);
}
