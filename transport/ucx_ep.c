/* Endpoints to peer workers (see ucx.h): kept ones, made without peer
 * error handling (the same host over shared memory), shared ones, made
 * with it (over TCP), and the numbers UCX pairs the endpoints of two
 * workers by. */
#include <stdlib.h>
#include <string.h>

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
	struct pdx_ucx *u;
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
		.user_data = sh->u,
	};
	ucs_status_ptr_t req;

	if (!sh->ep)
		return;
	req = ucp_ep_close_nbx(sh->ep, &p);
	sh->ep = NULL; /* no error callback for it from now on */
	if (UCS_PTR_IS_PTR(req))
		sh->u->closing++;
}

void ucx_eps_reap(struct pdx_ucx *u)
{
	u->reap = false;
	for (struct shared_ep *sh = u->shared; sh; sh = sh->next)
		if (sh->ep && !sh->refs && (sh->failed || sh->cut))
			shared_close(sh);
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
		sh->u->reap = true;
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

static struct worker_sn *worker_sn(struct pdx_ucx *u, const void *addr,
				    size_t len, bool make)
{
	struct worker_sn *w;

	for (w = u->sns; w; w = w->next)
		if (w->len == len && memcmp(w->addr, addr, len) == 0)
			return w;
	if (!make || !(w = calloc(1, sizeof(*w) + len)))
		return NULL;
	w->len = len;
	memcpy(w->addr, addr, len);
	w->next = u->sns;
	u->sns = w;
	return w;
}

/* ucp_ep_create() to p->address (len bytes), counted (struct worker_sn):
 * *sn is the number UCX gives it. */
static pdx_status_t ep_create(struct pdx_ucx *u, const ucp_ep_params_t *p,
			      size_t len, ucp_ep_h *out, uint32_t *sn)
{
	struct worker_sn *w = worker_sn(u, p->address, len, true);

	if (!w)
		return PDX_ENOMEM;
	*sn = w->made++; /* UCX takes the number before it may fail */
	return from_ucs(ucp_ep_create(u->worker, p, out));
}

/* The shared endpoint to addr that a new pdx_ucx_ep would be on. */
static struct shared_ep *shared_live(struct pdx_ucx *u, const void *addr,
				     size_t len)
{
	for (struct shared_ep *sh = u->shared; sh; sh = sh->next)
		if (sh->ep && !sh->failed && !sh->cut && sh->len == len &&
		    memcmp(sh->addr, addr, len) == 0)
			return sh;
	return NULL;
}

/* A shared endpoint to addr made now, on u->shared (its record is UCX's
 * error handler's argument, as long as the worker lives). */
static pdx_status_t shared_make(struct pdx_ucx *u, const void *addr,
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
	sh->u = u;
	sh->len = len;
	memcpy(sh->addr, addr, len);
	p.err_handler.arg = sh;
	st = ep_create(u, &p, len, &sh->ep, &sh->sn);
	if (st) {
		free(sh);
		return st;
	}
	sh->next = u->shared;
	u->shared = sh;
	*out = sh;
	return PDX_OK;
}

/* A pdx_ucx_ep on the shared endpoint to addr, made now if there is none
 * that works. */
static pdx_status_t shared_ep_new(struct pdx_ucx *u, const void *addr,
				  size_t len, struct pdx_ucx_ep *e)
{
	struct shared_ep *sh = shared_live(u, addr, len);
	pdx_status_t st;

	if (!sh && (st = shared_make(u, addr, len, &sh)))
		return st;
	sh->refs++;
	e->sh = sh;
	e->ep = sh->ep;
	e->next_user = sh->users;
	sh->users = e;
	return PDX_OK;
}

uint32_t pdx_ucx_ep_sn(struct pdx_ucx *u, const void *addr, size_t len)
{
	struct shared_ep *sh = shared_live(u, addr, len);
	struct worker_sn *w;

	if (sh)
		return sh->sn;
	w = worker_sn(u, addr, len, false);
	return w ? w->made : 0;
}

pdx_status_t pdx_ucx_ep_skip_to(struct pdx_ucx *u, const void *addr,
				size_t len, uint32_t sn)
{
	struct shared_ep *live = shared_live(u, addr, len);
	struct worker_sn *w = worker_sn(u, addr, len, false);
	uint32_t made = w ? w->made : 0;
	struct shared_ep *sh;

	if (!addr_plausible(addr, len))
		return PDX_EINVAL;
	if (sn <= pdx_ucx_ep_sn(u, addr, len))
		return PDX_OK;
	if (sn - made > PDX_UCX_SKIP_MAX)
		return PDX_EINVAL;
	if (live) { /* paired with one the peer closed */
		live->cut = true;
		if (!live->refs)
			shared_close(live);
	}
	/* each made and closed at once: one the peer made and closed waits
	 * here unexpected under that number, and goes with it */
	for (w = worker_sn(u, addr, len, false); !w || w->made < sn;
	     w = worker_sn(u, addr, len, false)) {
		pdx_status_t st = shared_make(u, addr, len, &sh);

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

pdx_status_t pdx_ucx_ep_new(struct pdx_ucx *u, const void *addr, size_t len,
			    bool peer_errors, pdx_ucx_ep_error_cb err_cb,
			    void *arg,
			    struct pdx_ucx_ep **out)
{
	struct pdx_ucx_ep *e = calloc(1, sizeof(*e));
	struct ep_slot *slot = NULL;
	ucp_ep_params_t p = {
		.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
			      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
			      UCP_EP_PARAM_FIELD_ERR_HANDLER,
		.address = addr,
		.err_mode = UCP_ERR_HANDLING_MODE_NONE, /* peer_errors: shared */
		/* needed in this mode too: without a handler UCX 1.13 aborts
		 * the agent when a CMA read finds the peer gone (tp_reshard) */
		.err_handler = { .cb = ep_error },
	};
	struct kept_ep *k;
	pdx_status_t st;
	uint32_t sn;

	if (!e || !addr_plausible(addr, len)) {
		free(e);
		return !e ? PDX_ENOMEM : PDX_EINVAL;
	}
	e->u = u;
	e->err_cb = err_cb;
	e->arg = arg;
	if (peer_errors) {
		st = shared_ep_new(u, addr, len, e);
		if (st)
			free(e);
		else
			*out = e;
		return st;
	}
	slot = calloc(1, sizeof(*slot));
	if (!slot) {
		free(e);
		return PDX_ENOMEM;
	}
	e->slot = slot;
	slot->next = u->slots;
	u->slots = slot;
	p.err_handler.arg = slot;
	for (k = u->kept; k; k = k->next)
		if (k->len == len && memcmp(k->addr, addr, len) == 0)
			break;
	if (!k) {
		k = malloc(sizeof(*k) + len);
		if (!k) {
			free(e);
			return PDX_ENOMEM; /* the slot goes with u */
		}
		st = ep_create(u, &p, len, &k->ep, &sn);
		if (st) {
			free(k);
			free(e);
			return st;
		}
		k->len = len;
		memcpy(k->addr, addr, len);
		k->next = u->kept;
		u->kept = k;
	}
	e->ep = k->ep;
	slot->e = e;
	*out = e;
	return PDX_OK;
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

void ucx_eps_forget(struct pdx_ucx *u)
{
	while (u->kept) {
		struct kept_ep *k = u->kept;

		u->kept = k->next;
		free(k);
	}
	while (u->shared) { /* their endpoints went with the worker */
		struct shared_ep *sh = u->shared;

		u->shared = sh->next;
		free(sh);
	}
	while (u->sns) {
		struct worker_sn *w = u->sns;

		u->sns = w->next;
		free(w);
	}
	while (u->slots) { /* no callback comes any more */
		struct ep_slot *s = u->slots;

		u->slots = s->next;
		free(s);
	}
}
