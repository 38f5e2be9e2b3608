/* Instance pools and the picking policies (see pool.h). */
#include "proxy/pool.h"

#include <event2/event.h>
#include <event2/http.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/fnv.h"
#include "common/http_listen.h"
#include "common/mix64.h"

void pdx_pool_idle_close(struct pdx_inst *i)
{
	while (i->n_idle)
		evhttp_connection_free(i->idle[--i->n_idle].conn);
	if (i->idle_timer)
		event_del(i->idle_timer);
}

static void inst_free(struct pdx_inst *i)
{
	if (i->gone_from)
		LIST_REMOVE(i, gone_link);
	pdx_pool_idle_close(i);
	if (i->idle_timer)
		event_free(i->idle_timer);
	if (i->boot)
		evhttp_free(i->boot);
	pdx_served_models_free(&i->models);
	free(i);
}

/* A host name or an IP address, and nothing else: ASCII letters, digits,
 * '.', '-' and '_', and in brackets an IPv6 address's ':' and its zone's
 * '%'. The host goes into Host headers, log lines, /metrics labels and the
 * admin list; "a\r\nb:1", taken once, split the /metrics page (every
 * Prometheus scrape failed) and a quote or a space broke its labels. */
static bool host_ok(const char *h, const char *end, bool bracketed)
{
	for (; h < end; h++) {
		char ch = *h;

		if (!(ch >= 'a' && ch <= 'z') && !(ch >= 'A' && ch <= 'Z') &&
		    !(ch >= '0' && ch <= '9') && !strchr(".-_", ch) &&
		    !(bracketed && (ch == ':' || ch == '%')))
			return false;
	}
	return true;
}

int pdx_pool_addr_parse(const char *s, char *host, size_t hostlen,
			uint16_t *port, char *err, size_t errlen)
{
	const char *h = s, *colon, *hend;
	bool bracketed = false;
	unsigned long v;
	char *end;

	if (!strncmp(h, "http://", 7))
		h += 7;
	/* another scheme (an agent's tcp://, https://) or a path: not an
	 * engine's HTTP address (tcp://H:P became http://[tcp://H]:P) */
	if (strstr(h, "://") || strchr(h, '/') != strrchr(h, '/') ||
	    (strchr(h, '/') && strcmp(strchr(h, '/'), "/")))
		goto bad;
	if (*h == '[') {
		hend = strchr(h, ']');
		if (!hend || hend[1] != ':')
			goto bad;
		h++;
		bracketed = true;
		colon = hend + 1;
	} else {
		colon = strrchr(h, ':');
		if (!colon)
			goto bad;
		hend = colon;
	}
	if (hend == h || (size_t)(hend - h) >= hostlen ||
	    !host_ok(h, hend, bracketed))
		goto bad;
	v = strtoul(colon + 1, &end, 10);
	if (colon[1] == '\0' || (*end && strcmp(end, "/")) || v == 0 ||
	    v > 65535)
		goto bad;
	memcpy(host, h, hend - h);
	host[hend - h] = '\0';
	*port = (uint16_t)v;
	return 0;
bad:
	snprintf(err, errlen, "bad address '%s' (want HOST:PORT or "
		 "http://HOST:PORT, an engine's HTTP address)", s);
	return -1;
}

static struct pdx_inst *pool_find(const struct pdx_pool *p, const char *host,
				  uint16_t port, unsigned *idx)
{
	for (unsigned i = 0; i < p->n; i++) {
		if (p->inst[i]->port == port &&
		    !strcmp(p->inst[i]->host, host)) {
			*idx = i;
			return p->inst[i];
		}
	}
	return NULL;
}

int pdx_pool_add(struct pdx_pool *p, const char *addr, char *err, size_t errlen)
{
	char host[PDX_POOL_ADDR_MAX];
	struct pdx_inst *i;
	uint16_t port;
	unsigned idx;

	if (pdx_pool_addr_parse(addr, host, sizeof(host), &port, err, errlen))
		return -1;
	if (pool_find(p, host, port, &idx)) {
		snprintf(err, errlen, "%s instance %s:%u already in the pool",
			 pdx_pool_role_name(p->role), host, port);
		return -1;
	}
	if (p->n == PDX_POOL_MAX) {
		snprintf(err, errlen, "%s pool full (%d instances)",
			 pdx_pool_role_name(p->role), PDX_POOL_MAX);
		return -1;
	}
	LIST_FOREACH(i, &p->gone, gone_link)
		if (i->port == port && !strcmp(i->host, host))
			break;
	if (i) {
		LIST_REMOVE(i, gone_link);
		i->gone_from = NULL;
		i->removed = false;
		i->refs++; /* the pool's again */
		i->health_fails = i->health_oks = 0;
		i->unhealthy = false;
		/* closed (its transition counts are metrics: kept) */
		i->breaker.state = PDX_BREAKER_CLOSED;
		i->breaker.fails = 0;
		i->breaker.until_ns = 0;
		/* its engine may have restarted, or moved to its pool */
		i->peer_known = i->models.known = false;
		i->misplaced = false;
		i->engine_id[0] = '\0';
		p->inst[p->n++] = i;
		return 0;
	}
	i = calloc(1, sizeof(*i));
	if (!i) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	snprintf(i->host, sizeof(i->host), "%s", host);
	i->port = port;
	pdx_http_url(i->url, sizeof(i->url), host, port, "");
	i->role = p->role;
	i->breaker.failures = p->breaker_failures;
	i->breaker.open_ns = p->breaker_open_ns;
	i->url_hash = pdx_fnv1a64(PDX_FNV1A64_INIT, i->url, strlen(i->url));
	i->refs = 1; /* the pool's */
	p->inst[p->n++] = i;
	return 0;
}

/* The instance with this address ("h:p" or "http://h:p"), its index in
 * *idx; NULL when none (or the address does not parse). */
static struct pdx_inst *pool_find_addr(const struct pdx_pool *p,
				       const char *addr, unsigned *idx)
{
	char host[PDX_POOL_ADDR_MAX], err[8];
	uint16_t port;

	if (pdx_pool_addr_parse(addr, host, sizeof(host), &port, err,
				sizeof(err)))
		return NULL;
	return pool_find(p, host, port, idx);
}

bool pdx_pool_has(const struct pdx_pool *p, const char *addr)
{
	unsigned idx;

	return pool_find_addr(p, addr, &idx) != NULL;
}

int pdx_pool_remove(struct pdx_pool *p, const char *addr)
{
	unsigned idx;
	struct pdx_inst *i = pool_find_addr(p, addr, &idx);

	if (!i)
		return -1;
	memmove(&p->inst[idx], &p->inst[idx + 1],
		(p->n - idx - 1) * sizeof(p->inst[0]));
	p->n--;
	i->removed = true;
	pdx_pool_idle_close(i);
	if (i->refs > 1) { /* held by requests: may come back */
		i->gone_from = p;
		LIST_INSERT_HEAD(&p->gone, i, gone_link);
	}
	i->inflight++; /* balanced by the put below */
	pdx_pool_put(i);
	return 0;
}

unsigned pdx_pool_load(const struct pdx_inst *i)
{
	return i->inflight + i->xfers;
}

bool pdx_pool_usable(const struct pdx_inst *i, uint64_t now)
{
	return !i->unhealthy && !i->misplaced &&
	       pdx_breaker_usable(&i->breaker, now);
}

/* Usable (pdx_pool_usable), or with trials: healthy, its breaker's
 * trial under way. */
static bool may_take(const struct pdx_inst *i, uint64_t now, bool trials)
{
	return pdx_pool_usable(i, now) ||
	       (trials && !i->unhealthy && !i->misplaced &&
		pdx_breaker_on_trial(&i->breaker, now));
}

/* The instances a pick may take, in pool order (so round-robin and the
 * tie-breaks keep their meaning): those but avoid that may take it
 * (may_take) and may serve model. When none may, and the last list of no
 * instance of the pool named it (avoid included): every one but avoid
 * if or_any (its engine answers 404), else none. (An instance that
 * served the model, whatever its state now, keeps the others out: a
 * retry after the one instance of the model failed went to another
 * model's, as did each request while that instance was down or on its
 * breaker's trial, and the client got that engine's 404 for the model
 * it asked.) Returns how many. */
static unsigned candidates_of(const struct pdx_pool *p,
			      const struct pdx_inst *avoid, const char *model,
			      bool or_any, bool trials, struct pdx_inst **out)
{
	uint64_t now = pdx_now_ns();
	bool served = false, named = false;
	unsigned n = 0;

	/* avoid counts whatever its state: its failure may have opened its
	 * breaker (or a check marked it) before the retry asks */
	for (unsigned k = 0; k < p->n && !served; k++) {
		const struct pdx_inst *i = p->inst[k];

		served = (i == avoid || may_take(i, now, trials)) &&
			 pdx_served_models_take(&i->models, model);
		named = named || pdx_served_models_named(&i->models, model);
	}
	if (!served && (!or_any || named))
		return 0;
	for (unsigned k = 0; k < p->n; k++) {
		struct pdx_inst *i = p->inst[k];

		if (i != avoid && may_take(i, now, trials) &&
		    (!served || pdx_served_models_take(&i->models, model)))
			out[n++] = i;
	}
	return n;
}

/* The usable instances; where none is, those whose breaker's trial is
 * under way too. A trial keeps other requests off a suspect instance
 * while another can take them; with none other, a request that may
 * succeed beats a certain 503. A trial lasts as long as its request: a
 * prefill instance's until the decode leg answers, a whole generation
 * when not streamed. Meanwhile a rolling restart's clients got 503 "no
 * usable prefill instance" (and unretried 502s) once the other prefill
 * instance stopped, the restarted one healthy and idle beside its
 * trial; as did every client of a lone prefill instance. Not where the
 * pool says no (p->no_trial_joining). */
static unsigned candidates(const struct pdx_pool *p,
			   const struct pdx_inst *avoid, const char *model,
			   bool or_any, struct pdx_inst **out)
{
	unsigned n = candidates_of(p, avoid, model, or_any, false, out);

	return n || p->no_trial_joining
		       ? n
		       : candidates_of(p, avoid, model, or_any, true, out);
}

static struct pdx_inst *least_loaded(struct pdx_pool *p, struct pdx_inst **c,
				     unsigned n)
{
	/* ties go round-robin too, so equal loads spread out */
	unsigned start = p->rr++ % n;
	struct pdx_inst *best = c[start];

	for (unsigned k = 1; k < n; k++) {
		struct pdx_inst *i = c[(start + k) % n];

		if (pdx_pool_load(i) < pdx_pool_load(best))
			best = i;
	}
	return best;
}

/* The prefix's favourite among the instances loaded at most the least
 * load plus the slack. */
static struct pdx_inst *prefix_aware(struct pdx_inst **c, unsigned n,
				     uint64_t key)
{
	unsigned bound = pdx_pool_load(c[0]);
	struct pdx_inst *best = NULL;
	uint64_t best_w = 0;

	for (unsigned k = 1; k < n; k++)
		if (pdx_pool_load(c[k]) < bound)
			bound = pdx_pool_load(c[k]);
	bound += PDX_POOL_PREFIX_SLACK;

	for (unsigned k = 0; k < n; k++) {
		struct pdx_inst *i = c[k];
		uint64_t w = pdx_mix64(key ^ i->url_hash);

		if (pdx_pool_load(i) <= bound && (!best || w > best_w)) {
			best = i;
			best_w = w;
		}
	}
	return best;
}

bool pdx_pool_has_usable(const struct pdx_pool *p,
			 const struct pdx_inst *avoid, const char *model,
			 bool or_any)
{
	struct pdx_inst *c[PDX_POOL_MAX];

	return candidates(p, avoid, model, or_any, c) > 0;
}

struct pdx_inst *pdx_pool_pick(struct pdx_pool *p, uint64_t key,
			       const struct pdx_inst *avoid,
			       const char *model, bool or_any)
{
	struct pdx_inst *c[PDX_POOL_MAX], *best;
	unsigned n = candidates(p, avoid, model, or_any, c);

	if (!n)
		return NULL;
	switch (p->policy) {
	case PDX_POLICY_LEAST_LOADED:
		best = least_loaded(p, c, n);
		break;
	case PDX_POLICY_PREFIX_AWARE:
		best = prefix_aware(c, n, key);
		break;
	default:
		best = c[p->rr++ % n];
	}
	pdx_breaker_admit(&best->breaker, pdx_now_ns());
	pdx_pool_hold(best);
	best->requests++;
	return best;
}

void pdx_pool_relearn(struct pdx_inst *p, struct pdx_inst *d)
{
	if (p)
		p->peer_known = false;
	if (d)
		d->peer_known = false;
}

bool pdx_pool_result(struct pdx_inst *i, bool ok)
{
	if (!ok)
		i->failures++;
	return pdx_breaker_result(&i->breaker, ok, pdx_now_ns());
}

bool pdx_pool_health(struct pdx_inst *i, bool ok, unsigned down_after,
		     unsigned up_after)
{
	bool was = i->unhealthy;

	if (ok) {
		i->health_fails = 0;
		if (++i->health_oks >= up_after)
			i->unhealthy = false;
	} else {
		i->health_oks = 0;
		if (++i->health_fails >= down_after)
			i->unhealthy = true;
	}
	return was != i->unhealthy;
}

void pdx_pool_hold(struct pdx_inst *i)
{
	i->refs++;
	i->inflight++;
}

void pdx_pool_put(struct pdx_inst *i)
{
	if (!i)
		return;
	i->inflight--;
	pdx_pool_unref(i);
}

void pdx_pool_ref(struct pdx_inst *i)
{
	i->refs++;
}

void pdx_pool_unref(struct pdx_inst *i)
{
	if (--i->refs == 0)
		inst_free(i);
}

void pdx_pool_clear(struct pdx_pool *p)
{
	while (p->n) {
		struct pdx_inst *i = p->inst[--p->n];

		i->removed = true;
		pdx_pool_idle_close(i);
		pdx_pool_unref(i);
	}
}

const char *pdx_pool_role_name(enum pdx_pool_role r)
{
	return r == PDX_POOL_PREFILL ? "prefill" : "decode";
}

static const char *const policy_names[] = {
    [PDX_POLICY_ROUND_ROBIN] = "round-robin",
    [PDX_POLICY_LEAST_LOADED] = "least-loaded",
    [PDX_POLICY_PREFIX_AWARE] = "prefix-aware",
};

const char *pdx_pool_policy_name(enum pdx_pool_policy p)
{
	return policy_names[p];
}

int pdx_pool_policy_parse(const char *s, enum pdx_pool_policy *out)
{
	for (unsigned k = 0; k < sizeof(policy_names) / sizeof(*policy_names);
	     k++) {
		if (!strcmp(s, policy_names[k])) {
			*out = (enum pdx_pool_policy)k;
			return 0;
		}
	}
	return -1;
}
