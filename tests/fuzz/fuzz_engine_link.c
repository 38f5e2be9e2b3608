/* The engine link (agent/engine_link.c): register (layout and regions),
 * send, recv, layer_done, token, abort, as frames from the engine, with
 * the rest of an agent behind them (agent_harness.h). Nothing is
 * registered before the input: it may register itself, and peer frames
 * may answer its hellos. */
#include "tests/fuzz/agent_harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct agent a;

	if (size < 1)
		return 0;
	fa_init(&a, data[0]);
	fa_feed(&a, data + 1, size - 1);
	fa_free(&a);
	return 0;
}
