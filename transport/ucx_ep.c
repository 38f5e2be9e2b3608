/* Endpoints to peer workers (see ucx.h): kept ones, made without peer
 * error handling (the same host over shared memory), shared ones, made
 * with it (over TCP), and the numbers UCX pairs the endpoints of two
 * workers by. */
#include <stdlib.h>
#include <string.h>

#include "transport/ucx_ep.h"
#include "transport/ucx_internal.h"

/* A packed worker address begins with a byte whose low four bits are
 * its format's version (UCX's 0 and 1 so far), then a 64-bit uuid. */
#define UCX_ADDR_HEADER_BYTES 9
#define UCX_ADDR_VERSION_MASK 0x0f
#define UCX_ADDR_VERSION_MAX 1

/* An endpoint made without peer error handling (a same-host peer over
 * shared memory) cannot be closed in UCX 1.13: ucp_ep_close_nbx refuses
 * UCP_EP_CLOSE_FLAG_FORCE for it (UCS_ERR_INVALID_PARAM), and a flushing
 * close leaves an endpoint the peer connected back to alive until the
 * worker is destroyed. Each one holds the peer's shared-memory segments
 * attached: an agent made a new one at every hello of a restarted peer
 * engine and kept them all. They are kept here instead, by the peer's
 * worker address, and the next endpoint to that worker is the same one;
 * they go with the worker. */
struct kept_ep {
	struct kept_ep *next;
	ucp_ep_h ep;
	size_t len;
	uint8_t addr[]; /* the peer's worker address */
};

/* An endpoint with peer error handling (a peer over TCP), shared by every
 * pdx_ucx_ep made to the same worker address until it fails or is cut.
 * UCX 1.13 pairs the endpoints of two workers by a sequence number each
 * side counts per peer worker (ucp_ep_match: its k-th ucp_ep_create() to
 * the peer with the peer's k-th to us, and a wireup request with no
 * endpoint of ours waiting makes an internal one, kept unexpected until
 * our next ucp_ep_create() claims it). An agent made an endpoint at each
 * handshake and closed the one before: once one side had made one the
 * other had not (a handshake the other refused), each side's next
 * endpoint was paired with a stale one of the other's, whose far end was
 * closed, and transfers over it timed out or were found dead ("timed
 * out") right after the handshake, again at every handshake after
 * (test engine_left, new_engine_tcp pulled). Made once per peer worker,
 * the endpoints stay paired. It is closed once no pdx_ucx_ep names it
 * after it failed or was cut, else kept for the next; the structure lives
 * as long as the worker: it is UCX's error handler's argument. */
struct shared_ep {
	struct shared_ep *next;
	struct eps *eps;
	ucp_ep_h ep;	/* NULL once closed */
	unsigned refs;	/* pdx_ucx_eps on it */
	bool failed;	/* UCX found the peer dead */
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

/* What UCX's error handler gets as its argument. UCX may call it for an
 * endpoint already closed (its error handling runs from a later progress):
 * a wrapper freed by then was read after its free, and a prefill agent
 * crashed after a healed partition. A slot lives as long as the worker,
 * and names its endpoint until that is closed. */
struct ep_slot {
	struct ep_slot *next;
	struct pdx_ucx_ep *e; /* NULL once closed */
};

/* A worker's endpoint records (its u->eps), made with its first endpoint
 * and freed once it is destroyed (eps_free). */
struct eps {
	struct pdx_ucx *u;
	struct ep_slot *slots; /* every endpoint's */
	struct kept_ep *kept; /* endpoints without peer error handling */
	struct shared_ep *shared; /* those with, by worker address */
	struct worker_sn *sns; /* endpoints UCX numbered, per peer worker */
	bool reap_due; /* a shared endpoint no one uses failed: to close */
};

static void eps_free(void *arg)
{
	struct eps *eps = arg;

	while (eps->kept) {
		struct kept_ep *k = eps->kept;

		eps->kept = k->next;
		free(k);
	}
	while (eps->shared) { /* their endpoints went with the worker */
		struct shared_ep *sh = eps->shared;

		eps->shared = sh->next;
		free(sh);
	}
	while (eps->sns) {
		struct worker_sn *w = eps->sns;

		eps->sns = w->next;
		free(w);
	}
	while (eps->slots) { /* no callback comes any more */
		struct ep_slot *s = eps->slots;

		eps->slots = s->next;
		free(s);
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

static void shared_closed(void *request, ucs_status_t status,
			  void *user_data)
{
	struct pdx_ucx *u = user_data;

	(void)status;
	u->closing--;
	ucp_request_free(request);
}

static void shared_close(struct shared_ep *sh)
{
	ucp_request_param_t p = {
		.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
				UCP_OP_ATTR_FIELD_USER_DATA |
				UCP_OP_ATTR_FIELD_FLAGS,
		.flags = UCP_EP_CLOSE_FLAG_FORCE,
		.cb.send = shared_closed,
		.user_data = sh->eps->u,
	};
	ucs_status_ptr_t req;

	if (!sh->ep)
		return;
	req = ucp_ep_close_nbx(sh->ep, &p);
	sh->ep = NULL; /* no error callback for it from now on */
	if (UCS_PTR_IS_PTR(req))
		sh->eps->u->closing++;
}

/* The shared endpoints no one uses that failed or were cut since,
 * closed: from the next progress, as UCX's error callback may not. */
static void reap(void *arg, pdx_status_t st)
{
	struct eps *eps = arg;

	(void)st;
	eps->reap_due = false;
	for (struct shared_ep *sh = eps->shared; sh; sh = sh->next)
		if (sh->ep && !sh->refs && (sh->failed || sh->cut))
			shared_close(sh);
}

/* Without memory for it, a failed endpoint no one uses stays open until
 * the next one fails, or the worker goes. */
static void reap_soon(struct eps *eps)
{
	if (!eps->reap_due && ucx_call_soon(eps->u, reap, eps) == PDX_OK)
		eps->reap_due = true;
}

static void ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	struct ep_slot *slot = arg;
	struct pdx_ucx_ep *e = slot->e;

	if (e && e->ep == ep && e->err_cb)
		e->err_cb(e->arg, status == UCS_OK ? PDX_EPEER : from_ucs(status));
}

static void shared_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	struct shared_ep *sh = arg;
	pdx_status_t st = status == UCS_OK ? PDX_EPEER : from_ucs(status);
	struct pdx_ucx_ep *e;

	if (sh->ep != ep || sh->failed)
		return;
	sh->failed = true; /* given to no new pdx_ucx_ep */
	if (!sh->refs)
		reap_soon(sh->eps);
	/* a callback may close any of the users (a peer's failure lets go
	 * of the endpoints it kept): from the head again after each */
	for (e = sh->users; e; e = e->next_user)
		e->told = false;
	for (e = sh->users; e;) {
		if (e->told || !e->err_cb) {
			e = e->next_user;
			continue;
		}
		e->told = true;
		e->err_cb(e->arg, st);
		e = sh->users;
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
	struct worker_sn *w;

	for (w = eps->sns; w; w = w->next)
		if (w->len == len && memcmp(w->addr, addr, len) == 0)
			return w;
	if (!make || !(w = calloc(1, sizeof(*w) + len)))
		return NULL;
	w->len = len;
	memcpy(w->addr, addr, len);
	w->next = eps->sns;
	eps->sns = w;
	return w;
}

/* ucp_ep_create() to p->address (len bytes), counted (struct worker_sn):
 * *sn is the number UCX gives it. */
static pdx_status_t ep_create(struct eps *eps, const ucp_ep_params_t *p,
			      size_t len, ucp_ep_h *out, uint32_t *sn)
{
	struct worker_sn *w = worker_sn(eps, p->address, len, true);

	if (!w)
		return PDX_ENOMEM;
	*sn = w->made++; /* UCX takes the number before it may fail */
	return from_ucs(ucp_ep_create(eps->u->worker, p, out));
}

/* The shared endpoint to addr that a new pdx_ucx_ep would be on. */
static struct shared_ep *shared_live(struct eps *eps, const void *addr,
				     size_t len)
{
	for (struct shared_ep *sh = eps->shared; sh; sh = sh->next)
		if (sh->ep && !sh->failed && !sh->cut && sh->len == len &&
		    memcmp(sh->addr, addr, len) == 0)
			return sh;
	return NULL;
}

/* A shared endpoint to addr made now, on eps->shared (its record is UCX's
 * error handler's argument, as long as the worker lives). */
static pdx_status_t shared_make(struct eps *eps, const void *addr,
				size_t len, struct shared_ep **out)
{
	ucp_ep_params_t p = {
		.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
			      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
			      UCP_EP_PARAM_FIELD_ERR_HANDLER,
		.address = addr,
		.err_mode = UCP_ERR_HANDLING_MODE_PEER,
		.err_handler = { .cb = shared_ep_error },
	};
	struct shared_ep *sh = calloc(1, sizeof(*sh) + len);
	pdx_status_t st;

	if (!sh)
		return PDX_ENOMEM;
	sh->eps = eps;
	sh->len = len;
	memcpy(sh->addr, addr, len);
	p.err_handler.arg = sh;
	st = ep_create(eps, &p, len, &sh->ep, &sh->sn);
	if (st) {
		free(sh);
		return st;
	}
	sh->next = eps->shared;
	eps->shared = sh;
	*out = sh;
	return PDX_OK;
}

/* A pdx_ucx_ep on the shared endpoint to addr, made now if there is none
 * that works. */
static pdx_status_t shared_ep_new(struct eps *eps, const void *addr,
				  size_t len, struct pdx_ucx_ep *e)
{
	struct shared_ep *sh = shared_live(eps, addr, len);
	pdx_status_t st;

	if (!sh && (st = shared_make(eps, addr, len, &sh)))
		return st;
	sh->refs++;
	e->sh = sh;
	e->ep = sh->ep;
	e->next_user = sh->users;
	sh->users = e;
	return PDX_OK;
}

static uint32_t sn_of(struct eps *eps, const void *addr, size_t len)
{
	struct shared_ep *sh = shared_live(eps, addr, len);
	struct worker_sn *w;

	if (sh)
		return sh->sn;
	w = worker_sn(eps, addr, len, false);
	return w ? w->made : 0;
}

uint32_t pdx_ucx_ep_sn(struct pdx_ucx *u, const void *addr, size_t len)
{
	return u->eps ? sn_of(u->eps, addr, len) : 0;
}

pdx_status_t pdx_ucx_ep_skip_to(struct pdx_ucx *u, const void *addr,
				size_t len, uint32_t sn)
{
	struct eps *eps = eps_of(u);
	struct shared_ep *live, *sh;
	struct worker_sn *w;
	uint32_t made;

	if (!eps)
		return PDX_ENOMEM;
	if (!addr_plausible(addr, len))
		return PDX_EINVAL;
	if (sn <= sn_of(eps, addr, len))
		return PDX_OK;
	live = shared_live(eps, addr, len);
	w = worker_sn(eps, addr, len, false);
	made = w ? w->made : 0;
	if (sn - made > PDX_UCX_SKIP_MAX)
		return PDX_EINVAL;
	if (live) { /* paired with one the peer closed */
		live->cut = true;
		if (!live->refs)
			shared_close(live);
	}
	/* each made and closed at once: one the peer made and closed waits
	 * here unexpected under that number, and goes with it */
	for (w = worker_sn(eps, addr, len, false); !w || w->made < sn;
	     w = worker_sn(eps, addr, len, false)) {
		pdx_status_t st = shared_make(eps, addr, len, &sh);

		if (st == PDX_OK) {
			sh->cut = true;
			shared_close(sh);
		} else if (st == PDX_ENOMEM) {
			return st;
		}
	}
	return PDX_OK;
}

static void shared_ep_release(struct pdx_ucx_ep *e)
{
	struct shared_ep *sh = e->sh;
	struct pdx_ucx_ep **pp;

	for (pp = &sh->users; *pp; pp = &(*pp)->next_user)
		if (*pp == e) {
			*pp = e->next_user;
			break;
		}
	e->err_cb = NULL;
	/* closing calls back the operations it ends, at once: e may be used
	 * there still (a flush on its peer's endpoint, which UCX refuses
	 * now), as its caller has not let go of it yet */
	if (--sh->refs == 0 && (sh->failed || sh->cut))
		shared_close(sh);
	free(e);
}

/* A pdx_ucx_ep on the kept endpoint to addr, made now if there is none;
 * its slot is UCX's error handler's argument, as long as the worker
 * lives. */
static pdx_status_t kept_ep_new(struct eps *eps, const void *addr,
				size_t len, struct pdx_ucx_ep *e)
{
	ucp_ep_params_t p = {
		.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
			      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
			      UCP_EP_PARAM_FIELD_ERR_HANDLER,
		.address = addr,
		.err_mode = UCP_ERR_HANDLING_MODE_NONE,
		/* needed in this mode too: without a handler UCX 1.13 aborts
		 * the agent when a CMA read finds the peer gone (tp_reshard) */
		.err_handler = { .cb = ep_error },
	};
	struct ep_slot *slot = calloc(1, sizeof(*slot));
	struct kept_ep *k;
	pdx_status_t st;
	uint32_t sn;

	if (!slot)
		return PDX_ENOMEM;
	slot->next = eps->slots;
	eps->slots = slot;
	p.err_handler.arg = slot;
	for (k = eps->kept; k; k = k->next)
		if (k->len == len && memcmp(k->addr, addr, len) == 0)
			break;
	if (!k) {
		k = malloc(sizeof(*k) + len);
		if (!k)
			return PDX_ENOMEM; /* the slot goes with the worker */
		st = ep_create(eps, &p, len, &k->ep, &sn);
		if (st) {
			free(k);
			return st;
		}
		k->len = len;
		memcpy(k->addr, addr, len);
		k->next = eps->kept;
		eps->kept = k;
	}
	e->slot = slot;
	e->ep = k->ep;
	slot->e = e;
	return PDX_OK;
}

pdx_status_t pdx_ucx_ep_new(struct pdx_ucx *u, const void *addr, size_t len,
			    bool peer_errors, pdx_ucx_ep_error_cb err_cb,
			    void *arg,
			    struct pdx_ucx_ep **out)
{
	struct eps *eps = eps_of(u);
	struct pdx_ucx_ep *e;
	pdx_status_t st;

	if (!addr_plausible(addr, len))
		return PDX_EINVAL;
	if (!eps || !(e = calloc(1, sizeof(*e))))
		return PDX_ENOMEM;
	e->u = u;
	e->err_cb = err_cb;
	e->arg = arg;
	st = peer_errors ? shared_ep_new(eps, addr, len, e)
			 : kept_ep_new(eps, addr, len, e);
	if (st)
		free(e);
	else
		*out = e;
	return st;
}

bool pdx_ucx_ep_reports_errors(const struct pdx_ucx_ep *e)
{
	return e->sh != NULL;
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
	if (!e)
		return;
	if (e->sh) { /* kept for the next to that worker, unless it failed */
		shared_ep_release(e);
		return;
	}
	/* a kept one stays open for the next endpoint to that worker */
	e->slot->e = NULL; /* no error callback for it from now on */
	free(e);
}

void pdx_ucx_ep_cut(struct pdx_ucx_ep *e)
{
	if (e && e->sh)
		e->sh->cut = true;
	pdx_ucx_ep_close(e);
}
