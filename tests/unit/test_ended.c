/* agent/ended.c: recently ended transfers, found by id and peer, the
 * oldest evicted when full, an id added twice kept once. */
#include <string.h>

#include "agent/ended.h"
#include "tests/check.h"

static struct pdx_xfer_id id_of(uint8_t n)
{
	struct pdx_xfer_id id;

	memset(id.b, 0, sizeof(id.b));
	id.b[0] = n;
	id.b[15] = (uint8_t)(n * 7);
	return id;
}

int main(void)
{
	struct pdx_ended *s = pdx_ended_new(3);
	struct pdx_xfer_id a = id_of(1), b = id_of(2), c = id_of(3), d = id_of(4);
	const char *why;

	CHECK(s != NULL);
	CHECK(pdx_ended_new(0) == NULL);
	CHECK(pdx_ended_find(s, &a, "tcp://p:1") == NULL);
	pdx_ended_add(s, &a, "tcp://p:1", "lease expired");
	why = pdx_ended_find(s, &a, "tcp://p:1");
	CHECK(why && strcmp(why, "lease expired") == 0);
	/* only for the peer it was with; NULL: any */
	CHECK(pdx_ended_find(s, &a, "tcp://rogue:1") == NULL);
	CHECK(pdx_ended_find(s, &a, NULL) == why);
	/* an open one nobody claimed: anyone's */
	pdx_ended_add(s, &c, "", "no agent claimed it");
	CHECK(pdx_ended_find(s, &c, "tcp://late:1") != NULL);

	/* added again: updated in place, nothing evicted */
	pdx_ended_add(s, &a, "tcp://p:1", "it completed");
	pdx_ended_add(s, &b, "tcp://p:1", "b");
	pdx_ended_add(s, &c, "tcp://p:1", "c");
	why = pdx_ended_find(s, &a, "tcp://p:1");
	CHECK(why && strcmp(why, "it completed") == 0);

	/* full: the oldest slot (a) makes room for d, the ring goes on */
	pdx_ended_add(s, &d, "tcp://p:1", "d");
	CHECK(pdx_ended_find(s, &a, "tcp://p:1") == NULL);
	CHECK(pdx_ended_find(s, &b, "tcp://p:1") != NULL);
	CHECK(pdx_ended_find(s, &d, "tcp://p:1") != NULL);
	for (uint8_t i = 10; i < 100; i++) {
		struct pdx_xfer_id x = id_of(i);

		pdx_ended_add(s, &x, "tcp://p:1", "many");
		CHECK(pdx_ended_find(s, &x, "tcp://p:1") != NULL);
	}
	CHECK(pdx_ended_find(s, &d, "tcp://p:1") == NULL);
	{
		struct pdx_xfer_id last = id_of(97);

		CHECK(pdx_ended_find(s, &last, "tcp://p:1") != NULL);
	}
	pdx_ended_free(s);
	pdx_ended_free(NULL);
	CHECK_DONE();
}
