#include "bench/load_abort.h"
#include "bench/load_rng.h"

#include <math.h>

#define RNG_STREAM_ABORT 3

int pdx_load_aborts(const struct pdx_load_abort_params *p, double *out)
{
	struct pdx_load_rng rng;
	double pick, delay;
	size_t i;

	if (!(p->fraction >= 0.0 && p->fraction <= 1.0) ||
	    !(p->within_s >= 0.0) || isinf(p->within_s))
		return -1;
	pdx_load_rng_seed(&rng, p->seed, RNG_STREAM_ABORT);
	for (i = 0; i < p->n; i++) {
		pick = pdx_load_rng_double(&rng);
		/* [0, 1) scaled onto [0, within]: the upper end is reached
		 * only in the limit, which a timer cannot tell apart. */
		delay = pdx_load_rng_double(&rng) * p->within_s;
		out[i] = pick < p->fraction ? delay : -1.0;
	}
	return 0;
}
