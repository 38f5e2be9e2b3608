/* Tensor parallelism's pure parts: the TP link's messages survive
 * encoding byte for byte and a damaged one is refused; the head split
 * refuses what cannot work; and a rank's pool holds, for each of its
 * heads, exactly the bytes a TP 1 pool holds for that head (so KV moved
 * between TP sizes can be checked byte for byte), with the token read
 * from head 0 the same at any TP size. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/shm_pool.h"
#include "engine/synth_model.h"
#include "engine/tp_slice.h"
#include "engine/tp_wire.h"
#include "tests/check.h"

static void step_roundtrip(void)
{
	uint32_t b0[] = {7, 3}, b1[] = {9};
	uint64_t h0[] = {1, 2, 3, 4, 5}, h1[] = {0xdeadbeefcafef00dULL};
	struct pdx_tp_run runs[] = {
	    {.a = 3, .b = 8, .n_blocks = 2, .blocks = b0, .hash = h0},
	    {.a = 40, .b = 41, .n_blocks = 1, .blocks = b1, .hash = h1},
	    {.a = 5, .b = 5}, /* nothing to write */
	};
	struct pdx_tp_msg m = {.kind = PDX_TP_STEP, .seq = 1ULL << 40,
			       .n_runs = 3, .runs = runs}, d;
	uint8_t *buf;
	size_t len;

	CHECK(pdx_tp_msg_encode(&m, &buf, &len) == PDX_OK, "a step encodes");
	CHECK(pdx_tp_msg_decode(buf, len, &d) == PDX_OK, "and decodes");
	CHECK(d.kind == PDX_TP_STEP && d.seq == m.seq && d.n_runs == 3,
	      "kind, sequence number and runs come back");
	for (uint32_t i = 0; i < 3 && d.n_runs == 3; i++) {
		struct pdx_tp_run *r = &d.runs[i];

		CHECK(r->a == runs[i].a && r->b == runs[i].b &&
			  r->n_blocks == runs[i].n_blocks &&
			  (!r->n_blocks || !memcmp(r->blocks, runs[i].blocks,
						   4 * r->n_blocks)) &&
			  (r->b == r->a ||
			   !memcmp(r->hash, runs[i].hash, 8 * (r->b - r->a))),
		      "run %u: positions, blocks and hashes exact", i);
	}
	pdx_tp_msg_clear(&d);
	for (size_t cut = 0; cut < len; cut++)
		if (pdx_tp_msg_decode(buf, cut, &d) != PDX_EINVAL) {
			CHECK_FAIL("a step cut at %zu bytes is refused", cut);
			break;
		}
	buf[4] = PDX_TP_WIRE_VERSION + 1;
	CHECK(pdx_tp_msg_decode(buf, len, &d) == PDX_EINVAL,
	      "another version is refused");
	free(buf);
	runs[0].b = 2;
	CHECK(pdx_tp_msg_encode(&m, &buf, &len) == PDX_EINVAL,
	      "a run that ends before it starts is not encoded");
}

static void xfer_roundtrip(void)
{
	uint32_t blocks[] = {4, 5, 6}, tokens[] = {10, 11, 12, 13, 14};
	struct pdx_tp_msg m = {.kind = PDX_TP_RECV,
			       .n_block_ids = 3, .block_ids = blocks,
			       .n_tokens = 5, .tokens = tokens}, d;
	uint8_t *buf;
	size_t len;

	memset(m.xfer.b, 0x5a, sizeof(m.xfer.b));
	strcpy(m.peer, "tcp://127.0.0.1:5001");
	m.peers.n = 2;
	strcpy(m.peers.addr[0], "tcp://127.0.0.1:6001");
	strcpy(m.peers.addr[1], "tcp://[::1]:6002");
	CHECK(pdx_tp_msg_encode(&m, &buf, &len) == PDX_OK &&
		  pdx_tp_msg_decode(buf, len, &d) == PDX_OK,
	      "a recv action encodes and decodes");
	CHECK(d.kind == PDX_TP_RECV && !memcmp(&d.xfer, &m.xfer, 16) &&
		  !strcmp(d.peer, m.peer) && d.n_block_ids == 3 &&
		  !memcmp(d.block_ids, blocks, sizeof(blocks)) &&
		  d.n_tokens == 5 && !memcmp(d.tokens, tokens, sizeof(tokens)),
	      "its transfer id, peer, blocks and prompt come back");
	CHECK(d.peers.n == 2 && !strcmp(d.peers.addr[0], m.peers.addr[0]) &&
		  !strcmp(d.peers.addr[1], m.peers.addr[1]),
	      "and the other side's agents, in rank order");
	pdx_tp_msg_clear(&d);
	free(buf);
	m = (struct pdx_tp_msg){.kind = PDX_TP_EVENT, .status = PDX_EIO,
				.value = PDX_EVENT_FAILED};
	strcpy(m.text, "received KV differs at position 3");
	CHECK(pdx_tp_msg_encode(&m, &buf, &len) == PDX_OK &&
		  pdx_tp_msg_decode(buf, len, &d) == PDX_OK &&
		  d.status == PDX_EIO && !strcmp(d.text, m.text),
	      "an event's status and reason come back");
	pdx_tp_msg_clear(&d);
	free(buf);
	m.kind = PDX_TP_KIND_END;
	CHECK(pdx_tp_msg_encode(&m, &buf, &len) == PDX_EINVAL,
	      "an unknown kind is not encoded");
}

static void slices(void)
{
	const struct pdx_model *l8 = pdx_model_find("llama3-8b");
	const struct pdx_model *ds = pdx_model_find("deepseek-v3");
	struct pdx_tp_slice s;
	char err[200];

	CHECK(pdx_tp_slice(l8, 4, 3, &s, err, sizeof(err)) == 0 &&
		  s.head0 == 6 && s.heads == 2 && s.model.kv_heads == 2,
	      "llama3-8b rank 3 of 4 holds heads 6 and 7");
	CHECK(pdx_tp_slice(l8, 16, 0, &s, err, sizeof(err)) < 0 &&
		  strstr(err, "do not split evenly"),
	      "8 KV heads over 16 ranks: refused, saying why");
	CHECK(pdx_tp_slice(l8, 6, 0, &s, err, sizeof(err)) < 0 &&
		  strstr(err, "power of two"),
	      "TP 6: refused, saying why");
	CHECK(pdx_tp_slice(l8, 2, 2, &s, err, sizeof(err)) < 0,
	      "rank 2 of 2: refused");
	CHECK(pdx_tp_slice(ds, 8, 5, &s, err, sizeof(err)) == 0 &&
		  s.head0 == 0 && s.model.kv_heads == 1,
	      "deepseek-v3 (MLA): the latent on every rank");
}

/* tiny (2 heads) at TP 1 and each rank of TP 2: every head's bytes the
 * same, and the same token. */
static void head_bytes(void)
{
	const struct pdx_model *tiny = pdx_model_find("tiny");
	struct pdx_shm_pool pool[3] = {0};
	struct pdx_synth_seq seq[3];
	uint32_t tokens[30], table[8] = {0, 1, 2, 3, 4, 5, 6, 7}, bad;
	uint64_t hash[30];
	char name[64], err[128];
	uint64_t hb = tiny->head_dim * tiny->dtype_bytes;
	bool same = true;

	for (uint32_t i = 0; i < 30; i++)
		tokens[i] = i * 7 + 1;
	pdx_synth_hashes(PDX_SYNTH_HASH_SEED, tokens, 30, hash);
	for (int i = 0; i < 3; i++) {
		struct pdx_tp_slice s;

		pdx_tp_slice(tiny, i ? 2 : 1, i ? i - 1 : 0, &s, err,
			     sizeof(err));
		snprintf(name, sizeof(name), "/pdx-unit-tp-%d-%d",
			 (int)getpid(), i);
		if (pdx_shm_pool_create(&pool[i], name, &s.model, 8, err,
					sizeof(err))) {
			CHECK_FAIL("pool: %s", err);
			return;
		}
		seq[i] = (struct pdx_synth_seq){.layout = &pool[i].layout,
						.base = pool[i].base,
						.blocks = table,
						.hash = hash,
						.head0 = s.head0};
		for (uint32_t l = 0; l < tiny->layers; l++)
			pdx_synth_fill(&seq[i], l, 0, 30);
	}
	for (uint32_t l = 0; l < tiny->layers; l++)
		for (uint32_t t = 0; t < 2; t++)
			for (uint32_t p = 0; p < 30; p++)
				for (uint32_t h = 0; h < 2; h++) {
					uint64_t at = (p % 4) * 2 * hb + h * hb;
					uint64_t at_r = (p % 4) * hb;

					if (memcmp(pdx_shm_pool_block(&pool[0],
								      l, t,
								      p / 4) +
						       at,
						   pdx_shm_pool_block(
						       &pool[1 + h], l, t,
						       p / 4) +
						       at_r,
						   hb))
						same = false;
				}
	CHECK(same, "each head's bytes at TP 2 are those at TP 1");
	CHECK(pdx_synth_check(&seq[2], 0, 30, &bad),
	      "rank 1's check passes on its own heads");
	seq[2].head0 = 0;
	CHECK(!pdx_synth_check(&seq[2], 0, 30, &bad),
	      "and fails for another rank's heads");
	CHECK_EQ(pdx_synth_next_token(&seq[0], 30, 1024),
		 pdx_synth_next_token(&seq[1], 30, 1024),
		 "rank 0 of TP 2 reads the token TP 1 reads");
	for (int i = 0; i < 3; i++)
		pdx_shm_pool_destroy(&pool[i]);
}

int main(void)
{
	step_roundtrip();
	xfer_roundtrip();
	slices();
	head_bytes();
	CHECK_DONE();
}
