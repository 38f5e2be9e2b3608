#include "bench/load_arrival.h"
#include "bench/load_rng.h"

#include <math.h>
#include <stdlib.h>

#define RNG_STREAM_ARRIVAL 2

int pdx_load_arrivals(const struct pdx_load_arrival_params *ap, double *out)
{
	struct pdx_load_rng rng;
	double theta, factor;
	size_t i;

	if (!(ap->rate > 0.0) || !(ap->burstiness > 0.0))
		return -1;
	if (ap->n == 0)
		return 0;
	if (isinf(ap->rate)) {
		for (i = 0; i < ap->n; i++)
			out[i] = 0.0;
		return 0;
	}
	pdx_load_rng_seed(&rng, ap->seed, RNG_STREAM_ARRIVAL);
	theta = 1.0 / (ap->rate * ap->burstiness);
	for (i = 0; i < ap->n; i++) {
		/* The first request waits one gap too, as in vllm. */
		out[i] = isinf(ap->burstiness)
			     ? 1.0 / ap->rate
			     : pdx_load_rng_gamma(&rng, ap->burstiness, theta);
		if (i)
			out[i] += out[i - 1];
	}
	/* Rescale so the run lasts n / rate: the raw sum of the gaps would
	 * miss it by a few percent, and differently for each seed. */
	if (out[ap->n - 1] != 0.0) {
		factor = ((double)ap->n / ap->rate) / out[ap->n - 1];
		for (i = 0; i < ap->n; i++)
			out[i] *= factor;
	}
	return 0;
}

int pdx_load_session_arrivals(const struct pdx_load_arrival_params *ap,
			      const bool *follows, double *out)
{
	struct pdx_load_arrival_params sp = *ap;
	double *starts;
	size_t i, k = 0;

	sp.n = 0;
	for (i = 0; i < ap->n; i++)
		sp.n += !(follows && i && follows[i]);
	if (sp.n == ap->n)
		return pdx_load_arrivals(ap, out);
	starts = malloc(sp.n * sizeof(*starts));
	if (!starts || pdx_load_arrivals(&sp, starts)) {
		free(starts);
		return -1;
	}
	for (i = 0; i < ap->n; i++) {
		if (!(i && follows[i]))
			k++;
		out[i] = starts[k - 1];
	}
	free(starts);
	return 0;
}
