/* pdx-proxy's command line (see opts.h). Hand-rolled rather than
 * getopt_long because vLLM's proxy flags take lists
 * (--prefiller-hosts h1 h2 ...), which getopt cannot express. */
#include "proxy/opts.h"

#include <errno.h>
#include <event2/util.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/http_error.h"
#include "common/log.h"
#include "proxy/cors.h"
#include "proxy/dns_srv.h"

/* clang-format off */
void pdx_proxy_opts_usage(FILE *f)
{
	fprintf(f,
"usage: pdx-proxy [options]\n"
"\n"
"An OpenAI-compatible front door for disaggregated prefill/decode: picks a\n"
"prefill (P) and a decode (D) instance per request, drives both and streams\n"
"D's answer back (docs/proxy.md).\n"
"\n"
"  --host H                    listen address (default 127.0.0.1)\n"
"  --port P                    listen port (default 8000; 0: any free port,\n"
"                              printed as \"listening on http://H:P\")\n"
"  --prefill HOST:PORT         a prefill instance (repeatable)\n"
"  --decode HOST:PORT          a decode instance (repeatable)\n"
"  --prefill-dns NAME:PORT     prefill instances at every address of NAME's\n"
"                              A and AAAA records (a Kubernetes headless\n"
"                              Service), all on PORT: added when they\n"
"                              appear, drained when they vanish (repeatable)\n"
"  --prefill-dns NAME          the same from NAME's SRV records, each with\n"
"                              its port (a full name, e.g. Kubernetes'\n"
"                              _http._tcp.SERVICE.NAMESPACE.svc.cluster.local)\n"
"  --decode-dns NAME[:PORT]    the same for decode instances\n"
"  --dns-interval S            NAME asked again after its records' TTL, at\n"
"                              least 1 s and at most S (default 5)\n"
"  --dns-server IP[:PORT]      the nameserver to ask (default: those of\n"
"                              /etc/resolv.conf)\n"
"  --prefiller-hosts H...      vLLM example-proxy style lists, paired with\n"
"  --prefiller-ports P...        the ports in order (space or comma\n"
"  --decoder-hosts H...          separated)\n"
"  --decoder-ports P...\n"
"  --flow F                    concurrent (default: P and D at once, KV\n"
"                              pushed layer by layer), sequential\n"
"                              (vLLM-compatible: P, then D), early-callback\n"
"                              (D when P posts to /v1/metaserver), sglang\n"
"                              (SGLang instances: P and D at once with\n"
"                              bootstrap_host, bootstrap_port and\n"
"                              bootstrap_room, as SGLang's router; the\n"
"                              same as --prefill-kind sglang\n"
"                              --decode-kind sglang)\n"
"  --prefill-kind K            what the prefill (decode) instances are:\n"
"  --decode-kind K               pdx (default: kv_transfer_params, as\n"
"                              pdx-engine and vLLM take them) or sglang\n"
"                              (SGLang servers: bootstrap fields); a pool\n"
"                              of sglang runs the sglang flow, and with\n"
"                              the other pool pdx the proxy joins the two\n"
"                              (P sglang, D pdx: D gets P's agent from\n"
"                              P's bootstrap server and the room's\n"
"                              xfer_id; P pdx, D sglang: the proxy runs a\n"
"                              bootstrap server per P that names P's\n"
"                              agent); --flow sglang makes a pool whose\n"
"                              kind is not given sglang\n"
"  --bootstrap-host H          where SGLang decode instances reach those\n"
"                              bootstrap servers (they listen on --host;\n"
"                              default --host, 127.0.0.1 for a wildcard)\n"
"  --metaserver-url URL        where prefill engines post their early\n"
"                              callback (default http://H:P/v1/metaserver\n"
"                              of this proxy; 127.0.0.1 for a wildcard H)\n"
"  --policy-p R, --policy-d R  round-robin (default), least-loaded (fewest\n"
"                              requests in flight plus transfers not yet\n"
"                              reported finished) or prefix-aware (one\n"
"                              instance per prompt prefix while it is not\n"
"                              much busier than the rest)\n"
"  --prefix-len BYTES          how much of a prompt's start prefix-aware\n"
"                              looks at: text bytes, 4 per token id\n"
"                              (default 1024)\n"
"  --notify-bind ADDR          receive the agents' transfer notifications\n"
"                              (agents' --notify) on this ZeroMQ address,\n"
"                              tcp://HOST:PORT or ipc://PATH; without it\n"
"                              least-loaded counts requests only\n"
"  --transfer-timeout S        a transfer no agent reported finished is\n"
"                              no longer counted after this (default 60)\n"
"  --admin-token T             bearer token for /admin/*; without it the\n"
"                              admin API answers 403 (or the environment\n"
"                              variable PDX_PROXY_ADMIN_TOKEN)\n"
"  --allowed-origins LIST      web pages of these origins may call the\n"
"                              proxy from a browser (CORS): \"*\" or\n"
"                              http(s)://HOST[:PORT],... (default none;\n"
"                              vLLM's server allows every origin)\n"
"  --connect-timeout MS        connecting to an engine (default 5000)\n"
"  --first-byte-timeout MS     until an engine's response starts\n"
"                              (default 60000)\n"
"  --idle-timeout S            between reads of a response (default 300)\n"
"  --max-body BYTES            client request body; more gets 413\n"
"                              (default 8388608, pdx-engine's own; a\n"
"                              request that outgrows it by more than\n"
"                              64 KiB once the proxy's fields are added\n"
"                              gets 413 too)\n"
"  --max-inflight N            client requests at once; more get 429\n"
"                              (default 4096; lowered to what the file\n"
"                              descriptor limit allows)\n"
"  --keepalive N               idle connections kept per engine instance\n"
"                              for reuse (default 64, at most 64; 0: a new\n"
"                              connection per request)\n"
"  --keepalive-timeout MS      an idle engine connection is closed after\n"
"                              this (default 2000; keep it under the\n"
"                              engines' own, e.g. 5000 for vLLM)\n"
"  --on-prefill-failure F      fail (default): a prefill leg that fails\n"
"                              fails the request; local: D gets the\n"
"                              client's request as it came and prefills\n"
"                              itself (also fronts colocated engines that\n"
"                              refuse kv_transfer_params)\n"
"  --on-transfer-failure F     fail (default): a decode request whose KV\n"
"                              transfer fails ends with an error;\n"
"                              recompute: D prefills it itself (concurrent\n"
"                              and early-callback flows; the sequential\n"
"                              flow passes P's parameters unchanged)\n"
"  --retries N                 a request whose prefill or decode leg\n"
"                              fails before the client got a byte (no\n"
"                              connection, a timeout, a 5xx) starts over\n"
"                              on other instances with a new transfer, at\n"
"                              most N times (default 1; 0: never)\n"
"  --health-interval MS        GET /health of every instance this often,\n"
"                              and its GET /v1/models while unknown\n"
"                              (default 2000; 0: no health checks)\n"
"  --health-timeout MS         one health check's bound (default 1000)\n"
"  --unhealthy-after K         failed checks in a row that take an\n"
"                              instance out of rotation (default 2)\n"
"  --healthy-after K           passed checks in a row that bring it back\n"
"                              (default 2)\n"
"  --breaker-failures N        failed requests in a row (no answer, a\n"
"                              timeout, a 5xx) that open an instance's\n"
"                              circuit breaker (default 5; 0: never)\n"
"  --breaker-open-ms MS        how long an open breaker sends nothing to\n"
"                              its instance before one trial request\n"
"                              (default 5000; sooner once health checks\n"
"                              saw the instance go and come back)\n"
"  --drain-timeout S           after SIGTERM, SIGINT or SIGHUP: new\n"
"                              requests get 503, those in flight may\n"
"                              finish for S seconds, then the rest are\n"
"                              cut short (503, or a stream's error\n"
"                              event); a second signal cuts them at\n"
"                              once (default 30; 0: at once)\n"
"  --log-level L               error, warn, info, debug (default info)\n"
"  --version                   print \"pdx-proxy VERSION\" and exit\n"
"  --help                      this text\n");
}
/* clang-format on */

const char *pdx_proxy_flow_name(enum pdx_proxy_flow f)
{
	switch (f) {
	case PDX_FLOW_SEQUENTIAL:
		return "sequential";
	case PDX_FLOW_CONCURRENT:
		return "concurrent";
	case PDX_FLOW_EARLY_CALLBACK:
		return "early-callback";
	case PDX_FLOW_SGLANG:
		return "sglang";
	}
	return "?";
}

const char *pdx_proxy_kind_name(enum pdx_proxy_kind k)
{
	return k == PDX_KIND_SGLANG ? "sglang" : "pdx";
}

static int parse_ulong(const char *name, const char *s, unsigned long lo,
		       unsigned long hi, unsigned long *out, char *err,
		       size_t errlen)
{
	unsigned long long v;
	char *end;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || *s == '-' || v < lo || v > hi) {
		snprintf(err, errlen, "%s: '%s' is not a number in [%lu, %lu]",
			 name, s, lo, hi);
		return -1;
	}
	*out = (unsigned long)v;
	return 0;
}

/* A list option's values: the following arguments up to the next one
 * starting with "--", each split at commas. */
struct list {
	unsigned n;
	char v[PDX_PROXY_MAX_ARGS][PDX_POOL_ADDR_MAX];
};

static int list_take(const char *name, int argc, char **argv, int *k,
		     struct list *l, char *err, size_t errlen)
{
	int first = *k + 1;

	while (*k + 1 < argc && strncmp(argv[*k + 1], "--", 2)) {
		char *s = argv[++*k];

		while (*s) {
			size_t len = strcspn(s, ",");

			if (len) {
				if (l->n == PDX_PROXY_MAX_ARGS ||
				    len >= PDX_POOL_ADDR_MAX) {
					snprintf(
					    err, errlen,
					    "%s: too many or too long values",
					    name);
					return -1;
				}
				memcpy(l->v[l->n], s, len);
				l->v[l->n++][len] = '\0';
			}
			s += len + (s[len] == ',');
		}
	}
	if (*k + 1 == first) {
		snprintf(err, errlen, "%s needs at least one value", name);
		return -1;
	}
	return 0;
}

static int add_addr(char (*dst)[PDX_POOL_ADDR_MAX], unsigned *n,
		    const char *name, const char *v, char *err, size_t errlen)
{
	char host[PDX_POOL_ADDR_MAX];
	uint16_t port;

	if (pdx_pool_addr_parse(v, host, sizeof(host), &port, err, errlen))
		return -1;
	if (*n == PDX_PROXY_MAX_ARGS) {
		snprintf(err, errlen, "%s: at most %d instances", name,
			 PDX_PROXY_MAX_ARGS);
		return -1;
	}
	snprintf(dst[(*n)++], PDX_POOL_ADDR_MAX, "%s", v);
	return 0;
}

/* A decode instance given, to be found by DNS, or to be added through
 * the admin API: else the proxy could never serve (it listened, and
 * answered 503 to everything, started bare by mistake). */
static int decode_coming(const struct pdx_proxy_opts *o, char *err,
			 size_t errlen)
{
	if (o->n_decode || o->admin_token)
		return 0;
	for (unsigned k = 0; k < o->n_dns; k++)
		if (o->dns[k].role == PDX_POOL_DECODE)
			return 0;
	snprintf(err, errlen, "no decode instance: give --decode HOST:PORT, "
		 "--decode-dns NAME, or --admin-token to add instances "
		 "through the admin API");
	return -1;
}

/* --prefill-dns or --decode-dns: NAME:PORT (A and AAAA records) or NAME
 * (SRV records), checked here, resolved by discovery.c. */
static int add_dns(struct pdx_proxy_opts *o, enum pdx_pool_role role,
		   const char *name, const char *v, char *err, size_t errlen)
{
	char host[PDX_POOL_ADDR_MAX];
	uint8_t query[512];
	uint16_t port;
	bool ok;

	if (strchr(v, ':'))
		ok = !pdx_pool_addr_parse(v, host, sizeof(host), &port, err,
					  errlen);
	else /* a name an SRV query can carry */
		ok = pdx_dns_srv_query(0, v, query, sizeof(query)) > 0;
	if (!ok) {
		snprintf(err, errlen,
			 "%s: want NAME:PORT or an SRV NAME, got '%s'", name,
			 v);
		return -1;
	}
	if (o->n_dns == PDX_DISCOVERY_NAMES) {
		snprintf(err, errlen, "%s: at most %d DNS names", name,
			 PDX_DISCOVERY_NAMES);
		return -1;
	}
	o->dns[o->n_dns].role = role;
	o->dns[o->n_dns++].name = v;
	return 0;
}

/* vLLM's lists: hosts and ports paired in order. */
static int pair_lists(const char *what, struct list *hosts, struct list *ports,
		      char (*dst)[PDX_POOL_ADDR_MAX], unsigned *n, char *err,
		      size_t errlen)
{
	char addr[2 * PDX_POOL_ADDR_MAX + 8];

	if (hosts->n != ports->n) {
		snprintf(err, errlen,
			 "--%s-hosts has %u values but --%s-ports %u", what,
			 hosts->n, what, ports->n);
		return -1;
	}
	for (unsigned i = 0; i < hosts->n; i++) {
		snprintf(addr, sizeof(addr),
			 strchr(hosts->v[i], ':') ? "[%s]:%s" : "%s:%s",
			 hosts->v[i], ports->v[i]);
		if (strlen(addr) >= PDX_POOL_ADDR_MAX) {
			snprintf(err, errlen, "--%s-hosts: host too long",
				 what);
			return -1;
		}
		if (add_addr(dst, n, what, addr, err, errlen))
			return -1;
	}
	return 0;
}

/* The resilience options: plain numbers in a range. */
static const struct {
	const char *name;
	size_t off;
	unsigned long lo, hi;
} uint_options[] = {
    {"--retries", offsetof(struct pdx_proxy_opts, retries), 0, 10},
    {"--health-interval", offsetof(struct pdx_proxy_opts, health_interval_ms),
     0, 3600000},
    {"--health-timeout", offsetof(struct pdx_proxy_opts, health_timeout_ms), 1,
     600000},
    {"--unhealthy-after", offsetof(struct pdx_proxy_opts, unhealthy_after), 1,
     100},
    {"--healthy-after", offsetof(struct pdx_proxy_opts, healthy_after), 1, 100},
    {"--breaker-failures", offsetof(struct pdx_proxy_opts, breaker_failures), 0,
     1000},
    {"--breaker-open-ms", offsetof(struct pdx_proxy_opts, breaker_open_ms), 1,
     3600000},
    {"--drain-timeout", offsetof(struct pdx_proxy_opts, drain_timeout_s), 0,
     86400},
    {"--dns-interval", offsetof(struct pdx_proxy_opts, dns_interval_s), 1,
     3600},
};

/* Sets the option name if it is one of uint_options (true); *bad says
 * whether its value was refused (the reason in err). */
static bool uint_option(const char *name, const char *val,
			struct pdx_proxy_opts *o, bool *bad, char *err,
			size_t errlen)
{
	unsigned long v;

	for (size_t k = 0; k < sizeof(uint_options) / sizeof(*uint_options);
	     k++) {
		if (strcmp(name, uint_options[k].name))
			continue;
		*bad = parse_ulong(name, val, uint_options[k].lo,
				   uint_options[k].hi, &v, err, errlen) != 0;
		if (!*bad)
			*(unsigned *)((char *)o + uint_options[k].off) =
			    (unsigned)v;
		return true;
	}
	return false;
}

/* The pools' kinds from --prefill-kind, --decode-kind (kind[], -1: not
 * given) and --flow: an SGLang pool needs the sglang flow, which needs
 * one. */
static int kinds(struct pdx_proxy_opts *o, const int kind[2],
		 bool flow_given, char *err, size_t errlen)
{
	enum pdx_proxy_kind dflt =
	    o->flow == PDX_FLOW_SGLANG ? PDX_KIND_SGLANG : PDX_KIND_PDX;

	o->kind_p = kind[0] < 0 ? dflt : (enum pdx_proxy_kind)kind[0];
	o->kind_d = kind[1] < 0 ? dflt : (enum pdx_proxy_kind)kind[1];
	if (o->kind_p == PDX_KIND_PDX && o->kind_d == PDX_KIND_PDX) {
		if (o->flow != PDX_FLOW_SGLANG)
			return 0;
		snprintf(err, errlen, "--flow sglang with both pools of kind "
				      "pdx: no SGLang instance to serve");
		return -1;
	}
	if (flow_given && o->flow != PDX_FLOW_SGLANG) {
		snprintf(err, errlen,
			 "--flow %s: a pool of kind sglang runs the sglang "
			 "flow",
			 pdx_proxy_flow_name(o->flow));
		return -1;
	}
	o->flow = PDX_FLOW_SGLANG;
	return 0;
}

static void defaults(struct pdx_proxy_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->host = "127.0.0.1";
	o->port = 8000;
	o->log_level = "info";
	o->connect_timeout_ms = 5000;
	o->first_byte_timeout_ms = 60000;
	o->idle_timeout_s = 300;
	o->max_body = PDX_HTTP_MAX_BODY;
	o->max_inflight = 4096;
	o->keepalive = PDX_POOL_IDLE_MAX;
	o->keepalive_ms = 2000;
	o->prefix_len = 1024;
	o->transfer_timeout_s = 60;
	o->retries = 1;
	o->health_interval_ms = 2000;
	o->health_timeout_ms = 1000;
	o->unhealthy_after = 2;
	o->healthy_after = 2;
	o->breaker_failures = 5;
	o->breaker_open_ms = 5000;
	o->drain_timeout_s = 30;
	o->dns_interval_s = 5;
	/* from the environment, so the token need not show in ps */
	o->admin_token = getenv("PDX_PROXY_ADMIN_TOKEN");
	if (o->admin_token && !*o->admin_token)
		o->admin_token = NULL;
}

enum pdx_proxy_opts_result pdx_proxy_opts_parse(int argc, char **argv,
						struct pdx_proxy_opts *o,
						char *err, size_t errlen)
{
	static struct list ph, pp, dh, dp;
	int kind[2] = {-1, -1}; /* P's and D's, -1 until given */
	bool flow_given = false;
	unsigned long v;
	bool bad;

	defaults(o);
	memset(&ph, 0, sizeof(ph));
	memset(&pp, 0, sizeof(pp));
	memset(&dh, 0, sizeof(dh));
	memset(&dp, 0, sizeof(dp));
	for (int k = 1; k < argc; k++) {
		const char *a = argv[k], *val = NULL;
		char name[64];
		const char *eq = strchr(a, '=');

		if (!strcmp(a, "--help") || !strcmp(a, "-h"))
			return PDX_PROXY_OPTS_HELP;
		if (!strcmp(a, "--version"))
			return PDX_PROXY_OPTS_VERSION;
		if (strncmp(a, "--", 2) ||
		    (eq && (size_t)(eq - a) >= sizeof(name))) {
			snprintf(err, errlen, "unexpected argument '%s'", a);
			return PDX_PROXY_OPTS_BAD;
		}
		snprintf(name, sizeof(name), "%.*s",
			 eq ? (int)(eq - a) : (int)strlen(a), a);
		if (!strcmp(name, "--prefiller-hosts") ||
		    !strcmp(name, "--prefiller-ports") ||
		    !strcmp(name, "--decoder-hosts") ||
		    !strcmp(name, "--decoder-ports")) {
			struct list *l =
			    name[2] == 'p'
				? (strstr(name, "hosts") ? &ph : &pp)
				: (strstr(name, "hosts") ? &dh : &dp);
			char *one[] = {NULL, (char *)(eq ? eq + 1 : NULL)};
			int j = 0;

			if (eq) { /* --x=a,b: the one value */
				if (list_take(name, 2, one, &j, l, err, errlen))
					return PDX_PROXY_OPTS_BAD;
			} else if (list_take(name, argc, argv, &k, l, err,
					     errlen)) {
				return PDX_PROXY_OPTS_BAD;
			}
			continue;
		}
		if (eq) {
			val = eq + 1;
		} else if (k + 1 < argc) {
			val = argv[++k];
		} else {
			snprintf(err, errlen, "%s needs a value", name);
			return PDX_PROXY_OPTS_BAD;
		}
		if (!strcmp(name, "--host")) {
			o->host = val;
		} else if (!strcmp(name, "--port")) {
			if (parse_ulong(name, val, 0, 65535, &v, err, errlen))
				return PDX_PROXY_OPTS_BAD;
			o->port = (uint16_t)v;
		} else if (!strcmp(name, "--prefill")) {
			if (add_addr(o->prefill, &o->n_prefill, name, val, err,
				     errlen))
				return PDX_PROXY_OPTS_BAD;
		} else if (!strcmp(name, "--decode")) {
			if (add_addr(o->decode, &o->n_decode, name, val, err,
				     errlen))
				return PDX_PROXY_OPTS_BAD;
		} else if (!strcmp(name, "--prefill-dns") ||
			   !strcmp(name, "--decode-dns")) {
			if (add_dns(o,
				    name[2] == 'p' ? PDX_POOL_PREFILL
						   : PDX_POOL_DECODE,
				    name, val, err, errlen))
				return PDX_PROXY_OPTS_BAD;
		} else if (!strcmp(name, "--dns-server")) {
			struct sockaddr_storage ss;
			int len = sizeof(ss);

			if (evutil_parse_sockaddr_port(
				val, (struct sockaddr *)&ss, &len)) {
				snprintf(err, errlen,
					 "%s: want IP[:PORT], got '%s'", name,
					 val);
				return PDX_PROXY_OPTS_BAD;
			}
			o->dns_server = val;
		} else if (!strcmp(name, "--flow")) {
			flow_given = true;
			if (!strcmp(val, "sequential"))
				o->flow = PDX_FLOW_SEQUENTIAL;
			else if (!strcmp(val, "concurrent"))
				o->flow = PDX_FLOW_CONCURRENT;
			else if (!strcmp(val, "early-callback"))
				o->flow = PDX_FLOW_EARLY_CALLBACK;
			else if (!strcmp(val, "sglang"))
				o->flow = PDX_FLOW_SGLANG;
			else
				goto bad_choice;
		} else if (!strcmp(name, "--prefill-kind") ||
			   !strcmp(name, "--decode-kind")) {
			if (!strcmp(val, "pdx"))
				kind[name[2] == 'd'] = PDX_KIND_PDX;
			else if (!strcmp(val, "sglang"))
				kind[name[2] == 'd'] = PDX_KIND_SGLANG;
			else
				goto bad_choice;
		} else if (!strcmp(name, "--bootstrap-host")) {
			o->bootstrap_host = val;
		} else if (!strcmp(name, "--metaserver-url")) {
			if (strncmp(val, "http://", 7) ||
			    strlen(val) >= PDX_PROXY_URL_MAX) {
				snprintf(err, errlen,
					 "%s: want an http:// URL shorter "
					 "than %d bytes",
					 name, PDX_PROXY_URL_MAX);
				return PDX_PROXY_OPTS_BAD;
			}
			o->metaserver_url = val;
		} else if (!strcmp(name, "--policy-p") ||
			   !strcmp(name, "--policy-d")) {
			if (pdx_pool_policy_parse(val, name[9] == 'p'
							   ? &o->policy_p
							   : &o->policy_d))
				goto bad_choice;
		} else if (!strcmp(name, "--prefix-len")) {
			if (parse_ulong(name, val, 1, 1u << 20, &v, err,
					errlen))
				return PDX_PROXY_OPTS_BAD;
			o->prefix_len = v;
		} else if (!strcmp(name, "--notify-bind")) {
			if (strncmp(val, "tcp://", 6) && strncmp(val, "ipc://", 6)) {
				snprintf(err, errlen,
					 "%s: want tcp://HOST:PORT or ipc://PATH",
					 name);
				return PDX_PROXY_OPTS_BAD;
			}
			o->notify_bind = val;
		} else if (!strcmp(name, "--transfer-timeout")) {
			if (parse_ulong(name, val, 1, 86400, &v, err, errlen))
				return PDX_PROXY_OPTS_BAD;
			o->transfer_timeout_s = v;
		} else if (!strcmp(name, "--admin-token")) {
			if (!*val) {
				snprintf(err, errlen, "--admin-token is empty");
				return PDX_PROXY_OPTS_BAD;
			}
			o->admin_token = val;
		} else if (!strcmp(name, "--allowed-origins")) {
			if (pdx_cors_origins_check(val, err, errlen))
				return PDX_PROXY_OPTS_BAD;
			o->allowed_origins = val;
		} else if (!strcmp(name, "--log-level")) {
			o->log_level = val;
		} else if (!strcmp(name, "--connect-timeout")) {
			if (parse_ulong(name, val, 1, 3600000, &v, err, errlen))
				return PDX_PROXY_OPTS_BAD;
			o->connect_timeout_ms = v;
		} else if (!strcmp(name, "--first-byte-timeout")) {
			if (parse_ulong(name, val, 1, 86400000, &v, err,
					errlen))
				return PDX_PROXY_OPTS_BAD;
			o->first_byte_timeout_ms = v;
		} else if (!strcmp(name, "--idle-timeout")) {
			if (parse_ulong(name, val, 1, 86400, &v, err, errlen))
				return PDX_PROXY_OPTS_BAD;
			o->idle_timeout_s = v;
		} else if (!strcmp(name, "--max-body")) {
			if (parse_ulong(name, val, 1024, 1ul << 30, &v, err,
					errlen))
				return PDX_PROXY_OPTS_BAD;
			o->max_body = v;
		} else if (!strcmp(name, "--on-prefill-failure")) {
			if (!strcmp(val, "fail"))
				o->prefill_fallback = false;
			else if (!strcmp(val, "local"))
				o->prefill_fallback = true;
			else
				goto bad_choice;
		} else if (!strcmp(name, "--on-transfer-failure")) {
			if (!strcmp(val, "fail"))
				o->transfer_recompute = false;
			else if (!strcmp(val, "recompute"))
				o->transfer_recompute = true;
			else
				goto bad_choice;
		} else if (!strcmp(name, "--max-inflight")) {
			if (parse_ulong(name, val, 1, 1000000, &v, err, errlen))
				return PDX_PROXY_OPTS_BAD;
			o->max_inflight = v;
		} else if (!strcmp(name, "--keepalive")) {
			if (parse_ulong(name, val, 0, PDX_POOL_IDLE_MAX, &v,
					err, errlen))
				return PDX_PROXY_OPTS_BAD;
			o->keepalive = v;
		} else if (!strcmp(name, "--keepalive-timeout")) {
			if (parse_ulong(name, val, 1, 3600000, &v, err, errlen))
				return PDX_PROXY_OPTS_BAD;
			o->keepalive_ms = v;
		} else if (uint_option(name, val, o, &bad, err, errlen)) {
			if (bad)
				return PDX_PROXY_OPTS_BAD;
		} else {
			snprintf(err, errlen, "unknown option '%s'", name);
			return PDX_PROXY_OPTS_BAD;
		}
		continue;
	bad_choice:
		snprintf(err, errlen, "%s: unknown value '%s'", name, val);
		return PDX_PROXY_OPTS_BAD;
	}
	if (pair_lists("prefiller", &ph, &pp, o->prefill, &o->n_prefill, err,
		       errlen) ||
	    pair_lists("decoder", &dh, &dp, o->decode, &o->n_decode, err,
		       errlen))
		return PDX_PROXY_OPTS_BAD;
	if (kinds(o, kind, flow_given, err, errlen) ||
	    decode_coming(o, err, errlen))
		return PDX_PROXY_OPTS_BAD;
	if (pdx_log_set_level(o->log_level) < 0) {
		snprintf(err, errlen, "--log-level '%s': want error, warn, info "
			 "or debug", o->log_level);
		return PDX_PROXY_OPTS_BAD;
	}
	return PDX_PROXY_OPTS_RUN;
}
