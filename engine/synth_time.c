/* The roofline of synth_time.h. Defaults: NVIDIA H100 SXM5 datasheet,
 * 989 TFLOP/s dense BF16 and 3.35 TB/s HBM3; a prefill reaches about half
 * the peak FLOPs and a decode step about 70% of the bandwidth, the figures
 * commonly measured for vLLM and SGLang on that GPU. */
#include "engine/synth_time.h"

#define H100_FLOPS 989e12
#define H100_MEM_BW 3.35e12
#define PREFILL_FLOPS_EFF 0.5
#define DECODE_MEM_EFF 0.7

void pdx_synth_work_prefill(struct pdx_synth_work *w, uint64_t cached,
			    uint64_t n)
{
	/* causal: new token i attends to cached + i + 1 keys */
	w->tokens += n;
	w->attn_pairs += n * cached + n * (n + 1) / 2;
	w->kv_tokens += cached + n;
}

void pdx_synth_work_decode(struct pdx_synth_work *w, uint64_t context)
{
	w->tokens += 1;
	w->attn_pairs += context;
	w->kv_tokens += context;
}

static double or_default(double v, double def)
{
	return v > 0 ? v : def;
}

uint64_t pdx_synth_step_ns(const struct pdx_model *m,
			   const struct pdx_synth_gpu *g,
			   const struct pdx_synth_work *w)
{
	const struct pdx_synth_gpu none = { 0 };
	double kv_per_token, weights, flops, bytes, t_flops, t_bytes, t;

	if (!g)
		g = &none;
	if (w->tokens == 0)
		return 0;
	kv_per_token = (double)m->layers * m->tensors * m->kv_heads *
		       m->head_dim * m->dtype_bytes;
	/* a mixture of experts runs and reads only the routed experts: a
	 * batch whose tokens route apart reads more, so bytes are a floor */
	weights = (double)(m->active ? m->active : m->params);
	flops = 2.0 * weights * w->tokens +
		4.0 * m->hidden * m->layers * w->attn_pairs;
	bytes = weights * m->dtype_bytes +
		kv_per_token * w->kv_tokens;
	t_flops = flops / (or_default(g->flops, H100_FLOPS) *
			   or_default(g->flops_eff, PREFILL_FLOPS_EFF));
	t_bytes = bytes / (or_default(g->mem_bw, H100_MEM_BW) *
			   or_default(g->mem_eff, DECODE_MEM_EFF));
	t = (t_flops > t_bytes ? t_flops : t_bytes) * or_default(g->scale, 1);
	return (uint64_t)(t * 1e9 + 0.5);
}
