/* tp_reshard: prefill and decode instances of different TP sizes, one
 * real pdx-agent and one libpdx engine per rank, KV heads resharded by
 * the agents (docs/protocol.md, "TP legs"): every byte of every decode
 * rank's blocks is checked against the heads that rank holds of one
 * full-heads reference (split with kernels/' CPU reference). MLA's latent
 * reaches every decode rank whole. A decode instance whose blocks are in
 * the other order (HND against NHD) gets them converted, at equal TP
 * sizes too (the reference permuted by kernels/' CPU reference). Refused
 * splits fail with why.
 *
 *   tp_reshard PATH-TO-pdx-agent
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "common/clock.h"
#include "kernels/kv_kernels.h"
#include "tests/integ/harness.h"

#define HEADS 8 /* full KV heads */
#define LAYERS 2
#define TOKENS 4 /* per block */
#define HEAD_DIM 4
#define POOL 64
#define NX 3 /* transfers per case */
#define NB 5 /* blocks per transfer */
#define MAX_RANKS 8

struct rank {
	struct pb_agent agent;
	struct pdx_shm_pool pool;
	struct pdx_engine *eng;
	char engine_addr[4200];
	char listen[128];
	char peer[PDX_ADDR_MAX];
};

struct inst {
	uint32_t size, kv_heads, tensors;
	enum pdx_kv_order order;
	struct rank r[MAX_RANKS];
};

static char dir[256];
static const char *agent_bin;
static uint64_t rng;
static int n_started;
static const char *lease_ms; /* --lease-ms for the agents; NULL: none */
static const char *agent_env; /* "KEY=VALUE" for the agents; NULL: none */

/* Rank i's pool, and its agent started (not waited for). */
static int rank_spawn(struct inst *in, uint32_t i, const char *data_path)
{
	struct pdx_model m = { .name = "tp", .layers = LAYERS,
			       .tensors = in->tensors,
			       .kv_heads = in->kv_heads, .head_dim = HEAD_DIM,
			       .dtype_bytes = 2, .block_tokens = TOKENS };
	struct pb_agent_opts ao = { 0 };
	struct rank *r = &in->r[i];
	char path[4200], name[64];
	int port = pb_free_port("127.0.0.1");

	n_started++;
	snprintf(name, sizeof(name), "/pdx-tp-%d-%d", (int)getpid(), n_started);
	if (port < 0 || pb_pool_create(&r->pool, name, &m, POOL))
		return -1;
	r->pool.layout.order = in->order;
	snprintf(path, sizeof(path), "%s/%d.engine", dir, n_started);
	snprintf(r->engine_addr, sizeof(r->engine_addr), "ipc://%s", path);
	snprintf(r->listen, sizeof(r->listen), "tcp://127.0.0.1:%d", port);
	ao.bin = agent_bin;
	ao.engine = r->engine_addr;
	ao.listen = r->listen;
	ao.tls = "sm,self";
	ao.data_path = data_path;
	ao.xfer_timeout_ms = 20000;
	ao.env[0] = agent_env;
	if (lease_ms) { /* renewed by pings 5 times a lease */
		ao.args[0] = "--lease-ms";
		ao.args[1] = lease_ms;
		ao.args[2] = "--heartbeat-ms";
		ao.args[3] = "200";
	}
	return pb_agent_start(&r->agent, &ao);
}

/* Rank i's engine: connected to its agent, which rank_spawn() started,
 * and registered (its peer address in r->peer). */
static int rank_register(struct inst *in, uint32_t i, char tag)
{
	struct pdx_engine_params ep = { .timeout_ms = 2000 };
	struct rank *r = &in->r[i];
	pdx_status_t st;

	ep.agent = r->engine_addr;
	st = pdx_engine_connect(&ep, &r->eng);
	if (!st)
		st = pdx_engine_set_tp(r->eng, i, in->size);
	if (!st)
		st = pb_register_retry(r->eng, &r->pool, r->peer,
				       sizeof(r->peer), 10000, &r->agent);
	if (st) {
		h_note("%c rank %u: %s", tag, i, pdx_status_str(st));
		return -1;
	}
	return 0;
}

static int inst_start(struct inst *in, uint32_t size, uint32_t kv_heads,
		      bool mla, enum pdx_kv_order order, char tag,
		      const char *data_path)
{
	memset(in, 0, sizeof(*in));
	in->size = size;
	in->kv_heads = kv_heads;
	in->tensors = mla ? 1 : 2;
	in->order = order;
	/* every rank's agent starts at once (each takes ~0.1 s), then
	 * each engine registers with its own */
	for (uint32_t i = 0; i < size; i++)
		if (rank_spawn(in, i, data_path))
			return -1;
	for (uint32_t i = 0; i < size; i++)
		if (rank_register(in, i, tag))
			return -1;
	return 0;
}

static void inst_stop(struct inst *in)
{
	for (uint32_t i = 0; i < in->size; i++) {
		struct rank *r = &in->r[i];
		int st;

		pdx_engine_free(r->eng);
		r->eng = NULL;
		if (r->agent.pid > 0) {
			st = pb_agent_stop(&r->agent);
			if (st)
				CHECK_FAIL("agent of rank %u stops with "
					   "wait status 0x%x", i, st);
		}
		pb_pool_destroy(&r->pool);
		if (r->engine_addr[0])
			unlink(r->engine_addr + strlen("ipc://"));
	}
}

#define META_MAX 32 /* the meta each transfer carries: "meta of x" */

/* Up to timeout_ms for events about all n ids on e; 0 when they came
 * (kinds and first tokens in evs, their meta as strings in metas unless
 * NULL, in the ids' order). */
static int wait_all(struct pdx_engine *e, const struct pdx_xfer_id *ids,
		    size_t n, struct pdx_engine_event *evs,
		    char (*metas)[META_MAX], int timeout_ms)
{
	uint64_t end = pdx_now_ns() + (uint64_t)timeout_ms * 1000000ULL;
	size_t got = 0;
	bool seen[NX + 1] = { 0 };

	while (got < n && pdx_now_ns() < end) {
		struct pdx_engine_event ev;

		if (pdx_engine_wait_event(e, 100, &ev) != PDX_OK)
			continue;
		for (size_t k = 0; k < n; k++)
			if (!seen[k] && !memcmp(ev.xfer.b, ids[k].b, 16)) {
				const void *meta;
				size_t len;

				seen[k] = true;
				evs[k] = ev;
				got++;
				if (!metas)
					continue;
				if (pdx_engine_event_meta(e, &meta, &len) ||
				    len >= META_MAX)
					len = 0;
				memcpy(metas[k], len ? meta : "", len);
				metas[k][len] = '\0';
			}
	}
	return got == n ? 0 : -1;
}

static struct pdx_kv_shape full_shape(const struct inst *in)
{
	return (struct pdx_kv_shape){ .block_tokens = TOKENS,
				      .kv_heads = in->tensors == 1
							  ? in->kv_heads
							  : HEADS,
				      .head_dim = HEAD_DIM, .dtype_bytes = 2,
				      .order = in->order };
}

/* The heads rank i of TP n holds of the full blocks ref (MLA: all). */
static uint8_t *shard(const struct inst *in, const uint8_t *ref, uint32_t i)
{
	struct pdx_kv_shape s = full_shape(in);
	uint64_t full = pdx_kv_shape_bytes(&s) * NB, part = full / in->size;
	void *dst[MAX_RANKS];
	uint8_t *all = malloc(full);

	if (in->tensors == 1 || in->size == 1) {
		memcpy(all, ref, full);
		return all;
	}
	for (uint32_t k = 0; k < in->size; k++)
		dst[k] = all + k * part;
	pdx_kv_heads_split_cpu(&s, ref, in->size, dst, NB);
	memmove(all, all + i * part, part);
	return all;
}

/* Decode rank j's blocks of transfer x (layer l, tensor t) against its
 * heads of ref, full blocks in P's order; the second transfer's first
 * block is held (poisoned). The number of blocks that differ. */
static int check_blocks(const struct inst *P, const struct inst *D,
			uint32_t j, const uint8_t *ref, int x, int l, uint32_t t,
			const uint32_t *dst)
{
	const struct pdx_shm_pool *pool = &D->r[j].pool;
	struct pdx_kv_shape fs = full_shape(P);
	uint64_t full = pdx_kv_shape_bytes(&fs) * NB;
	uint8_t *turned = malloc(full), *s, poison[4096];
	uint64_t part = pool->block_bytes;
	int bad = 0;

	if (P->order != D->order) /* D's order */
		pdx_kv_permute_cpu(&fs, ref, turned, NB);
	s = shard(D, P->order != D->order ? turned : ref, j);
	free(turned);
	memset(poison, 0xee, part);
	for (int k = 0; k < NB; k++) {
		const uint8_t *want = x == 1 && k == 0 ? poison : s + k * part;

		if (memcmp(pdx_shm_pool_block(pool, l, t, dst[k]), want, part) &&
		    !bad++)
			h_note("decode rank %u, transfer %d, layer %d, tensor %u,"
			       " block %d differs", j, x, l, t, k);
	}
	free(s);
	return bad;
}

/* One case: NX transfers from every prefill rank (blocks in order) to
 * every decode rank (blocks in order `to`), the second with its first
 * block held by the decode side already; pushed, or read by the decode
 * agents (mode PDX_XFER_PULL). */
static void run_case(uint32_t p, uint32_t d, enum pdx_kv_order order,
		     enum pdx_kv_order to, bool mla, const char *data_path,
		     enum pdx_xfer_mode mode)
{
	const char *ord = order == PDX_KV_HND ? "HND" : "NHD";
	const char *ord_to = order == to      ? ""
			     : to == PDX_KV_HND ? " -> HND"
						: " -> NHD";
	uint32_t lat = mla ? 2 : 0; /* MLA: one latent "head" per rank */
	struct inst *P = calloc(1, sizeof(*P)), *D = calloc(1, sizeof(*D));
	struct pdx_xfer_id ids[NX];
	uint32_t src[NX][NB], dst[NX][NB];
	uint8_t *ref[NX][LAYERS][2] = { 0 };
	const char *peers[MAX_RANKS];
	struct pdx_engine_event evs[NX];
	char metas[NX][META_MAX], meta[META_MAX];
	struct pdx_kv_shape fs;
	uint64_t full, part;
	int bad = 0, failed_evs = 0;

	h_note("TP %u -> %u, %s%s%s, data path %s, %s", p, d,
	       mla ? "MLA " : "", ord, ord_to, data_path ? data_path : "auto",
	       mode == PDX_XFER_PULL ? "pulled" : "pushed");
	if (inst_start(P, p, mla ? lat : HEADS / p, mla, order, 'p', data_path) ||
	    inst_start(D, d, mla ? lat : HEADS / d, mla, to, 'd', data_path)) {
		CHECK_FAIL("TP %u -> %u: the agents and engines start", p, d);
		goto out;
	}
	fs = full_shape(P);
	full = pdx_kv_shape_bytes(&fs) * NB;
	for (uint32_t i = 0; i < p; i++)
		peers[i] = P->r[i].peer;
	for (int x = 0; x < NX; x++) {
		pdx_xfer_id_random(&ids[x]);
		pb_pick_blocks(src[x], NB, POOL / NX, true, &rng);
		pb_pick_blocks(dst[x], NB, POOL / NX, true, &rng);
		for (int k = 0; k < NB; k++) {
			src[x][k] += x * (POOL / NX);
			dst[x][k] += x * (POOL / NX);
		}
		for (int l = 0; l < LAYERS; l++)
			for (uint32_t t = 0; t < P->tensors; t++) {
				ref[x][l][t] = malloc(full);
				for (uint64_t b = 0; b < full; b += 8) {
					uint64_t v = pdx_splitmix64(&rng);

					memcpy(ref[x][l][t] + b, &v, 8);
				}
				for (uint32_t i = 0; i < p; i++) {
					uint8_t *s = shard(P, ref[x][l][t], i);

					part = P->r[i].pool.block_bytes;
					for (int k = 0; k < NB; k++)
						memcpy(pdx_shm_pool_block(
							   &P->r[i].pool, l, t,
							   src[x][k]),
						       s + k * part, part);
					free(s);
				}
				for (uint32_t j = 0; j < d; j++)
					for (int k = 0; k < NB; k++)
						memset(pdx_shm_pool_block(
							   &D->r[j].pool, l, t,
							   dst[x][k]),
						       0xee, D->r[j].pool.block_bytes);
			}
	}
	for (int x = 0; x < NX; x++)
		for (uint32_t j = 0; j < d; j++) {
			struct pdx_recv_opts ro = {
				.skip_tokens = x == 1 ? TOKENS : 0,
				.mode = mode, .peers = peers, .n_peers = p };

			if (pdx_engine_recv_opts(D->r[j].eng, &ids[x], NULL,
						 dst[x], NB, &ro))
				CHECK_FAIL("recv on decode rank %u: %s", j,
					   pdx_engine_last_error(D->r[j].eng));
		}
	for (int x = 0; x < NX; x++)
		for (uint32_t i = 0; i < p; i++) {
			if (pdx_engine_send(P->r[i].eng, &ids[x], NULL, src[x], NB))
				CHECK_FAIL("send on prefill rank %u", i);
			/* every rank has the token: a decode rank hears it
			 * from whichever senders it has */
			pdx_engine_token(P->r[i].eng, &ids[x], 100 + x);
			snprintf(meta, sizeof(meta), "meta of %d", x);
			pdx_engine_meta(P->r[i].eng, &ids[x], meta, strlen(meta));
		}
	for (int l = 0; l < LAYERS; l++)
		for (uint32_t i = 0; i < p; i++)
			pdx_engine_layer_done(P->r[i].eng, l, ids, NX);
	for (uint32_t i = 0; i < p; i++) {
		if (wait_all(P->r[i].eng, ids, NX, evs, metas, 20000)) {
			failed_evs++;
			continue;
		}
		for (int x = 0; x < NX; x++)
			if (evs[x].kind != PDX_EVENT_SENT) {
				h_note("prefill rank %u: %s: %s", i,
				       h_kind(evs[x].kind), evs[x].reason);
				failed_evs++;
			}
	}
	for (uint32_t j = 0; j < d; j++) {
		if (wait_all(D->r[j].eng, ids, NX, evs, metas, 20000)) {
			failed_evs++;
			continue;
		}
		for (int x = 0; x < NX; x++) {
			snprintf(meta, sizeof(meta), "meta of %d", x);
			if (evs[x].kind != PDX_EVENT_RECEIVED ||
			    evs[x].first_token != 100 + x ||
			    strcmp(metas[x], meta) != 0) {
				h_note("decode rank %u: %s (token %" PRId64
				       ", meta \"%s\"): %s", j,
				       h_kind(evs[x].kind), evs[x].first_token,
				       metas[x], evs[x].reason);
				failed_evs++;
			}
		}
	}
	CHECK_EQ(failed_evs, 0, "each of the %u prefill and %u decode ranks "
		 "gets one sent / received event per transfer, with the "
		 "first token and the meta", p, d);
	for (uint32_t j = 0; j < d; j++)
		for (int x = 0; x < NX; x++)
			for (int l = 0; l < LAYERS; l++)
				for (uint32_t t = 0; t < D->tensors; t++)
					bad += check_blocks(P, D, j,
							    ref[x][l][t], x, l,
							    t, dst[x]);
	CHECK_EQ(bad, 0, "every decode rank holds exactly its heads of every "
		 "block (the held block untouched)");
out:
	inst_stop(P);
	inst_stop(D);
	for (int x = 0; x < NX; x++)
		for (int l = 0; l < LAYERS; l++)
			for (int t = 0; t < 2; t++)
				free(ref[x][l][t]);
	free(P);
	free(D);
}

/* The decode engine's recv of one transfer fails; its reason. */
static void expect_refused(struct inst *D, uint32_t j, const char *const *peers,
			   uint32_t n, enum pdx_xfer_mode mode, const char *want,
			   const char *what)
{
	struct pdx_recv_opts ro = { .mode = mode, .peers = peers,
				    .n_peers = n };
	uint32_t blocks[1] = { 1 };
	struct pdx_engine_event ev = { 0 };
	struct pdx_xfer_id id;

	pdx_xfer_id_random(&id);
	if (pdx_engine_recv_opts(D->r[j].eng, &id, NULL, blocks, 1, &ro) ||
	    wait_all(D->r[j].eng, &id, 1, &ev, NULL, 10000)) {
		CHECK_FAIL("%s: no event", what);
		return;
	}
	h_note("%s: %s", what, ev.reason);
	CHECK(ev.kind == PDX_EVENT_FAILED && strstr(ev.reason, want),
	      "a refused split fails with why");
}

/* One transfer X of TP 2 -> 1 whose engine on side `who` aborts it:
 * every engine hears "failed" at once (not at a lease), each reason
 * naming what it must. */
static void abort_one(struct inst *P, struct inst *D, const char *who,
		      bool computed, const char *want_p0, const char *want_p1,
		      const char *want_d)
{
	const char *peers[2] = { P->r[0].peer, P->r[1].peer };
	struct pdx_recv_opts ro = { .peers = peers, .n_peers = 2 };
	uint32_t blocks[2] = { 3, 4 };
	struct pdx_engine_event ev[3] = { 0 };
	struct pdx_xfer_id id;
	struct pdx_engine *by = who[0] == 'd' ? D->r[0].eng : P->r[1].eng;
	bool ok;

	pdx_xfer_id_random(&id);
	pdx_engine_recv_opts(D->r[0].eng, &id, NULL, blocks, 2, &ro);
	pdx_engine_send(P->r[0].eng, &id, NULL, blocks, 2);
	pdx_engine_send(P->r[1].eng, &id, NULL, blocks, 2);
	if (computed) {
		pdx_engine_layer_done(P->r[0].eng, 0, &id, 1);
		pdx_engine_layer_done(P->r[1].eng, 0, &id, 1);
		h_sleep_ms(200); /* layer 0 on its way */
	}
	pdx_engine_abort(by, &id);
	ok = !wait_all(P->r[0].eng, &id, 1, &ev[0], NULL, 5000) &&
	     !wait_all(P->r[1].eng, &id, 1, &ev[1], NULL, 5000) &&
	     !wait_all(D->r[0].eng, &id, 1, &ev[2], NULL, 5000);
	for (int k = 0; k < 3 && ok; k++)
		h_note("%s: %s: %s", k < 2 ? "prefill" : "decode",
		       h_kind(ev[k].kind), ev[k].reason);
	CHECK(ok && ev[0].kind == PDX_EVENT_FAILED &&
		      ev[1].kind == PDX_EVENT_FAILED &&
		      ev[2].kind == PDX_EVENT_FAILED &&
		      strstr(ev[0].reason, want_p0) &&
		      strstr(ev[1].reason, want_p1) &&
		      strstr(ev[2].reason, want_d),
	      "an abort on one rank fails the transfer on every rank at once, "
	      "saying which rank");
}

static void aborts(void)
{
	struct inst *P = calloc(1, sizeof(*P)), *D = calloc(1, sizeof(*D));

	h_note("aborts, TP 2 -> 1");
	if (inst_start(P, 2, 4, false, PDX_KV_HND, 'p', NULL) ||
	    inst_start(D, 1, 8, false, PDX_KV_HND, 'd', NULL)) {
		CHECK_FAIL("aborts: the agents and engines start");
	} else {
		/* the decode engine, before anything was computed */
		abort_one(P, D, "decode", false, "rank 0 of TP 1",
			  "rank 0 of TP 1", "aborted by engine");
		/* prefill rank 1, after a layer: its leg fails the
		 * decode side's transfer, which aborts rank 0's leg */
		abort_one(P, D, "prefill", true, "rank 1 of TP 2",
			  "aborted by engine", "from rank 1 of TP 2");
	}
	inst_stop(P);
	inst_stop(D);
	free(P);
	free(D);
}

/* TP 1 -> 2: decode engines hold their requests at the prefill rank's
 * agent (pdx_engine_hold) past its lease, or give up on one before its
 * recv (pdx_engine_abort_at). */
static void holds(void)
{
	struct inst *P = calloc(1, sizeof(*P)), *D = calloc(1, sizeof(*D));
	const char *peers[1];
	struct pdx_recv_opts ro = { .n_peers = 1 };
	uint32_t blocks[2] = { 5, 6 };
	struct pdx_engine_event ev[3] = { 0 };
	struct pdx_xfer_id id;
	bool ok;

	h_note("holds and abort_at, TP 1 -> 2, --lease-ms 1000");
	lease_ms = "1000";
	if (inst_start(P, 1, 8, false, PDX_KV_NHD, 'p', NULL) ||
	    inst_start(D, 2, 4, false, PDX_KV_NHD, 'd', NULL)) {
		CHECK_FAIL("holds: the agents and engines start");
		goto out;
	}
	peers[0] = P->r[0].peer;
	ro.peers = peers;
	pdx_xfer_id_random(&id);
	pdx_engine_hold(D->r[0].eng, &id, P->r[0].peer);
	pdx_engine_hold(D->r[1].eng, &id, P->r[0].peer);
	pdx_engine_send(P->r[0].eng, &id, NULL, blocks, 2);
	h_sleep_ms(2500); /* 2.5 leases */
	pdx_engine_recv_opts(D->r[0].eng, &id, NULL, blocks, 2, &ro);
	pdx_engine_recv_opts(D->r[1].eng, &id, NULL, blocks, 2, &ro);
	pdx_engine_layer_done(P->r[0].eng, 0, &id, 1);
	pdx_engine_layer_done(P->r[0].eng, 1, &id, 1);
	ok = !wait_all(P->r[0].eng, &id, 1, &ev[0], NULL, 10000) &&
	     !wait_all(D->r[0].eng, &id, 1, &ev[1], NULL, 10000) &&
	     !wait_all(D->r[1].eng, &id, 1, &ev[2], NULL, 10000);
	for (int k = 0; k < 3 && ok; k++)
		h_note("%s: %s %s", k ? "decode" : "prefill", h_kind(ev[k].kind),
		       ev[k].reason);
	CHECK(ok && ev[0].kind == PDX_EVENT_SENT &&
		      ev[1].kind == PDX_EVENT_RECEIVED &&
		      ev[2].kind == PDX_EVENT_RECEIVED,
	      "decode ranks of another TP size hold the prefill rank's KV past "
	      "its lease without claiming it");

	/* both hold it, decode rank 1 asks, rank 0's request leaves before
	 * its recv: the holds keep the lease, so only the abort ends it */
	pdx_xfer_id_random(&id);
	pdx_engine_hold(D->r[0].eng, &id, P->r[0].peer);
	pdx_engine_hold(D->r[1].eng, &id, P->r[0].peer);
	pdx_engine_send(P->r[0].eng, &id, NULL, blocks, 2);
	pdx_engine_recv_opts(D->r[1].eng, &id, NULL, blocks, 2, &ro);
	h_sleep_ms(300);
	pdx_engine_abort_at(D->r[0].eng, &id, P->r[0].peer);
	ok = !wait_all(P->r[0].eng, &id, 1, &ev[0], NULL, 5000) &&
	     !wait_all(D->r[1].eng, &id, 1, &ev[2], NULL, 5000);
	if (ok)
		h_note("prefill: %s; decode rank 1: %s", ev[0].reason,
		       ev[2].reason);
	CHECK(ok && ev[0].kind == PDX_EVENT_FAILED &&
		      ev[2].kind == PDX_EVENT_FAILED &&
		      strstr(ev[0].reason, "rank 0 of TP 2") &&
		      strstr(ev[2].reason, "rank 0 of TP 2"),
	      "a decode rank's abort_at of a held request fails the transfer "
	      "on every rank");
out:
	lease_ms = NULL;
	inst_stop(P);
	inst_stop(D);
	free(P);
	free(D);
}

/* TP 1 -> 2 over the am lane, the decode agents frozen (SIGSTOP) once
 * they asked: the prefill agent's packed heads wait for them (rendezvous,
 * UCX_RNDV_THRESH=64) when it is stopped (SIGTERM). It exits 0: its
 * messages' late callbacks touch no freed transfer (ASan, valgrind). */
static void stop_midway(void)
{
	struct inst *P = calloc(1, sizeof(*P)), *D = calloc(1, sizeof(*D));
	const char *peers[1];
	struct pdx_recv_opts ro = { .n_peers = 1 };
	uint32_t blocks[NB];
	struct pdx_xfer_id id;
	int st;

	h_note("stop midway: TP 1 -> 2 over am, decode agents frozen");
	for (int k = 0; k < NB; k++)
		blocks[k] = (uint32_t)k;
	agent_env = "UCX_RNDV_THRESH=64";
	if (inst_start(P, 1, 8, false, PDX_KV_NHD, 'p', "am") ||
	    inst_start(D, 2, 4, false, PDX_KV_NHD, 'd', "am")) {
		CHECK_FAIL("stop midway: the agents and engines start");
		goto out;
	}
	peers[0] = P->r[0].peer;
	ro.peers = peers;
	pdx_xfer_id_random(&id);
	for (uint32_t j = 0; j < 2; j++)
		pdx_engine_recv_opts(D->r[j].eng, &id, NULL, blocks, NB, &ro);
	pdx_engine_send(P->r[0].eng, &id, NULL, blocks, NB);
	h_sleep_ms(500); /* both legs asked */
	for (uint32_t j = 0; j < 2; j++)
		pb_agent_kill(&D->r[j].agent, SIGSTOP);
	for (int l = 0; l < LAYERS; l++)
		pdx_engine_layer_done(P->r[0].eng, l, &id, 1);
	h_sleep_ms(300); /* packed and sent: waiting for the receivers */
	st = pb_agent_stop(&P->r[0].agent);
	CHECK(st == 0, "the prefill agent, stopped with packed heads in "
	      "flight, exits 0 (wait status 0x%x)", st);
	for (uint32_t j = 0; j < 2; j++)
		pb_agent_kill(&D->r[j].agent, SIGCONT);
out:
	agent_env = NULL;
	inst_stop(P);
	inst_stop(D);
	free(P);
	free(D);
}

static void refusals(void)
{
	struct inst *P = calloc(1, sizeof(*P)), *D = calloc(1, sizeof(*D));
	const char *peers[4];

	/* decode TP 2 of 2 heads vs prefill TP 2 of 8 heads */
	if (inst_start(P, 2, 4, false, PDX_KV_NHD, 'p', NULL) ||
	    inst_start(D, 2, 1, false, PDX_KV_NHD, 'd', NULL)) {
		CHECK_FAIL("refusals: the agents and engines start");
		goto out;
	}
	peers[0] = P->r[0].peer;
	peers[1] = P->r[1].peer;
	peers[2] = P->r[1].peer;
	expect_refused(D, 0, peers, 2, PDX_XFER_PUSH, "1 x tp 2 = 2",
		       "8 heads on prefill, 2 on decode");
	expect_refused(D, 0, peers, 3, PDX_XFER_PUSH, "tp size 3 is not a power of two",
		       "three prefill ranks");
	peers[3] = P->r[1].peer;
	expect_refused(D, 0, peers, 4, PDX_XFER_PUSH, "do not split over TP 4",
		       "2 heads over four prefill ranks");
	CHECK(pdx_engine_set_tp(D->r[0].eng, 1, 3) == PDX_EINVAL &&
		      strstr(pdx_engine_last_error(D->r[0].eng), "power of two"),
	      "libpdx refuses TP size 3, saying why");
out:
	inst_stop(P);
	inst_stop(D);
	/* the am lane pushes heads, but cannot be read from */
	if (inst_start(P, 1, 8, false, PDX_KV_HND, 'p', "am") ||
	    inst_start(D, 2, 4, false, PDX_KV_HND, 'd', "am")) {
		CHECK_FAIL("am: the agents and engines start");
	} else {
		peers[0] = P->r[0].peer;
		expect_refused(D, 1, peers, 1, PDX_XFER_PULL,
			       "the lane to this sender is am",
			       "TP 1 -> 2 by pull over am");
	}
	inst_stop(P);
	inst_stop(D);
	free(P);
	free(D);
}

int main(int argc, char **argv)
{
	static const uint32_t pairs[][2] = { { 1, 2 }, { 2, 1 }, { 2, 4 },
					     { 4, 2 } };
	const enum pdx_xfer_mode push = PDX_XFER_PUSH, pull = PDX_XFER_PULL;

	setvbuf(stdout, NULL, _IOLBF, 0);
	pb_cleanup_install();
	if (argc < 2) {
		fprintf(stderr, "usage: %s PATH-TO-pdx-agent\n", argv[0]);
		return 1;
	}
	agent_bin = argv[1];
	rng = pdx_now_ns() ^ ((uint64_t)getpid() << 32);
	h_note("seed %" PRIu64, rng);
	if (pb_tmpdir(dir, sizeof(dir)))
		return 1;
	for (size_t k = 0; k < sizeof(pairs) / sizeof(pairs[0]); k++) {
		run_case(pairs[k][0], pairs[k][1], PDX_KV_NHD, PDX_KV_NHD,
			 false, NULL, push);
		run_case(pairs[k][0], pairs[k][1], PDX_KV_HND, PDX_KV_HND,
			 false, NULL, push);
	}
	run_case(2, 4, PDX_KV_NHD, PDX_KV_NHD, false, "put", push);
	/* receivers as a version 3 agent, without "slices": a put per row */
	agent_env = "PDX_AGENT_NO_SLICES=1";
	run_case(2, 4, PDX_KV_NHD, PDX_KV_NHD, false, "put", push);
	run_case(1, 1, PDX_KV_HND, PDX_KV_NHD, false, "put", push);
	agent_env = NULL;
	run_case(4, 2, PDX_KV_HND, PDX_KV_HND, false, "put", push);
	run_case(4, 2, PDX_KV_HND, PDX_KV_NHD, false, "put", push);
	run_case(1, 2, PDX_KV_NHD, PDX_KV_NHD, false, "am", push);
	agent_env = "UCX_RNDV_THRESH=64"; /* the slices by rendezvous */
	run_case(4, 2, PDX_KV_NHD, PDX_KV_NHD, false, "am", push);
	run_case(4, 2, PDX_KV_NHD, PDX_KV_HND, false, "am", push);
	agent_env = NULL;
	run_case(2, 4, PDX_KV_HND, PDX_KV_HND, false, "am", push);
	run_case(2, 4, PDX_KV_NHD, PDX_KV_NHD, false, NULL, pull); /* ipc */
	run_case(2, 1, PDX_KV_HND, PDX_KV_HND, false, NULL, pull);
	run_case(2, 1, PDX_KV_HND, PDX_KV_NHD, false, NULL, pull);
	run_case(1, 2, PDX_KV_HND, PDX_KV_HND, false, "put", pull);
	run_case(4, 2, PDX_KV_NHD, PDX_KV_NHD, false, "put", pull);
	/* whole blocks read, our heads copied out (both ways of p vs d) */
	run_case(2, 4, PDX_KV_NHD, PDX_KV_NHD, false, "put", pull);
	run_case(2, 4, PDX_KV_NHD, PDX_KV_HND, false, "put", pull);
	/* equal TP through peers */
	run_case(2, 2, PDX_KV_NHD, PDX_KV_NHD, false, NULL, push);
	run_case(2, 1, PDX_KV_NHD, PDX_KV_NHD, true, NULL, push);
	run_case(1, 2, PDX_KV_NHD, PDX_KV_NHD, true, NULL, push);
	run_case(2, 1, PDX_KV_NHD, PDX_KV_NHD, true, "put", pull);
	run_case(2, 1, PDX_KV_NHD, PDX_KV_HND, true, "put", pull);
	/* equal TP sizes, the blocks converted (vLLM's HND, SGLang's NHD) */
	run_case(1, 1, PDX_KV_NHD, PDX_KV_HND, false, NULL, push); /* ipc */
	run_case(1, 1, PDX_KV_HND, PDX_KV_NHD, false, "put", push);
	run_case(1, 1, PDX_KV_NHD, PDX_KV_HND, false, "am", push); /* eager */
	run_case(1, 1, PDX_KV_HND, PDX_KV_NHD, false, NULL, pull);
	run_case(1, 1, PDX_KV_NHD, PDX_KV_HND, false, "put", pull);
	run_case(2, 2, PDX_KV_HND, PDX_KV_NHD, false, NULL, push);
	refusals();
	stop_midway();
	aborts();
	holds();
	pb_tmpdir_remove(dir);
	pb_cleanup_run();
	return check_status();
}
