/* The peer link (agent/peer_dispatch.c, handshake.c): hello and
 * hello_ack (layout and regions checked against ours), hello_nack, want
 * with its block list, done,
 * abort, error, and the data messages a peer sends (agent/path_am.c,
 * am_slice.c), with
 * the rest of an agent behind them (agent_harness.h). Before the input the
 * engine has registered and the peer FA_PEER has said hello, so a want or
 * done goes straight to a transfer. */
#include "tests/fuzz/agent_harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct agent a;

	if (size < 1)
		return 0;
	fa_init(&a, data[0]);
	fa_register(&a);
	fa_hello(&a);
	fa_feed(&a, data + 1, size - 1);
	fa_free(&a);
	return 0;
}
