#include "engine/metrics.h"

#include <stdio.h>

#include "common/prom.h"

/* Upper bounds in seconds: 1 ms to 20 s, as vLLM's TTFT buckets span. */
static const double ttft_bounds[PDX_METRICS_TTFT_BUCKETS] = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
    0.25,  0.5,	  0.75, 1.0,  2.5,  5.0,  10.0, 20.0,
};

void pdx_metrics_ttft(struct pdx_engine_metrics *m, double seconds)
{
	int i;

	for (i = 0; i < PDX_METRICS_TTFT_BUCKETS; i++) {
		if (seconds <= ttft_bounds[i])
			break;
	}
	if (i < PDX_METRICS_TTFT_BUCKETS)
		m->ttft_count[i]++;
	else
		m->ttft_inf++;
	m->ttft_n++;
	m->ttft_sum += seconds;
}

/* One metric family with one sample: HELP, TYPE, value. */
static int family(struct evbuffer *out, const char *name, const char *type,
		  const char *help, const char *model, unsigned long long v)
{
	return evbuffer_add_printf(out,
				   "# HELP %s %s\n# TYPE %s %s\n"
				   "%s{model_name=\"%s\"} %llu\n",
				   name, help, name, type, name, model, v) < 0;
}

static int ttft_family(const struct pdx_engine_metrics *m, const char *model,
		       struct evbuffer *out)
{
	static const char name[] = "pdx_engine_time_to_first_token_seconds";
	unsigned long long cum = 0;
	int err = 0;

	err |= evbuffer_add_printf(out,
				   "# HELP %s Time from a request's arrival "
				   "to its first output token.\n"
				   "# TYPE %s histogram\n",
				   name, name) < 0;
	for (int i = 0; i < PDX_METRICS_TTFT_BUCKETS; i++) {
		cum += m->ttft_count[i];
		err |= evbuffer_add_printf(
			   out, "%s_bucket{model_name=\"%s\",le=\"%g\"} %llu\n",
			   name, model, ttft_bounds[i], cum) < 0;
	}
	cum += m->ttft_inf;
	err |= evbuffer_add_printf(
		   out,
		   "%s_bucket{model_name=\"%s\",le=\"+Inf\"} %llu\n"
		   "%s_sum{model_name=\"%s\"} %.9g\n"
		   "%s_count{model_name=\"%s\"} %llu\n",
		   name, model, cum, name, model, m->ttft_sum, name, model,
		   (unsigned long long)m->ttft_n) < 0;
	return err;
}

int pdx_metrics_render(const struct pdx_engine_metrics *m,
		       const struct pdx_metrics_gauges *g, struct evbuffer *out)
{
	const char *mo = g->model;
	char lab[160];
	int err = 0;

	snprintf(lab, sizeof(lab), ",model_name=\"%s\"", mo);
	err |= pdx_prom_build_info(out, "pdx_engine_build_info", lab);
	err |= family(out, "pdx_engine_num_requests_running", "gauge",
		      "Requests in prefill or decode.", mo, g->running);
	err |=
	    family(out, "pdx_engine_num_requests_waiting", "gauge",
		   "Requests queued for a slot or KV blocks.", mo, g->waiting);
	err |= family(out, "pdx_engine_kv_blocks_capacity", "gauge",
		      "Blocks in the KV pool.", mo, g->kv_total);
	err |= family(out, "pdx_engine_kv_blocks_free", "gauge",
		      "KV blocks no request holds (free, or cached and evictable).", mo, g->kv_free);
	err |=
	    family(out, "pdx_engine_kv_blocks_used", "gauge",
		   "KV blocks held by requests.", mo, g->kv_total - g->kv_free);
	err |= family(out, "pdx_engine_prefix_cache_blocks", "gauge",
		      "KV blocks kept in the prefix cache (held by requests "
		      "or not).",
		      mo, g->prefix_blocks);
	err |= family(out, "pdx_engine_prefix_query_tokens_total", "counter",
		      "Prompt tokens looked up in the prefix cache.", mo,
		      g->prefix_query_tokens);
	err |= family(out, "pdx_engine_prefix_hit_tokens_total", "counter",
		      "Prompt tokens whose KV was found in the prefix cache "
		      "(not computed, nor received on a decode engine).",
		      mo, g->prefix_hit_tokens);
	err |= family(out, "pdx_engine_prefix_hit_bytes_total", "counter",
		      "KV bytes of the prompt tokens found in the prefix cache "
		      "(every layer and tensor): on a decode engine, bytes "
		      "its agent did not have to receive.",
		      mo, g->prefix_hit_bytes);
	if (g->has_agent)
		err |= family(out, "pdx_engine_agent_up", "gauge",
			      "1 while the engine's pdx-agent is there with its "
			      "KV pool registered, 0 while it is away.",
			      mo, g->agent_up);
	err |=
	    family(out, "pdx_engine_prompt_tokens_total", "counter",
		   "Prompt tokens of requests accepted.", mo, m->prompt_tokens);
	err |= family(out, "pdx_engine_generation_tokens_total", "counter",
		      "Output tokens delivered.", mo, m->generation_tokens);
	err |=
	    family(out, "pdx_engine_requests_finished_total", "counter",
		   "Requests that ran to their length.", mo, m->req_finished);
	err |= family(out, "pdx_engine_requests_aborted_total", "counter",
		      "Requests whose client left before the end.", mo,
		      m->req_aborted);
	err |= family(out, "pdx_engine_requests_rejected_total", "counter",
		      "Requests refused with an error status.", mo,
		      m->req_rejected);
	err |= ttft_family(m, mo, out);
	return err ? -1 : 0;
}
