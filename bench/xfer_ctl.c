/* pdx-xferbench --one-block: the engine-link ping and the agents' trace
 * lines (xfer_ctl.h). */
#include "bench/xfer_ctl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/mp.h"

struct xc_ping {
	void *ctx;
	void *sock;
	int64_t seq;
};

struct xc_ping *xc_ping_open(const char *engine, char *err, size_t errlen)
{
	struct xc_ping *p = calloc(1, sizeof(*p));
	int linger = 0;

	if (!p) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	p->ctx = zmq_ctx_new();
	p->sock = p->ctx ? zmq_socket(p->ctx, ZMQ_DEALER) : NULL;
	if (!p->sock ||
	    zmq_setsockopt(p->sock, ZMQ_LINGER, &linger, sizeof(linger)) ||
	    zmq_connect(p->sock, engine)) {
		snprintf(err, errlen, "ping socket to %s: %s", engine,
			 zmq_strerror(errno));
		xc_ping_close(p);
		return NULL;
	}
	return p;
}

/* Whether buf is the pong of seq (an earlier one that timed out is
 * skipped). */
static bool is_pong(const void *buf, size_t len, int64_t seq)
{
	msgpack_unpacked msg;
	char op[16];
	int64_t got = -1;
	bool ok = false;

	if (!pdx_mp_parse(buf, len, &msg, op, sizeof(op)))
		ok = !strcmp(op, "pong") &&
		     !pdx_mp_get_i64(&msg.data, "seq", &got) && got == seq;
	msgpack_unpacked_destroy(&msg);
	return ok;
}

int xc_ping(struct xc_ping *p, int timeout_ms, uint64_t *rtt_ns, char *err,
	    size_t errlen)
{
	uint64_t t0, deadline;
	struct pdx_mp_out o;
	int rc;

	p->seq++;
	pdx_mp_out_init(&o);
	msgpack_pack_map(&o.pk, 2);
	pdx_mp_kv_str(&o.pk, "op", "ping");
	pdx_mp_kv_i64(&o.pk, "seq", p->seq);
	t0 = pdx_now_ns();
	deadline = t0 + (uint64_t)timeout_ms * 1000000ULL;
	rc = zmq_send(p->sock, o.buf.data, o.buf.size, 0);
	pdx_mp_out_free(&o);
	if (rc < 0) {
		snprintf(err, errlen, "ping: %s", zmq_strerror(errno));
		return -1;
	}
	for (;;) {
		zmq_pollitem_t it = { p->sock, 0, ZMQ_POLLIN, 0 };
		uint64_t now = pdx_now_ns();
		zmq_msg_t m;

		if (now >= deadline) {
			snprintf(err, errlen, "no pong in %d ms", timeout_ms);
			return -1;
		}
		if (zmq_poll(&it, 1, (long)((deadline - now) / 1000000) + 1) < 0 &&
		    errno != EINTR) {
			snprintf(err, errlen, "ping: %s", zmq_strerror(errno));
			return -1;
		}
		zmq_msg_init(&m);
		if (zmq_msg_recv(&m, p->sock, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&m);
			continue;
		}
		now = pdx_now_ns();
		rc = is_pong(zmq_msg_data(&m), zmq_msg_size(&m), p->seq);
		zmq_msg_close(&m);
		if (rc) {
			*rtt_ns = now - t0;
			return 0;
		}
	}
}

void xc_ping_close(struct xc_ping *p)
{
	if (!p)
		return;
	if (p->sock)
		zmq_close(p->sock);
	if (p->ctx)
		zmq_ctx_term(p->ctx);
	free(p);
}

bool xc_trace_parse(const char *line, char hex[33], bool *send,
		    uint64_t marks[MARK_N])
{
	static const char tag[] = " trace: ";
	const char *s = strstr(line, tag);
	size_t n;

	if (!s)
		return false;
	s += strlen(tag);
	n = strspn(s, "0123456789abcdef");
	if (n != 32 || (strncmp(s + 32, " send", 5) && strncmp(s + 32, " recv", 5)))
		return false;
	memcpy(hex, s, 32);
	hex[32] = '\0';
	*send = s[33] == 's';
	memset(marks, 0, MARK_N * sizeof(*marks));
	for (s += 37; (s = strchr(s, ' ')) != NULL;) {
		const char *eq = strchr(++s, '=');

		if (!eq)
			break;
		for (enum xfer_mark m = 0; m < MARK_N; m++) {
			const char *name = xfer_mark_name(m);

			if ((size_t)(eq - s) == strlen(name) &&
			    !strncmp(s, name, strlen(name)))
				marks[m] = strtoull(eq + 1, NULL, 10);
		}
	}
	return true;
}
