/* pdx-proxy's command line: parsed into plain values and checked, never
 * logged here (the caller prints the reason and exits 2).
 *
 * Pure; one thread. Strings point into argv or into the struct itself.
 */
#ifndef PDX_PROXY_OPTS_H
#define PDX_PROXY_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "proxy/discovery.h"
#include "proxy/pool.h"

/* Instances given on the command line, per role. */
#define PDX_PROXY_MAX_ARGS 64
#define PDX_PROXY_URL_MAX 160

enum pdx_proxy_flow {
	PDX_FLOW_CONCURRENT,	 /* P and D at once, layer-wise push */
	PDX_FLOW_SEQUENTIAL,	 /* vLLM-compatible: P (max_tokens=1), then D */
	PDX_FLOW_EARLY_CALLBACK, /* D when P posts to /v1/metaserver */
	PDX_FLOW_SGLANG,	 /* P and D at once with SGLang's bootstrap */
};

/* What a pool's instances are (--prefill-kind, --decode-kind): how the
 * proxy hands a transfer to them. */
enum pdx_proxy_kind {
	PDX_KIND_PDX,	 /* kv_transfer_params: pdx-engine, vLLM */
	PDX_KIND_SGLANG, /* SGLang's bootstrap_host, _port and _room */
};

struct pdx_proxy_opts {
	const char *host;	    /* listen address: 127.0.0.1 */
	uint16_t port;		    /* 8000; 0: any free port */
	enum pdx_proxy_flow flow;   /* concurrent; sglang with an SGLang pool */
	enum pdx_proxy_kind kind_p, kind_d; /* pdx; --flow sglang: sglang */
	const char *metaserver_url; /* NULL: this proxy's /v1/metaserver */
	const char *bootstrap_host; /* NULL: host (sglang_boot.h) */
	enum pdx_pool_policy policy_p, policy_d; /* round-robin */
	size_t prefix_len;	/* prefix-aware's key: 1024 bytes */
	const char *notify_bind; /* agents' notifications; NULL: none */
	unsigned transfer_timeout_s; /* an unreported transfer: 60 */
	const char *admin_token;     /* or $PDX_PROXY_ADMIN_TOKEN; NULL: 403 */
	const char *allowed_origins; /* CORS (cors.h); NULL: none */
	const char *log_level;	     /* info */
	unsigned connect_timeout_ms; /* 5000 */
	unsigned first_byte_timeout_ms; /* 60000 */
	unsigned idle_timeout_s;	/* between reads of a response: 300 */
	size_t max_body;		/* client request body: 8 MiB */
	unsigned max_inflight;		/* client requests at once: 4096 */
	unsigned keepalive;    /* idle engine connections per instance: 64 */
	unsigned keepalive_ms; /* an idle engine connection expires: 2000 */
	bool prefill_fallback; /* --on-prefill-failure local: D prefills */
	bool transfer_recompute; /* --on-transfer-failure recompute */
	unsigned retries; /* starts over after a failure before any byte: 1 */
	unsigned health_interval_ms; /* between health checks: 2000; 0: off */
	unsigned health_timeout_ms;  /* one health check: 1000 */
	unsigned unhealthy_after;    /* failed checks in a row: 2 */
	unsigned healthy_after;	     /* passed checks in a row: 2 */
	unsigned breaker_failures;   /* failed requests in a row: 5; 0: off */
	unsigned breaker_open_ms;    /* 5000 */
	unsigned drain_timeout_s;    /* after SIGTERM: 30; 0: abort at once */
	/* --prefill-dns, --decode-dns NAME:PORT, in order (discovery.h) */
	unsigned n_dns;
	struct {
		enum pdx_pool_role role;
		const char *name;
	} dns[PDX_DISCOVERY_NAMES];
	unsigned dns_interval_s; /* the most between two DNS rounds: 5 */
	const char *dns_server;	 /* HOST[:PORT]; NULL: /etc/resolv.conf */
	unsigned n_prefill, n_decode;
	char prefill[PDX_PROXY_MAX_ARGS][PDX_POOL_ADDR_MAX]; /* "host:port" */
	char decode[PDX_PROXY_MAX_ARGS][PDX_POOL_ADDR_MAX];
};

enum pdx_proxy_opts_result {
	PDX_PROXY_OPTS_RUN = 0,
	PDX_PROXY_OPTS_HELP = 1, /* --help: exit 0 */
	PDX_PROXY_OPTS_VERSION = 2, /* --version: exit 0 */
	PDX_PROXY_OPTS_BAD = -1, /* reason in err: exit 2 */
};

/* Fills o from argv, defaults first. */
enum pdx_proxy_opts_result pdx_proxy_opts_parse(int argc, char **argv,
						struct pdx_proxy_opts *o,
						char *err, size_t errlen);

void pdx_proxy_opts_usage(FILE *f);

const char *pdx_proxy_flow_name(enum pdx_proxy_flow f);
const char *pdx_proxy_kind_name(enum pdx_proxy_kind k);

#endif
