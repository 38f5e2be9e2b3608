/* layout_mismatch: the decode engine registers head_dim 32 where the
 * prefill engine has 16. A transfer between them fails on the decode side
 * with a reason naming head_dim, and the prefill side fails too (within its
 * per-transfer timeout at the latest); no byte is placed.
 */
#include <stdio.h>
#include <string.h>

#include "tests/integ/harness.h"

#define TMO_MS 3000

int main(int argc, char **argv)
{
	struct h_opts o = { 0 };
	struct pdx_engine_event ev;
	struct h_env env;
	struct h_xfer x[1];

	h_note("layout_mismatch: decode head_dim 32, prefill head_dim 16");
	o.d_head_dim = 32;
	o.xfer_timeout_ms = TMO_MS;
	if (h_setup(&env, argc, argv, &o)) {
		check_failures++;
		return h_finish(&env);
	}
	h_plan(&env, x, 1, 4, 0, true);
	pb_fill(&env.p.pool, x[0].seed, x[0].src, x[0].n, 0);
	pb_poison(&env.d.pool, x[0].dst, x[0].n, 0);
	h_post_recv(&env, x, 1);
	h_post_send(&env, x, 1);
	for (uint32_t l = 0; l < env.p.pool.layout.layers; l++)
		h_layer_done(&env, l, x, 1);

	if (h_wait(&env.d, &x[0].id, TMO_MS + 3000, &ev) == 0) {
		CHECK_EQ(ev.kind, PDX_EVENT_FAILED, "decode: the recv fails (%s)",
		      h_kind(ev.kind));
		CHECK(strstr(ev.reason, "head_dim") != NULL,
		      "decode: the reason names head_dim (\"%s\", %s)", ev.reason,
		      pdx_status_str(ev.status));
	} else {
		CHECK(false, "decode: an event within %d ms", TMO_MS + 3000);
	}
	if (h_wait(&env.p, &x[0].id, TMO_MS + 3000, &ev) == 0)
		CHECK_EQ(ev.kind, PDX_EVENT_FAILED, "prefill: the send fails (%s: %s)",
		      h_kind(ev.kind), ev.reason);
	else
		CHECK(false, "prefill: an event within %d ms", TMO_MS + 3000);
	/* the decode blocks are still poisoned: nothing was placed */
	{
		bool untouched = true;

		for (uint32_t i = 0; i < x[0].n && untouched; i++) {
			const uint8_t *b = pdx_shm_pool_block(&env.d.pool, 0, 0,
							      x[0].dst[i]);

			for (uint64_t k = 0; k < env.d.pool.block_bytes; k++)
				if (b[k]) {
					untouched = false;
					break;
				}
		}
		CHECK(untouched, "decode blocks were not written");
	}
	h_plan_free(x, 1);
	return h_finish(&env);
}
