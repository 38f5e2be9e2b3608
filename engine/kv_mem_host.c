/* A KV pool in POSIX shared memory: the synthetic model runs on the CPU,
 * and a layer is in memory when its fill returns (no events). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_mem.h"

struct kv_mem_host {
	struct pdx__kv_mem m;	 /* first */
	struct pdx_shm_pool shm; /* not copied: region points into it */
};

static struct kv_mem_host *host_of(struct pdx__kv_mem *m)
{
	return (struct kv_mem_host *)m;
}

static struct pdx_synth_seq view(struct kv_mem_host *h,
				 const struct pdx_synth_run *r)
{
	return (struct pdx_synth_seq){
	    .layout = &h->shm.layout,
	    .base = h->shm.base,
	    .blocks = r->blocks,
	    .hash = r->hash,
	    .head0 = h->m.head0,
	};
}

static pdx_status_t host_pass(struct pdx__kv_mem *m, struct pdx_synth_run *runs,
			      size_t n, uint32_t vocab, uint32_t *slot)
{
	struct kv_mem_host *h = host_of(m);
	struct pdx_synth_seq s;

	for (uint32_t l = 0; l < h->shm.layout.layers; l++) {
		for (size_t i = 0; i < n; i++) {
			if (runs[i].b <= runs[i].a)
				continue;
			s = view(h, &runs[i]);
			pdx_synth_fill(&s, l, runs[i].a, runs[i].b);
		}
	}
	for (size_t i = 0; i < n; i++) {
		if (!runs[i].want_token)
			continue;
		s = view(h, &runs[i]);
		runs[i].token = pdx_synth_next_token(&s, runs[i].b, vocab);
	}
	*slot = PDX_KV_POOL_NO_SLOT;
	return PDX_OK;
}

/* The first and last position of every block of [a, b). */
static pdx_status_t host_verify(struct pdx__kv_mem *m,
				const struct pdx_synth_run *r,
				uint64_t *mismatches, uint32_t *bad)
{
	struct kv_mem_host *h = host_of(m);
	struct pdx_synth_seq s = view(h, r);
	uint32_t bt = h->shm.layout.block_tokens;

	for (uint32_t a = r->a; a < r->b; a = (a / bt + 1) * bt) {
		uint32_t end = (a / bt + 1) * bt;

		if (end > r->b)
			end = r->b;
		if (!pdx_synth_probe(&s, a, a + 1, bad) ||
		    !pdx_synth_probe(&s, end - 1, end, bad)) {
			*mismatches = 1;
			return PDX_OK;
		}
	}
	*mismatches = 0;
	*bad = UINT32_MAX;
	return PDX_OK;
}

static void host_free(struct pdx__kv_mem *m)
{
	struct kv_mem_host *h = host_of(m);

	pdx_shm_pool_destroy(&h->shm);
	free(h);
}

static const struct pdx__kv_mem_ops host_ops = {
    .pass = host_pass,
    .verify = host_verify,
    .free = host_free,
};

pdx_status_t pdx__kv_mem_host_new(const struct pdx_kv_pool_params *p,
				  struct pdx__kv_mem **out, char *err,
				  size_t errlen)
{
	struct kv_mem_host *h = calloc(1, sizeof(*h));
	pdx_status_t st;

	if (!h) {
		snprintf(err, errlen, "out of memory");
		return PDX_ENOMEM;
	}
	st = pdx_shm_pool_create(&h->shm, p->shm_name, p->model, p->blocks, err,
				 errlen);
	if (st != PDX_OK)
		goto free_h;
	st = pdx_synth_layout_check(&h->shm.layout);
	if (st != PDX_OK) {
		snprintf(err, errlen,
			 "model %s: a shape the synthetic model cannot fill",
			 p->model->name);
		goto destroy_shm;
	}
	if (p->prefault)
		memset(h->shm.base, 0, h->shm.size);
	h->m = (struct pdx__kv_mem){
	    .ops = &host_ops,
	    .layout = &h->shm.layout,
	    .region = &h->shm.region,
	    .shm = &h->shm,
	    .size = h->shm.size,
	};
	snprintf(h->m.where, sizeof(h->m.where), "/dev/shm%s", h->shm.name);
	*out = &h->m;
	return PDX_OK;
destroy_shm:
	pdx_shm_pool_destroy(&h->shm);
free_h:
	free(h);
	return st;
}
