/* The engine client's side of the engine link (lib/parse.c,
 * lib/inflight.c): frames from the agent classified as the client does
 * (events parsed and queued as while a register waits, answers to
 * register read, with the reason of a refusal), checking what an engine
 * would be handed.
 * The client's insides are linked statically (pdx_static_dep), as libpdx
 * does not export them; its sockets are never opened.
 *
 * Input: records of u16 length (little-endian) and that many bytes, each
 * one frame; the byte after a length picks the register answer's buffer
 * size. */
#include "lib/client.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_event(const struct pdx_engine_event *ev)
{
	if (ev->kind != PDX_EVENT_SENT && ev->kind != PDX_EVENT_RECEIVED &&
	    ev->kind != PDX_EVENT_FAILED)
		abort();
	if (ev->status > 0 || (ev->kind == PDX_EVENT_FAILED && !ev->status))
		abort();
	if (ev->first_token < -1 || ev->first_token > UINT32_MAX)
		abort();
	if (strnlen(ev->reason, sizeof(ev->reason)) == sizeof(ev->reason))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct pdx_engine e = {0};
	struct pdx_engine_event ev;

	pdx_log_level = PDX_LOG_ERROR;
	while (size >= 3) {
		size_t n = (size_t)data[0] | (size_t)data[1] << 8;
		size_t plen = data[2];
		char peer[256], why[PDX_REASON_MAX] = "";
		msgpack_unpacked up;
		struct pdx__frame f = {0};
		struct pdx__lane_offer offer;
		uint8_t *copy;
		pdx_status_t st = 1;
		char op[32];

		data += 3;
		size -= 3;
		n = n < size ? n : size;
		copy = malloc(n ? n : 1); /* exactly n: an over-read is caught */
		if (!copy)
			abort();
		memcpy(copy, data, n);
		f.data = copy;
		f.len = n;
		switch (pdx__classify(&f, &up, op, sizeof(op), &ev)) {
		case PDX__MSG_EVENT:
			check_event(&ev);
			pdx__queue_push(&e, &ev);
			break;
		case PDX__MSG_OTHER:
			if (pdx__register_answer(&up.data, op,
						 plen ? peer : NULL, plen, &st,
						 why, sizeof(why))) {
				if (st > 0 || st < -100000)
					abort();
				if (!st && plen && strnlen(peer, plen) == plen)
					abort();
				if (st && !why[0])
					abort(); /* a failure says why */
			}
			pdx__lane_offer_read(&up.data, &offer);
			if (offer.given &&
			    strnlen(offer.name, sizeof(offer.name)) ==
				sizeof(offer.name))
				abort();
			break;
		case PDX__MSG_SKIP:
			break;
		}
		msgpack_unpacked_destroy(&up);
		free(copy);
		data += n;
		size -= n;
	}
	while (pdx__queue_pop(&e, &ev))
		check_event(&ev);
	free(e.q);
	return 0;
}
