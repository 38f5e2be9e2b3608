/* The circuit breaker's state machine (see breaker.h). */
#include "proxy/breaker.h"

static void enter(struct pdx_breaker *b, enum pdx_breaker_state s,
		  uint64_t until)
{
	b->state = s;
	b->until_ns = until;
	b->fails = 0;
	b->check_failed = false;
	b->entered[s]++;
}

bool pdx_breaker_usable(const struct pdx_breaker *b, uint64_t now)
{
	return b->state == PDX_BREAKER_CLOSED || now >= b->until_ns;
}

bool pdx_breaker_on_trial(const struct pdx_breaker *b, uint64_t now)
{
	return b->state == PDX_BREAKER_HALF_OPEN && now < b->until_ns;
}

void pdx_breaker_admit(struct pdx_breaker *b, uint64_t now)
{
	if (b->state != PDX_BREAKER_CLOSED && now >= b->until_ns)
		enter(b, PDX_BREAKER_HALF_OPEN, now + b->open_ns);
}

bool pdx_breaker_checked(struct pdx_breaker *b, bool ok, uint64_t sent_ns,
			 uint64_t now)
{
	/* open, until_ns is when it opened plus open_ns: a check sent
	 * before then says nothing of what came after */
	if (b->state != PDX_BREAKER_OPEN || now >= b->until_ns ||
	    b->until_ns - b->open_ns > sent_ns)
		return false;
	if (!ok) {
		b->check_failed = true;
		return false;
	}
	if (!b->check_failed)
		return false;
	b->until_ns = now;
	return true;
}

bool pdx_breaker_result(struct pdx_breaker *b, bool ok, uint64_t now)
{
	switch (b->state) {
	case PDX_BREAKER_CLOSED:
		if (ok) {
			b->fails = 0;
			return false;
		}
		if (!b->failures || ++b->fails < b->failures)
			return false;
		enter(b, PDX_BREAKER_OPEN, now + b->open_ns);
		return true;
	case PDX_BREAKER_HALF_OPEN:
		if (ok)
			enter(b, PDX_BREAKER_CLOSED, 0);
		else
			enter(b, PDX_BREAKER_OPEN, now + b->open_ns);
		return true;
	default: /* open: a request sent before it opened */
		return false;
	}
}

const char *pdx_breaker_state_name(enum pdx_breaker_state s)
{
	static const char *const names[PDX_BREAKER_STATES] = {"closed", "open",
							      "half-open"};

	return names[s];
}
