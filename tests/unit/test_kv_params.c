/* kv_transfer_params as the engine reads it (engine/kv_params.h): the two
 * sides, the optional decode fields, every refusal, the prefill side's
 * answer, and a TP instance's agents as listed. */
#include <stdlib.h>
#include <string.h>

#include "engine/kv_params.h"
#include "tests/check.h"

#define X "00112233445566778899aabbccddeeff"

static int parse(const char *text, struct pdx_kv_params *p, char *msg)
{
	json_t *o = text ? json_loads(text, 0, NULL) : NULL;
	int rc = pdx_kv_params_parse(o, 1024, p, msg, 256);

	json_decref(o);
	return rc;
}

static void sides(void)
{
	struct pdx_kv_params p;
	char msg[256];

	CHECK_EQ(parse(NULL, &p, msg), 0);
	CHECK_EQ(p.role, PDX_KV_NONE);
	CHECK_EQ(parse("{\"do_remote_decode\": false}", &p, msg), 0);
	CHECK_EQ(p.role, PDX_KV_NONE);
	CHECK_EQ(parse("{\"xfer_id\": \"" X
		       "\", \"remote_agent\": \"tcp://h:1\","
		       " \"do_remote_prefill\": true}",
		       &p, msg),
		 0);
	CHECK_EQ(p.role, PDX_KV_RECV);
	CHECK(!strcmp(p.xfer_hex, X) && p.xfer.b[15] == 0xff);
	CHECK(!strcmp(p.remote_agent, "tcp://h:1"));
	CHECK(p.first_token == -1 && !p.recompute);
	CHECK_EQ(parse("{\"xfer_id\": \"" X
		       "\", \"remote_agent\": \"tcp://h:1\","
		       " \"do_remote_prefill\": true, \"first_token\": 7,"
		       " \"on_failure\": \"recompute\"}",
		       &p, msg),
		 0);
	CHECK(p.first_token == 7 && p.recompute);
	CHECK_EQ(parse("{\"xfer_id\": \"" X
		       "\", \"remote_agent\": \"tcp://h:1\","
		       " \"do_remote_decode\": true}",
		       &p, msg),
		 0);
	CHECK_EQ(p.role, PDX_KV_SEND);
}

static void refusals(void)
{
	static const char *const bad[] = {
	    "[]",
	    "{\"do_remote_prefill\": true, \"do_remote_decode\": true}",
	    "{\"do_remote_prefill\": true, \"remote_agent\": \"tcp://h:1\"}",
	    "{\"do_remote_prefill\": true, \"remote_agent\": \"tcp://h:1\", "
	    "\"xfer_id\": \"0011\"}",
	    "{\"do_remote_prefill\": true, \"remote_agent\": \"tcp://h:1\", "
	    "\"xfer_id\": \"" X "0\"}",
	    "{\"do_remote_decode\": true, \"xfer_id\": \"0011\"}",
	    "{\"do_remote_decode\": true, \"remote_agent\": 7}",
	    /* an agent's address is tcp:// (a bare HOST:PORT: a 500) */
	    "{\"do_remote_prefill\": true, \"remote_agent\": \"h:1\", "
	    "\"xfer_id\": \"" X "\"}",
	    "{\"do_remote_prefill\": true, \"remote_agents\": [\"tcp://h:1\", "
	    "\"h:2\"], \"xfer_id\": \"" X "\"}",
	    "{\"do_remote_prefill\": true, \"remote_agent\": \"tcp://h:1\", "
	    "\"xfer_id\": \"" X "\", \"first_token\": 1024}",
	    "{\"do_remote_prefill\": true, \"remote_agent\": \"tcp://h:1\", "
	    "\"xfer_id\": \"" X "\", \"on_failure\": \"retry\"}",
	};
	struct pdx_kv_params p;
	char msg[256];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		json_t *o = json_loads(bad[i], 0, NULL);

		/* a text that is not JSON at all counts as refused too */
		CHECK(!o ||
		      pdx_kv_params_parse(o, 1024, &p, msg, sizeof(msg)) == -1);
		json_decref(o);
	}
	/* the decode side needs both: it cannot mint nor claim */
	CHECK_EQ(parse("{\"do_remote_prefill\": true, \"xfer_id\": \"" X "\"}",
		       &p, msg),
		 -1);
	CHECK_STR_CONTAINS(msg, "remote_agent");
}

/* What vLLM's example proxies send a prefill side: no id, no receiver,
 * keys of their own. The id is minted, the receiver left open. */
static void vllm_prefill(void)
{
	struct pdx_kv_params p;
	char msg[256], first[33];

	CHECK_EQ(parse("{\"do_remote_decode\": true, \"do_remote_prefill\":"
		       " false, \"remote_engine_id\": null, \"remote_block_ids\":"
		       " null, \"remote_host\": null, \"remote_port\": null}",
		       &p, msg),
		 0);
	CHECK_EQ(p.role, PDX_KV_SEND);
	CHECK(!p.xfer_hex[0] && !p.remote_agent[0]);
	CHECK_EQ(pdx_kv_params_mint(&p), 0);
	CHECK_EQ(strlen(p.xfer_hex), 32);
	strcpy(first, p.xfer_hex);
	CHECK_EQ(pdx_kv_params_mint(&p), 0); /* minted once */
	CHECK(!strcmp(first, p.xfer_hex));
	CHECK_EQ(parse("{\"do_remote_decode\": true, \"xfer_id\": null, "
		       "\"remote_agent\": null}", &p, msg), 0);
	CHECK_EQ(pdx_kv_params_mint(&p), 0);
	CHECK(strcmp(first, p.xfer_hex) != 0);
	/* an id given is kept, with the receiver open or named */
	CHECK_EQ(parse("{\"do_remote_decode\": true, \"xfer_id\": \"" X "\"}",
		       &p, msg),
		 0);
	CHECK_EQ(pdx_kv_params_mint(&p), 0);
	CHECK(!strcmp(p.xfer_hex, X) && !p.remote_agent[0]);
}

static void answer(void)
{
	struct pdx_kv_params p;
	char msg[256], *s;
	json_t *o;

	CHECK_EQ(parse("{\"xfer_id\": \"" X
		       "\", \"remote_agent\": \"tcp://d:1\","
		       " \"do_remote_decode\": true}",
		       &p, msg),
		 0);
	o = pdx_kv_params_answer(&p, "tcp://p:2", 42);
	CHECK(o != NULL);
	s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
	CHECK(!strcmp(s, "{\"do_remote_decode\":false,\"do_remote_prefill\":"
			 "true,\"first_token\":42,\"remote_agent\":\"tcp://"
			 "p:2\",\"xfer_id\":\"" X "\"}"));
	free(s);
	/* the answer is what a decode request reads */
	CHECK_EQ(pdx_kv_params_parse(o, 1024, &p, msg, sizeof(msg)), 0);
	CHECK(p.role == PDX_KV_RECV && p.first_token == 42);
	CHECK(!strcmp(p.remote_agent, "tcp://p:2"));
	json_decref(o);
}

/* A TP instance's agents, rank order: the same list as JSON
 * (/v1/pdx/info) and joined by commas (/health's X-PDX-Agent). */
static void peers(void)
{
	struct pdx_kv_peers own = {
	    .n = 3, .addr = {"tcp://a:1", "tcp://b:2", "tcp://c:3"}};
	char joined[PDX_KV_PEERS_JOIN_MAX], cut[12];
	json_t *a = pdx_kv_peers_json(&own);
	char *s = json_dumps(a, JSON_COMPACT);

	CHECK(s && !strcmp(s, "[\"tcp://a:1\",\"tcp://b:2\",\"tcp://c:3\"]"));
	free(s);
	json_decref(a);
	pdx_kv_peers_join(&own, joined, sizeof(joined));
	CHECK(!strcmp(joined, "tcp://a:1,tcp://b:2,tcp://c:3"));
	pdx_kv_peers_join(&own, cut, sizeof(cut));
	CHECK(!strcmp(cut, "tcp://a:1,t"));
	own.n = 0;
	pdx_kv_peers_join(&own, joined, sizeof(joined));
	CHECK(!strcmp(joined, ""));
}

int main(void)
{
	sides();
	refusals();
	vllm_prefill();
	answer();
	peers();
	CHECK_DONE();
}
