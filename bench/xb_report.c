/* pdx-xferbench's figures and their printing (xb_report.h). */
#include "bench/xb_report.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/xb_fail.h"
#include "common/kv_order.h"

/* the run being reported, for the printers below */
static const struct xb_opts *o;
static struct xb_run *run;
static const struct xb_dev *dev;

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double percentile(double *v, size_t n, double p)
{
	size_t idx;

	if (!n)
		return 0;
	idx = (size_t)ceil(p * (double)n);
	if (idx > 0)
		idx--;
	if (idx >= n)
		idx = n - 1;
	return v[idx];
}

/* An arm's figures (the keys of --help's text), from its results. */
struct figures {
	uint64_t bytes;       /* per transfer */
	uint64_t ev_bytes;    /* per transfer, as the decode agent's events say */
	double gbps, op_bytes, p50, p99, mean, layer_xfer, exposed, mgbps;
	/* exposed ends when the decode agent emits "received"; this one when
	 * the decode engine read it, which adds the engine process's wake-up */
	double engine_exposed;
};

/* Sorts a's samples. */
static struct figures figures_of(struct xb_arm *a)
{
	struct xb_results *r = &a->res;
	struct figures f = {
		.bytes = xb_plan_shape_bytes(run->plan, &a->shape),
		.ev_bytes = r->xfers ? r->ev_bytes / r->xfers : 0,
		.gbps = r->wall_s > 0 ? (double)r->bytes / r->wall_s / 1e9 : 0,
		.op_bytes = r->ops ? (double)r->bytes / (double)r->ops : 0,
		.layer_xfer = r->layer_n ? r->layer_sum_ms / (double)r->layer_n : 0,
		.mgbps = r->memcpy_s > 0 ?
			 (double)r->memcpy_bytes / r->memcpy_s / 1e9 : 0,
	};

	qsort(r->lat_ms, r->n_lat, sizeof(double), cmp_double);
	f.p50 = percentile(r->lat_ms, r->n_lat, 0.50);
	f.p99 = percentile(r->lat_ms, r->n_lat, 0.99);
	for (size_t i = 0; i < r->n_lat; i++)
		f.mean += r->lat_ms[i] / (double)r->n_lat;
	qsort(r->exposed_ms, r->exposed_n, sizeof(double), cmp_double);
	f.exposed = percentile(r->exposed_ms, r->exposed_n, 0.50);
	qsort(r->engine_exposed_ms, r->exposed_n, sizeof(double), cmp_double);
	f.engine_exposed = percentile(r->engine_exposed_ms, r->exposed_n, 0.50);
	return f;
}

/* s as a JSON string (quotes and escapes); null when empty. */
static void json_str(const char *s)
{
	if (!s[0]) {
		printf("null");
		return;
	}
	putchar('"');
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

/* x, or null without the GPU yardsticks */
static void json_gpu_num(const char *key, double x)
{
	printf(", \"%s\": ", key);
	if (o->cuda)
		printf("%.4f", x);
	else
		printf("null");
}

/* --mem, the data paths the agents chose and, on a GPU, the yardsticks:
 * the keys after the shm-era ones. */
static void json_mem(double gbps)
{
	printf(", \"mem\": \"%s\", \"gpu\": ", o->mem);
	json_str(dev->gpu);
	printf(", \"data_by\": ");
	json_str(run->prefill->data_by);
	printf(", \"data_by_decode\": ");
	json_str(run->decode->data_by);
	json_gpu_num("d2d_gbps", dev->d2d_gbps);
	json_gpu_num("d2h_gbps", dev->d2h_gbps);
	json_gpu_num("d2d_ratio", dev->d2d_gbps > 0 ? gbps / dev->d2d_gbps : 0);
	json_gpu_num("d2h_ratio", dev->d2h_gbps > 0 ? gbps / dev->d2h_gbps : 0);
}

static void print_gpu(double gbps)
{
	printf("  %-22s %.3f GB/s (throughput / it = %.3f)\n",
	       "cudaMemcpy d2d", dev->d2d_gbps,
	       dev->d2d_gbps > 0 ? gbps / dev->d2d_gbps : 0);
	printf("  %-22s %.3f GB/s (throughput / it = %.3f)\n",
	       "cudaMemcpy d2h pinned", dev->d2h_gbps,
	       dev->d2h_gbps > 0 ? gbps / dev->d2h_gbps : 0);
}

/* ---- --one-block's figures ---- */

#define OB_SEGS 8

/* From the last layer_done called to the decode engine reading its
 * event, step by step (agent/trace.h's marks between the engines'). */
static const char *const ob_seg_key[OB_SEGS] = {
	"engine_link_prefill", "to_push", "push", "completion",
	"done_build", "peer_link", "decode_agent", "engine_link_decode",
};
static const char *const ob_seg_name[OB_SEGS] = {
	"layer_done to prefill agent", "agent to push issued",
	"push (ipc: the copy)", "push to completion",
	"done built", "done to decode agent",
	"decode agent to event", "event sent, to D engine",
};

struct ob_stat {
	double p50, p90, mean;
	size_t n;
};

struct ob_summary {
	struct ob_stat ctl, rtt;
	struct ob_stat seg[OB_SEGS];
};

static struct ob_summary obs;


/* v sorted; its percentiles and mean. */
static struct ob_stat ob_stat(double *v, size_t n)
{
	struct ob_stat st = { .n = n };

	qsort(v, n, sizeof(double), cmp_double);
	for (size_t i = 0; i < n; i++)
		st.mean += v[i] / (double)n;
	st.p50 = percentile(v, n, 0.50);
	st.p90 = percentile(v, n, 0.90);
	return st;
}

/* The sample's timeline, or false when a mark is missing (no trace line:
 * an agent without PDX_AGENT_TRACE, or one that logs below info). */
static bool ob_timeline(const struct xb_ob_sample *s, uint64_t t[OB_SEGS + 1])
{
	const uint64_t tl[OB_SEGS + 1] = {
		s->t_ld, s->p[MARK_LAYER_DONE], s->p[MARK_PUSH],
		s->p[MARK_PUSHED], s->p[MARK_FLUSHED], s->p[MARK_DONE_SENT],
		s->d[MARK_DONE_HEARD], s->d[MARK_EVENT], s->t_ev,
	};

	memcpy(t, tl, sizeof(tl));
	for (int i = 0; i <= OB_SEGS; i++)
		if (!t[i])
			return false;
	return true;
}

static void ob_summarize(const struct xb_one_block *ob)
{
	double *v = calloc(ob->n ? ob->n : 1, sizeof(double));
	double *seg[OB_SEGS];
	size_t traced = 0;

	if (!v)
		xb_fail("out of memory");
	for (int g = 0; g < OB_SEGS; g++) {
		seg[g] = calloc(ob->n ? ob->n : 1, sizeof(double));
		if (!seg[g])
			xb_fail("out of memory");
	}
	for (uint32_t i = 0; i < ob->n; i++) {
		uint64_t t[OB_SEGS + 1];

		v[i] = ((double)ob->s[i].t_ev - (double)ob->s[i].t_ld) / 1e3;
		if (!ob_timeline(&ob->s[i], t))
			continue;
		for (int g = 0; g < OB_SEGS; g++)
			seg[g][traced] = ((double)t[g + 1] - (double)t[g]) / 1e3;
		traced++;
	}
	obs.ctl = ob_stat(v, ob->n);
	for (int g = 0; g < OB_SEGS; g++) {
		obs.seg[g] = ob_stat(seg[g], traced);
		free(seg[g]);
	}
	for (uint32_t i = 0; i < ob->n; i++)
		v[i] = (double)ob->s[i].rtt_ns / 1e3;
	obs.rtt = ob_stat(v, ob->n);
	free(v);
}

static void json_stat(const char *key, const struct ob_stat *st)
{
	printf(", \"%s\": {\"p50\": %.1f, \"p90\": %.1f, \"mean\": %.1f, "
	       "\"n\": %zu}", key, st->p50, st->p90, st->mean, st->n);
}

/* The keys of --one-block, null without it (or, for the breakdown,
 * without the agents' trace lines). */
static void json_one_block(void)
{
	if (!o->one_block) {
		printf(", \"one_block_ctl_us\": null, \"zmq_rtt_us\": null, "
		       "\"one_block_ratio\": null, "
		       "\"one_block_breakdown_us\": null");
		return;
	}
	json_stat("one_block_ctl_us", &obs.ctl);
	json_stat("zmq_rtt_us", &obs.rtt);
	printf(", \"one_block_ratio\": %.3f, \"one_block_breakdown_us\": ",
	       obs.rtt.p50 > 0 ? obs.ctl.p50 / obs.rtt.p50 : 0);
	if (!obs.seg[0].n) {
		printf("null");
		return;
	}
	for (int g = 0; g < OB_SEGS; g++)
		printf("%s\"%s\": {\"p50\": %.1f, \"mean\": %.1f}",
		       g ? ", " : "{", ob_seg_key[g], obs.seg[g].p50,
		       obs.seg[g].mean);
	printf(", \"n\": %zu}", obs.seg[0].n);
}

static void print_one_block(void)
{
	double layer_ms = o->layer_ms > 0 ? o->layer_ms : ONE_BLOCK_LAYER_MS;
	double sum = 0;

	printf("\n  one-block control path: %zu transfers of one block, %u layers %g ms apart\n",
	       obs.ctl.n, o->model->layers, layer_ms);
	printf("  %-34s %8s %8s %8s\n", "", "p50 us", "p90 us", "mean us");
	printf("  %-34s %8.1f %8.1f %8.1f\n", "last layer_done to D's event",
	       obs.ctl.p50, obs.ctl.p90, obs.ctl.mean);
	printf("  %-34s %8.1f %8.1f %8.1f\n", "ping over D's engine link",
	       obs.rtt.p50, obs.rtt.p90, obs.rtt.mean);
	printf("  %-34s %8.2f\n", "ratio (p50)",
	       obs.rtt.p50 > 0 ? obs.ctl.p50 / obs.rtt.p50 : 0);
	if (!obs.seg[0].n) {
		printf("  (no trace lines from the agents: no breakdown)\n");
		return;
	}
	printf("  where it goes (%zu traced):\n", obs.seg[0].n);
	for (int g = 0; g < OB_SEGS; g++) {
		printf("    %-32s %8.1f %8s %8.1f\n", ob_seg_name[g],
		       obs.seg[g].p50, "", obs.seg[g].mean);
		sum += obs.seg[g].mean;
	}
	printf("    %-32s %8s %8s %8.1f\n", "sum of means", "", "", sum);
}

static double ratio(double x, double y)
{
	return y > 0 ? x / y : 0;
}

/* a's decode ranks: per transfer, the bytes of each one's heads, what
 * its agent's events said, and whether all arrived intact. */
static void json_ranks(const struct xb_arm *a)
{
	uint64_t want = xb_plan_rank_bytes(run->plan, &a->shape);
	uint32_t n = a->res.xfers ? a->res.xfers : 1;

	printf("\"decode_ranks\": [");
	for (uint32_t j = 0; j < a->dec->size; j++)
		printf("%s{\"rank\": %u, \"bytes\": %" PRIu64
		       ", \"event_bytes\": %" PRIu64 ", \"verified\": %s}",
		       j ? ", " : "", j, want, a->res.rank_ev_bytes[j] / n,
		       a->res.rank_verified[j] ? "true" : "false");
	printf("]");
}

/* One arm of --versus in JSON. */
static void json_arm(const char *key, const struct xb_arm *a,
		     const struct figures *f)
{
	printf("\"%s\": {\"skip_tokens\": %u, \"pull\": %s, "
	       "\"bytes\": %" PRIu64 ", \"event_bytes\": %" PRIu64 ", "
	       "\"xfers\": %u, \"p50_ms\": %.4f, \"mean_ms\": %.4f, "
	       "\"p99_ms\": %.4f, \"gbps\": %.4f, \"exposed_ms\": %.4f, "
	       "\"engine_exposed_ms\": %.4f, \"memcpy_gbps\": %.4f, "
	       "\"verified\": %s, \"prefill_tp\": %u, \"decode_tp\": %u, "
	       "\"decode_order\": \"%s\", ",
	       key, a->shape.skip_tokens, a->shape.pull ? "true" : "false",
	       f->bytes, f->ev_bytes, a->res.xfers, f->p50, f->mean, f->p99,
	       f->gbps, f->exposed, f->engine_exposed, f->mgbps,
	       a->res.verified ? "true" : "false", a->shape.prefill_tp,
	       a->shape.decode_tp,
	       pdx_kv_order_name(a->shape.decode_order));
	json_ranks(a);
	printf("}");
}

/* The versus object, null without --versus. The ratios are the variant's
 * over the baseline's; bytes_ratio is of the bytes the decode agent said it
 * received, printed exactly (both are integers). */
static void json_versus(const struct figures *f, const struct figures *v)
{
	if (run->n_arms == 1) {
		printf(", \"versus\": null");
		return;
	}
	printf(", \"versus\": {\"what\": ");
	json_str(o->versus);
	printf(", ");
	json_arm("baseline", &run->arm[0], f);
	printf(", ");
	json_arm("variant", &run->arm[1], v);
	printf(", \"time_ratio\": %.4f, \"mean_time_ratio\": %.4f, "
	       "\"exposed_ratio\": %.4f, \"bytes_ratio\": %.17g}",
	       ratio(v->p50, f->p50), ratio(v->mean, f->mean),
	       ratio(v->exposed, f->exposed),
	       ratio((double)v->ev_bytes, (double)f->ev_bytes));
}

static void print_versus(const struct figures *f, const struct figures *v)
{
	const struct xb_shape *bs = &run->arm[0].shape, *vs = &run->arm[1].shape;
	char btp[32], vtp[32];

	printf("\n  versus %s: both in this run, iterations alternating\n",
	       o->versus);
	printf("  %-26s %14s %14s %9s\n", "", "baseline", "variant",
	       "ratio");
	printf("  %-26s %14u %14u\n", "tokens held by decode",
	       bs->skip_tokens, vs->skip_tokens);
	printf("  %-26s %14s %14s\n", "moved by", bs->pull ? "pull" : "push",
	       vs->pull ? "pull" : "push");
	snprintf(btp, sizeof(btp), "%u -> %u", bs->prefill_tp, bs->decode_tp);
	snprintf(vtp, sizeof(vtp), "%u -> %u", vs->prefill_tp, vs->decode_tp);
	printf("  %-26s %14s %14s\n", "TP prefill -> decode", btp, vtp);
	printf("  %-26s %14s %14s\n", "decode blocks",
	       pdx_kv_order_name(bs->decode_order),
	       pdx_kv_order_name(vs->decode_order));
	printf("  %-26s %14" PRIu64 " %14" PRIu64 " %9.4f\n",
	       "bytes per transfer", f->ev_bytes, v->ev_bytes,
	       ratio((double)v->ev_bytes, (double)f->ev_bytes));
	printf("  %-26s %14.3f %14.3f %9.3f\n", "latency p50, ms", f->p50,
	       v->p50, ratio(v->p50, f->p50));
	printf("  %-26s %14.3f %14.3f %9.3f\n", "latency mean, ms", f->mean,
	       v->mean, ratio(v->mean, f->mean));
	printf("  %-26s %14.3f %14.3f %9.3f\n", "exposed after compute, ms",
	       f->exposed, v->exposed, ratio(v->exposed, f->exposed));
	printf("  %-26s %14.3f %14.3f\n", "throughput, GB/s", f->gbps,
	       v->gbps);
	printf("  %-26s %14s %14s\n", "verified",
	       run->arm[0].res.verified ? "yes" : "NO",
	       run->arm[1].res.verified ? "yes" : "NO");
}

/* f: the run's own figures (run->arm[0]); v: --versus's variant, or NULL. */
static void print_results(const struct figures *f, const struct figures *v)
{
	const char *by_p = run->prefill->data_by[0] ? run->prefill->data_by : "(not logged)";
	enum pdx_kv_order decode_order = run->arm[0].shape.decode_order;
	char converts[64] = "";

	if (o->json) {
		printf("{\"tls\": \"%s\", \"model\": \"%s\", \"tokens\": %u, "
		       "\"skip_tokens\": %u, \"concurrency\": %u, "
		       "\"random_blocks\": %s, \"layer_ms\": %g, \"iters\": %u, "
		       "\"data_path\": \"%s\", \"pull\": %s, "
		       "\"seed\": %" PRIu64 ", "
		       "\"gbps\": %.4f, \"bytes\": %" PRIu64 ", \"op_bytes\": %.1f, "
		       "\"xfers\": %u, \"p50_ms\": %.4f, \"p99_ms\": %.4f, "
		       "\"layer_xfer_ms\": %.4f, \"exposed_ms\": %.4f, "
		       "\"engine_exposed_ms\": %.4f, "
		       "\"verified\": %s, \"memcpy_gbps\": %.4f",
		       o->tls, o->model->name, o->tokens, o->skip_tokens,
		       o->concurrency, o->random_blocks ? "true" : "false",
		       o->layer_ms, o->iters, o->data_path,
		       o->pull ? "true" : "false", o->seed, f->gbps, f->bytes,
		       f->op_bytes, run->arm[0].res.xfers, f->p50, f->p99,
		       f->layer_xfer, f->exposed, f->engine_exposed,
		       xb_run_verified(run) ? "true" : "false", f->mgbps);
		json_mem(f->gbps);
		printf(", \"order\": \"%s\", \"decode_order\": \"%s\", "
		       "\"prefill_tp\": %u, \"decode_tp\": %u, ",
		       pdx_kv_order_name(o->order),
		       pdx_kv_order_name(decode_order),
		       run->arm[0].shape.prefill_tp,
		       run->arm[0].shape.decode_tp);
		json_ranks(&run->arm[0]);
		json_one_block();
		json_versus(f, v);
		printf("}\n");
		fflush(stdout);
		return;
	}
	printf("pdx-xferbench: model %s, %u tokens%s, tls %s (UCX_TLS=%s), data path %s%s\n",
	       o->model->name, o->tokens, o->skip_tokens ? " (some held)" : "",
	       o->tls, o->ucx_tls, o->data_path, o->pull ? ", pulled" : "");
	printf("  concurrency %u, %s blocks, layer compute %g ms, %u iterations\n",
	       o->concurrency, o->random_blocks ? "random" : "contiguous",
	       o->layer_ms, o->iters);
	if (decode_order != o->order)
		snprintf(converts, sizeof(converts),
			 " (%s on the decode side: the agents convert)",
			 pdx_kv_order_name(decode_order));
	printf("  %s blocks%s, TP %u -> %u%s\n",
	       pdx_kv_order_name(o->order), converts,
	       run->arm[0].shape.prefill_tp, run->arm[0].shape.decode_tp,
	       run->arm[0].shape.prefill_tp == run->arm[0].shape.decode_tp ?
	       "" : " (the agents reshard the heads)");
	if (o->cuda)
		printf("  KV pools in GPU memory, %s%s%s%s\n\n", o->mem,
		       dev->gpu[0] ? " (" : "", dev->gpu, dev->gpu[0] ? ")" : "");
	else
		printf("  KV pools in /dev/shm\n\n");
	printf("  %-22s %s", "data by", by_p);
	if (run->decode->data_by[0] && strcmp(run->decode->data_by, run->prefill->data_by))
		printf(" (decode agent: %s)", run->decode->data_by);
	printf("\n");
	printf("  %-22s %" PRIu64 " (%.2f MiB)\n", "bytes per transfer",
	       f->bytes, (double)f->bytes / 1048576.0);
	printf("  %-22s %.0f\n", "bytes per UCX op", f->op_bytes);
	printf("  %-22s %u\n", "transfers measured", run->arm[0].res.xfers);
	printf("  %-22s %.3f GB/s\n", "throughput", f->gbps);
	printf("  %-22s %.3f GB/s\n", "memcpy (1 thread)", f->mgbps);
	if (o->cuda)
		print_gpu(f->gbps);
	printf("  %-22s %.3f ms\n", "latency p50", f->p50);
	printf("  %-22s %.3f ms\n", "latency p99", f->p99);
	printf("  %-22s %.4f ms\n", "per-layer transfer", f->layer_xfer);
	printf("  %-22s %.3f ms (engine read it after %.3f ms)\n",
	       "exposed after compute", f->exposed, f->engine_exposed);
	printf("  %-22s %s\n", "verified", xb_run_verified(run) ? "yes" : "NO");
	if (o->one_block)
		print_one_block();
	if (v)
		print_versus(f, v);
	fflush(stdout);
}


void xb_report_print(struct xb_run *r, const struct xb_one_block *ob)
{
	struct figures f, v;

	run = r;
	o = r->o;
	dev = &r->dev;
	f = figures_of(&r->arm[0]);
	if (r->n_arms > 1)
		v = figures_of(&r->arm[1]);
	if (o->one_block)
		ob_summarize(ob);
	print_results(&f, r->n_arms > 1 ? &v : NULL);
}
