/* The proxy's circuit breaker (proxy/breaker.c) and what the pools make
 * of it and of health checks (proxy/pool.c): failures in a row open it,
 * one trial goes after the open time, its result closes or reopens it, a
 * lost trial does not wedge it, health checks that saw the instance go
 * and come back after it opened let the trial go at once; picks skip unhealthy instances and open
 * breakers, and avoid the instance a retry names. */
#include <stdio.h>
#include <string.h>

#include "proxy/breaker.h"
#include "proxy/pool.h"
#include "tests/check.h"

#define MS 1000000ull

static struct pdx_breaker breaker(unsigned failures)
{
	return (struct pdx_breaker){.failures = failures, .open_ns = 100 * MS};
}

static void opens_after_failures_in_a_row(void)
{
	struct pdx_breaker b = breaker(3);
	uint64_t t = 1000 * MS;

	CHECK(!pdx_breaker_result(&b, false, t));
	CHECK(!pdx_breaker_result(&b, false, t));
	CHECK(!pdx_breaker_result(&b, true, t)); /* a success resets */
	CHECK(!pdx_breaker_result(&b, false, t));
	CHECK(!pdx_breaker_result(&b, false, t));
	CHECK(pdx_breaker_usable(&b, t));
	CHECK(pdx_breaker_result(&b, false, t));
	CHECK_EQ(b.state, PDX_BREAKER_OPEN);
	CHECK_EQ(b.entered[PDX_BREAKER_OPEN], 1);
	CHECK(!pdx_breaker_usable(&b, t));
	CHECK(!pdx_breaker_usable(&b, t + 99 * MS));
	/* a result of a request sent before it opened changes nothing */
	CHECK(!pdx_breaker_result(&b, true, t + 1));
	CHECK_EQ(b.state, PDX_BREAKER_OPEN);
}

static void trial_closes_or_reopens(void)
{
	struct pdx_breaker b = breaker(1);
	uint64_t t = 1000 * MS;

	CHECK(pdx_breaker_result(&b, false, t));
	CHECK(pdx_breaker_usable(&b, t + 100 * MS));
	pdx_breaker_admit(&b, t + 100 * MS); /* the trial */
	CHECK_EQ(b.state, PDX_BREAKER_HALF_OPEN);
	CHECK(!pdx_breaker_usable(&b, t + 101 * MS)); /* one at a time */
	CHECK(pdx_breaker_result(&b, false, t + 150 * MS));
	CHECK_EQ(b.state, PDX_BREAKER_OPEN); /* open again, from now */
	CHECK(!pdx_breaker_usable(&b, t + 249 * MS));
	CHECK(pdx_breaker_usable(&b, t + 250 * MS));
	pdx_breaker_admit(&b, t + 250 * MS);
	CHECK(pdx_breaker_result(&b, true, t + 260 * MS));
	CHECK_EQ(b.state, PDX_BREAKER_CLOSED);
	CHECK(pdx_breaker_usable(&b, t + 260 * MS));
	CHECK_EQ(b.entered[PDX_BREAKER_OPEN], 2);
	CHECK_EQ(b.entered[PDX_BREAKER_HALF_OPEN], 2);
	CHECK_EQ(b.entered[PDX_BREAKER_CLOSED], 1);
	/* admitting while closed changes nothing */
	pdx_breaker_admit(&b, t + 270 * MS);
	CHECK_EQ(b.state, PDX_BREAKER_CLOSED);
}

static void lost_trial_does_not_wedge(void)
{
	struct pdx_breaker b = breaker(1);
	uint64_t t = 1000 * MS;

	pdx_breaker_result(&b, false, t);
	pdx_breaker_admit(&b, t + 100 * MS); /* its result never comes */
	CHECK(!pdx_breaker_usable(&b, t + 199 * MS));
	CHECK(pdx_breaker_usable(&b, t + 200 * MS)); /* another trial */
}

static void checks_that_saw_it_back_let_trial_go(void)
{
	struct pdx_breaker b = breaker(1);
	uint64_t t = 1000 * MS;

	CHECK(!pdx_breaker_checked(&b, false, t, t)); /* closed */
	CHECK(!pdx_breaker_checked(&b, true, t, t));
	CHECK(pdx_breaker_result(&b, false, t));
	/* checks sent before it opened say nothing of what came after */
	CHECK(!pdx_breaker_checked(&b, false, t - 1, t + 1 * MS));
	CHECK(!pdx_breaker_checked(&b, true, t - 1, t + 2 * MS));
	/* one that only passes says nothing of what opened it */
	CHECK(!pdx_breaker_checked(&b, true, t + 3 * MS, t + 4 * MS));
	CHECK(!pdx_breaker_usable(&b, t + 4 * MS));
	/* gone, then back */
	CHECK(!pdx_breaker_checked(&b, false, t + 5 * MS, t + 6 * MS));
	CHECK(!pdx_breaker_usable(&b, t + 6 * MS));
	CHECK(pdx_breaker_checked(&b, true, t + 7 * MS, t + 10 * MS));
	CHECK(pdx_breaker_usable(&b, t + 10 * MS));
	CHECK_EQ(b.state, PDX_BREAKER_OPEN);
	pdx_breaker_admit(&b, t + 10 * MS); /* the trial */
	CHECK_EQ(b.state, PDX_BREAKER_HALF_OPEN);
	/* half-open: the trial decides, not the checks */
	CHECK(!pdx_breaker_checked(&b, false, t + 20 * MS, t + 20 * MS));
	CHECK(!pdx_breaker_checked(&b, true, t + 21 * MS, t + 21 * MS));
	CHECK(!pdx_breaker_usable(&b, t + 21 * MS));
	/* the trial failed: open again, and the checks start afresh */
	CHECK(pdx_breaker_result(&b, false, t + 30 * MS));
	CHECK_EQ(b.state, PDX_BREAKER_OPEN);
	CHECK(!pdx_breaker_checked(&b, true, t + 40 * MS, t + 41 * MS));
	CHECK(!pdx_breaker_usable(&b, t + 41 * MS));
	CHECK(!pdx_breaker_checked(&b, false, t + 42 * MS, t + 43 * MS));
	CHECK(pdx_breaker_checked(&b, true, t + 44 * MS, t + 45 * MS));
	CHECK(pdx_breaker_usable(&b, t + 45 * MS));
}

static void off_never_opens(void)
{
	struct pdx_breaker b = breaker(0);

	for (int k = 0; k < 100; k++)
		CHECK(!pdx_breaker_result(&b, false, 1));
	CHECK(pdx_breaker_usable(&b, 1));
}

static void pool_init(struct pdx_pool *p)
{
	char err[128], addr[32];

	memset(p, 0, sizeof(*p));
	p->breaker_failures = 2;
	p->breaker_open_ns = 3600000 * MS; /* stays open through the test */
	for (int k = 0; k < 3; k++) {
		snprintf(addr, sizeof(addr), "127.0.0.1:%d", 9000 + k);
		CHECK_EQ(pdx_pool_add(p, addr, err, sizeof(err)), 0);
	}
}

static struct pdx_inst *pick(struct pdx_pool *p, const struct pdx_inst *avoid)
{
	struct pdx_inst *i = pdx_pool_pick(p, 0, avoid, NULL, true);

	pdx_pool_put(i);
	return i;
}

static void picks_usable_only(void)
{
	struct pdx_pool p;
	struct pdx_inst *a, *b, *c;

	pool_init(&p);
	a = p.inst[0];
	b = p.inst[1];
	c = p.inst[2];
	/* unhealthy after 2 failed checks, back after 3 passed */
	CHECK(!pdx_pool_health(a, false, 2, 3));
	CHECK(pdx_pool_health(a, false, 2, 3));
	CHECK(a->unhealthy);
	CHECK(!pdx_pool_health(a, true, 2, 3));
	CHECK(!pdx_pool_health(a, false, 2, 3)); /* the passes start over */
	CHECK(!pdx_pool_health(a, true, 2, 3));
	CHECK(!pdx_pool_health(a, true, 2, 3));
	CHECK(a->unhealthy);
	for (int k = 0; k < 6; k++)
		CHECK(pick(&p, NULL) != a);
	/* b's breaker opens after 2 failed requests */
	CHECK(!pdx_pool_result(b, false));
	CHECK(pdx_pool_result(b, false));
	CHECK_EQ(b->failures, 2);
	for (int k = 0; k < 6; k++)
		CHECK(pick(&p, NULL) == c);
	CHECK(pdx_pool_has_usable(&p, NULL, NULL, true));
	CHECK(!pdx_pool_has_usable(&p, c, NULL, true)); /* a retry has nowhere to go */
	CHECK(pick(&p, c) == NULL);
	CHECK(pdx_pool_health(a, true, 2, 3)); /* re-admitted */
	CHECK(pick(&p, c) == a);
	p.policy = PDX_POLICY_LEAST_LOADED;
	c->inflight = 5;
	CHECK(pick(&p, NULL) == a);
	CHECK(pick(&p, a) == c); /* avoided, even though less loaded */
	c->inflight = 0;
	pdx_pool_clear(&p);
}

int main(void)
{
	opens_after_failures_in_a_row();
	trial_closes_or_reopens();
	checks_that_saw_it_back_let_trial_go();
	lost_trial_does_not_wedge();
	off_never_opens();
	picks_usable_only();
	CHECK_DONE();
}
