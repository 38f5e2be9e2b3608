/* What the dataset builders share inside bench/ (load_dataset.c and
 * load_lmcache.c); not for other callers. */
#ifndef PDX_BENCH_LOAD_DATASET_INT_H
#define PDX_BENCH_LOAD_DATASET_INT_H

#include "bench/load_dataset.h"
#include "bench/load_rng.h"

/* Fills r with prefix ids then body ids (copied), rendered as text too
 * when text; -1 on out of memory (r may then hold a partial allocation,
 * freed with the set). */
int pdx__load_req_make(struct pdx_load_request *r, const uint32_t *prefix,
		       size_t np, const uint32_t *body, size_t nb,
		       int output_len, bool text);

/* n ids uniform in [0, vocab). */
void pdx__load_random_ids(struct pdx_load_rng *rng, uint32_t *ids, size_t n,
			  uint32_t vocab);

/* The builders of bench/load_lmcache.c; ds starts empty, and on failure
 * holds what was built so far (the caller frees it). */
int pdx__load_build_multi_round(const struct pdx_load_dataset_params *dp,
				uint32_t vocab, struct pdx_load_rng *rng,
				struct pdx_load_dataset *ds, char *err,
				size_t errlen);
int pdx__load_build_long_doc(const struct pdx_load_dataset_params *dp,
			     uint32_t vocab, struct pdx_load_rng *rng,
			     struct pdx_load_dataset *ds, char *err,
			     size_t errlen);

#endif
