/* When each request of a run should be sent, as vllm bench serve's
 * get_request() decides it: gaps drawn from a gamma distribution of shape
 * 'burstiness' and mean 1/rate (burstiness 1: a Poisson process), summed,
 * then rescaled so that the last request arrives at exactly n / rate
 * seconds. rate = inf: all at time 0; burstiness = inf: even gaps of
 * 1/rate. Pure and deterministic for a seed. */
#ifndef PDX_BENCH_LOAD_ARRIVAL_H
#define PDX_BENCH_LOAD_ARRIVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pdx_load_arrival_params {
	size_t n;
	double rate;	   /* requests per second, > 0; INFINITY allowed */
	double burstiness; /* gamma shape, > 0; INFINITY allowed */
	uint64_t seed;
};

/* Writes n offsets in seconds from the start of the run, non-decreasing,
 * into out. Returns -1 (nothing written) on rate or burstiness <= 0 or
 * NaN. */
int pdx_load_arrivals(const struct pdx_load_arrival_params *ap, double *out);

/* The same for requests in sessions (multi-round chats): request i with
 * follows[i] set belongs to the session of request i - 1. One arrival is
 * drawn per session, as pdx_load_arrivals() would draw it for that many
 * requests, and every request of the session gets it (the run sends a
 * later round once the one before has ended); follows[0] is ignored.
 * follows NULL, or no follower: exactly pdx_load_arrivals(). -1 also on
 * out of memory. */
int pdx_load_session_arrivals(const struct pdx_load_arrival_params *ap,
			      const bool *follows, double *out);

#endif
