#include "engine/tp_slice.h"

#include "common/errbuf.h"

int pdx_tp_slice(const struct pdx_model *m, uint32_t size, uint32_t rank,
		 struct pdx_tp_slice *out, char *err, size_t errlen)
{
	if (size == 0 || size > PDX_TP_MAX || (size & (size - 1))) {
		pdx_errbuf_set(err, errlen,
			       "tensor-parallel size %u: want a power of two "
			       "in [1, %u]",
			       size, PDX_TP_MAX);
		return -1;
	}
	if (rank >= size) {
		pdx_errbuf_set(err, errlen,
			       "tensor-parallel rank %u: want one below the "
			       "size, %u",
			       rank, size);
		return -1;
	}
	out->model = *m;
	if (m->tensors == 1) { /* MLA: the latent is replicated */
		out->head0 = 0;
		out->heads = m->kv_heads;
		return 0;
	}
	if (m->kv_heads % size) {
		pdx_errbuf_set(err, errlen,
			       "model %s has %u KV heads: they do not split "
			       "evenly over %u tensor-parallel ranks",
			       m->name, m->kv_heads, size);
		return -1;
	}
	out->heads = m->kv_heads / size;
	out->head0 = rank * out->heads;
	out->model.kv_heads = out->heads;
	return 0;
}
