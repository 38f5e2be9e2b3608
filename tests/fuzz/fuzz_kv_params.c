/* kv_transfer_params as the reference engine reads it
 * (engine/kv_params.c): any JSON value. What it accepts must be a
 * transfer an agent can take (16-byte id, its hex, a peer address; the
 * prefill side may have neither id nor peer) and give an answer object. */
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_params.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct pdx_kv_params p;
	json_t *o, *answer;
	char msg[256], hex[33];

	o = json_loadb((const char *)data, size,
		       JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
	if (!o)
		return 0;
	msg[0] = '\0';
	if (pdx_kv_params_parse(o, 32000, &p, msg, sizeof(msg))) {
		if (!msg[0])
			abort();
	} else if (p.role != PDX_KV_NONE) {
		/* a prefill side may be told neither (it mints the id) */
		bool told = p.role == PDX_KV_RECV;

		pdx_xfer_id_hex(&p.xfer, hex);
		if ((strcmp(hex, p.xfer_hex) && (told || p.xfer_hex[0])) ||
		    (told && !p.remote_agent[0]) || p.first_token >= 32000 ||
		    (p.metaserver[0] && strncmp(p.metaserver, "http://", 7)))
			abort();
		answer =
		    pdx_kv_params_answer(&p, "tcp://self:1", p.first_token);
		if (!json_is_object(answer))
			abort();
		json_decref(answer);
	}
	json_decref(o);
	return 0;
}
