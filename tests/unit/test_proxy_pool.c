/* The proxy's picking policies (proxy/pool.c): least-loaded counts
 * transfers beside requests; prefix-aware keeps a prefix on one instance,
 * spreads different prefixes, yields to load, and moves only the removed
 * instance's prefixes; a request naming a model passes over instances
 * known to serve others (proxy/served_models.c reads their lists). */
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/fnv.h"
#include "proxy/pool.h"
#include "tests/check.h"

#define N 4
#define KEYS 4000

static void pool_init(struct pdx_pool *p, enum pdx_pool_policy policy)
{
	char err[128], addr[32];

	memset(p, 0, sizeof(*p));
	p->policy = policy;
	for (int k = 0; k < N; k++) {
		snprintf(addr, sizeof(addr), "127.0.0.1:%d", 9000 + k);
		CHECK_EQ(pdx_pool_add(p, addr, err, sizeof(err)), 0);
	}
}

static uint64_t key_of(unsigned k)
{
	char s[32];

	snprintf(s, sizeof(s), "prompt prefix %u", k);
	return pdx_fnv1a64(PDX_FNV1A64_INIT, s, strlen(s));
}

/* Picks and at once gives back: a pick on an idle pool. */
static struct pdx_inst *pick_idle(struct pdx_pool *p, uint64_t key)
{
	struct pdx_inst *i = pdx_pool_pick(p, key, NULL, NULL, true);

	pdx_pool_put(i);
	return i;
}

static struct pdx_inst *pick_model(struct pdx_pool *p, const char *model)
{
	struct pdx_inst *i = pdx_pool_pick(p, 0, NULL, model, true);

	pdx_pool_put(i);
	return i;
}

static void least_loaded(void)
{
	struct pdx_pool p;
	struct pdx_inst *i;

	pool_init(&p, PDX_POLICY_LEAST_LOADED);
	p.inst[0]->inflight = 1;
	p.inst[1]->xfers = 2; /* a prefill still sending two requests' KV */
	p.inst[2]->inflight = 1;
	p.inst[2]->xfers = 1;
	i = pick_idle(&p, 0);
	CHECK(i == p.inst[3]);
	p.inst[3]->xfers = 3;
	CHECK_EQ(pdx_pool_load(p.inst[3]), 3);
	i = pick_idle(&p, 0);
	CHECK(i == p.inst[0]); /* load 1, the only one */
	p.inst[0]->inflight = 0;
	pdx_pool_clear(&p);
}

static void prefix_aware(void)
{
	struct pdx_pool p;
	struct pdx_inst *first[KEYS], *i;
	unsigned per[N] = {0}, moved = 0, lost = 0;
	uint16_t port[KEYS];

	pool_init(&p, PDX_POLICY_PREFIX_AWARE);
	for (unsigned k = 0; k < KEYS; k++) {
		first[k] = pick_idle(&p, key_of(k));
		CHECK(pick_idle(&p, key_of(k)) == first[k]); /* stable */
		port[k] = first[k]->port;
		for (int j = 0; j < N; j++)
			per[j] += first[k] == p.inst[j];
	}
	for (int j = 0; j < N; j++) /* spread: each near a quarter */
		CHECK(per[j] > KEYS / N * 8 / 10 && per[j] < KEYS / N * 12 / 10);

	/* a prefix's instance keeps it up to the slack, then yields */
	i = first[0];
	i->inflight = PDX_POOL_PREFIX_SLACK;
	CHECK(pick_idle(&p, key_of(0)) == i);
	i->inflight = PDX_POOL_PREFIX_SLACK + 1;
	CHECK(pick_idle(&p, key_of(0)) != i);
	i->inflight = 0;

	/* removing an instance moves its prefixes only */
	CHECK_EQ(pdx_pool_remove(&p, "127.0.0.1:9001"), 0);
	for (unsigned k = 0; k < KEYS; k++) {
		i = pick_idle(&p, key_of(k));
		if (port[k] == 9001)
			lost++;
		else if (i->port != port[k])
			moved++;
	}
	CHECK(lost > 0);
	CHECK_EQ(moved, 0);
	pdx_pool_clear(&p);
}

static void policy_names(void)
{
	enum pdx_pool_policy p;

	CHECK_EQ(pdx_pool_policy_parse("prefix-aware", &p), 0);
	CHECK_EQ(p, PDX_POLICY_PREFIX_AWARE);
	CHECK(!strcmp(pdx_pool_policy_name(p), "prefix-aware"));
	CHECK_EQ(pdx_pool_policy_parse("least-loaded", &p), 0);
	CHECK_EQ(p, PDX_POLICY_LEAST_LOADED);
	CHECK_EQ(pdx_pool_policy_parse("random", &p), -1);
}

/* An engine's HTTP address and nothing else: an agent's tcp:// address
 * was taken as the host "tcp://H" (requests got 502), and a host with a
 * CR LF, a quote or a space (from the admin API: any client with the
 * token) split or broke the /metrics page it is a label of. */
static void addresses(void)
{
	static const struct {
		const char *s, *host;
		uint16_t port;
	} ok[] = {
	    {"h:1", "h", 1},
	    {"http://10.0.0.1:8100", "10.0.0.1", 8100},
	    {"http://h:8100/", "h", 8100},
	    {"[::1]:8100", "::1", 8100},
	    {"[::1]:8000", "::1", 8000},
	    {"http://[fe80::1%eth0]:8000/", "fe80::1%eth0", 8000},
	    {"[::ffff:10.0.0.1]:80", "::ffff:10.0.0.1", 80},
	    {"decode-0.decode_svc.ns.svc.cluster.local:8000",
	     "decode-0.decode_svc.ns.svc.cluster.local", 8000},
	    {"Engine-A_1:9", "Engine-A_1", 9},
	};
	static const char *const bad[] = {
	    "tcp://10.0.0.1:7100", "https://h:443", "ipc:///tmp/x:1",
	    "h/x:1", "http://h:1/v1", "h", "h:0", "h:65536", ":1",
	    "http://a\r\nX: y:1", "a\nb:1", "a b:1", "a\"b:1", "a'b:1",
	    "a{b}:1", "a\\b:1", "a\tb:1", "a=b:1", "a,b:1", "a@b:1",
	    "[::1\r\n]:1", "[::1 ]:1", "::1:8000", "a\x7f:1", "\xc3\xa9:1",
	};
	char host[64], err[160];
	uint16_t port;

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		CHECK_EQ(pdx_pool_addr_parse(ok[i].s, host, sizeof(host), &port,
					     err, sizeof(err)), 0, "%s", ok[i].s);
		CHECK(!strcmp(host, ok[i].host) && port == ok[i].port,
		      "%s: %s %u", ok[i].s, host, port);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CHECK_EQ(pdx_pool_addr_parse(bad[i], host, sizeof(host), &port,
					     err, sizeof(err)), -1, "%s", bad[i]);
		CHECK(strstr(err, "want HOST:PORT") != NULL, "%s", err);
	}
}

/* An instance of another model is passed over, however idle, unless
 * nothing else is left; lists that cannot be kept take any name. */
static void by_model(void)
{
	static const char tiny[] = "{\"object\": \"list\", \"data\": "
				   "[{\"id\": \"tiny\"}, {\"id\": \"t2\"}]}";
	static const char other[] = "{\"data\": [{\"id\": \"qwen2-7b\"}]}";
	char nine[512] = "{\"data\": [", many[600];
	struct pdx_served_models m = {0};
	struct pdx_pool p;
	struct pdx_inst *i;

	pdx_served_models_read(&m, tiny, strlen(tiny));
	CHECK(m.known && !m.any && m.n == 2);
	CHECK(pdx_served_models_take(&m, "t2") &&
	      pdx_served_models_take(&m, NULL) &&
	      !pdx_served_models_take(&m, "tin"));
	for (int k = 0; k < 9; k++)
		snprintf(nine + strlen(nine), sizeof(nine) - strlen(nine),
			 "%s{\"id\": \"m%d\"}", k ? ", " : "", k);
	snprintf(many, sizeof(many), "%s]}", nine);
	const char *bad[] = {"", "{}", "[1]", "{\"data\": []}",
			     "{\"data\": [{\"id\": 1}]}", many};

	for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
		pdx_served_models_read(&m, bad[k], strlen(bad[k]));
		CHECK(m.known && m.any && pdx_served_models_take(&m, "x"),
		      "%s", bad[k]);
	}

	pool_init(&p, PDX_POLICY_LEAST_LOADED);
	for (int k = 0; k < N; k++)
		pdx_served_models_read(&p.inst[k]->models, k ? tiny : other,
				       strlen(k ? tiny : other));
	/* the proxy's GET /v1/models: each model once, as first given */
	json_t *list = json_array();

	for (int k = 0; k < N; k++)
		CHECK(pdx_served_models_merge(&p.inst[k]->models, list));
	CHECK(json_array_size(list) == 3 &&
	      !strcmp(json_string_value(json_object_get(
			  json_array_get(list, 2), "id")), "t2"));
	CHECK(!pdx_served_models_merge(&m, list)); /* any: no list */
	json_decref(list);
	p.inst[1]->inflight = p.inst[2]->inflight = p.inst[3]->inflight = 5;
	for (int k = 0; k < 8; k++) {
		i = pick_model(&p, "tiny");
		CHECK(i != p.inst[0], "an idle instance of another model picked");
	}
	CHECK(pick_model(&p, "qwen2-7b") == p.inst[0]);
	CHECK(pick_model(&p, NULL) == p.inst[0]); /* no model: load alone */
	/* a retry after the one instance of the model failed: none, not
	 * another model's (whose 404 the client got for the 5xx) */
	CHECK(!pdx_pool_pick(&p, 0, p.inst[0], "qwen2-7b", true));
	CHECK(!pdx_pool_has_usable(&p, p.inst[0], "qwen2-7b", true));
	p.inst[0]->unhealthy = true; /* its failure opened its breaker */
	CHECK(!pdx_pool_pick(&p, 0, p.inst[0], "qwen2-7b", true));
	CHECK(!pdx_pool_has_usable(&p, p.inst[0], "qwen2-7b", true));
	p.inst[0]->unhealthy = false;
	CHECK(pdx_pool_has_usable(&p, p.inst[0], "tiny", true));
	CHECK(pdx_pool_has_usable(&p, p.inst[0], NULL, true));
	/* nobody serves it: any (its engine says 404), or none (a prefill
	 * pick beside a decode instance that serves it) */
	i = pick_model(&p, "llama3-8b");
	CHECK(i != NULL);
	CHECK(!pdx_pool_pick(&p, 0, NULL, "llama3-8b", false));
	CHECK(pdx_served_models_take_known(&p.inst[1]->models, "tiny") &&
	      !pdx_served_models_take_known(&p.inst[1]->models, NULL) &&
	      !pdx_served_models_take_known(&p.inst[1]->models, "qwen2-7b"));
	p.inst[2]->models.known = false; /* not asked yet: may serve it */
	CHECK(pick_model(&p, "qwen2-7b") == p.inst[0]);
	p.inst[0]->unhealthy = true;
	CHECK(pick_model(&p, "qwen2-7b") == p.inst[2]);
	p.inst[2]->models.known = true;
	/* its one instance down, its list forgotten (a failed check): none
	 * (503 naming the model), not another model's instance (whose
	 * engine answered 404) */
	p.inst[0]->models.known = false;
	CHECK(!pick_model(&p, "qwen2-7b"));
	CHECK(!pdx_pool_has_usable(&p, NULL, "qwen2-7b", true));
	p.inst[0]->unhealthy = false;
	p.inst[0]->models.known = true;
	/* ... or its breaker's trial under way: it takes the request */
	p.inst[0]->breaker.failures = 1;
	p.inst[0]->breaker.open_ns = 1;
	CHECK(pdx_breaker_result(&p.inst[0]->breaker, false, pdx_now_ns()));
	p.inst[0]->breaker.open_ns = 60000000000ULL;
	CHECK(pdx_pool_pick(&p, 0, NULL, "qwen2-7b", true) == p.inst[0]);
	pdx_pool_put(p.inst[0]);
	CHECK(pdx_breaker_on_trial(&p.inst[0]->breaker, pdx_now_ns()));
	CHECK(pick_model(&p, "qwen2-7b") == p.inst[0],
	      "the model's one instance on trial: it, not another model's");
	CHECK(pdx_breaker_result(&p.inst[0]->breaker, true, pdx_now_ns()));
	pdx_pool_clear(&p);
}

/* An instance whose breaker's trial is under way takes no other request
 * while another may; where none other may, it does (a prefill instance's
 * trial lasts a whole generation when not streamed: a rolling restart's
 * clients got 503 "no usable prefill instance" meanwhile). */
static void trial_under_way(void)
{
	struct pdx_pool p;
	struct pdx_inst *trial;

	pool_init(&p, PDX_POLICY_LEAST_LOADED);
	trial = p.inst[0];
	trial->breaker.failures = 1;
	trial->breaker.open_ns = 1; /* a trial may go at once */
	CHECK(pdx_breaker_result(&trial->breaker, false, pdx_now_ns()));
	trial->breaker.open_ns = 60000000000ULL;
	p.inst[2]->unhealthy = p.inst[3]->unhealthy = true;
	p.inst[1]->inflight = 5;
	CHECK(pdx_pool_pick(&p, 0, NULL, NULL, true) == trial,
	      "the first pick past the open time is the trial");
	CHECK(pdx_breaker_on_trial(&trial->breaker, pdx_now_ns()));
	for (int k = 0; k < 4; k++)
		CHECK(pick_idle(&p, 0) == p.inst[1],
		      "while another instance may take requests, the one on trial takes none");
	p.inst[1]->unhealthy = true;
	CHECK(pick_idle(&p, 0) == trial,
	      "with no other, the one on trial takes them too");
	CHECK(pdx_pool_has_usable(&p, NULL, NULL, true));
	CHECK(!pdx_pool_pick(&p, 0, trial, NULL, true),
	      "but not a retry of its own failure");
	p.no_trial_joining = true; /* prefill under --on-prefill-failure local */
	CHECK(!pdx_pool_pick(&p, 0, NULL, NULL, true) &&
	      !pdx_pool_has_usable(&p, NULL, NULL, true),
	      "nor where the pool has somewhere better to send it (D prefills)");
	p.no_trial_joining = false;
	trial->unhealthy = true;
	CHECK(!pdx_pool_has_usable(&p, NULL, NULL, true),
	      "nor once its health checks fail");
	trial->unhealthy = false;
	CHECK(pdx_breaker_result(&trial->breaker, true, pdx_now_ns()) &&
	      trial->breaker.state == PDX_BREAKER_CLOSED);
	pdx_pool_put(trial);
	pdx_pool_clear(&p);
}

int main(void)
{
	addresses();
	by_model();
	least_loaded();
	prefix_aware();
	policy_names();
	trial_under_way();
	CHECK_DONE();
}
