/* The bootstrap server pdx-proxy runs for a prefill instance of kind pdx
 * (pdx-engine) whose transfers go to SGLang decode instances: SGLang's
 * decode side (pdx.sglang's receiver) asks the bootstrap_host and _port
 * the request names for the prefill rank's agent, and a pdx-engine has
 * no bootstrap server. One listener per such instance (the routes name
 * no instance and no room), on this proxy's --host at a port the kernel
 * picks, answering what pdx.sglang's own server answers for rank 0:
 *   GET /route?prefill_dp_rank=-1&target_tp_rank=-1&target_pp_rank=-1
 *       the sizes: one rank (attn_tp_size, pp_size, dp_size 1)
 *   GET /route?prefill_dp_rank=0&target_tp_rank=0&target_pp_rank=0
 *       rank 0: the instance's agent (peer_addr); no layout (shape
 *       null): the agents compare layouts when they pair
 *   GET /health
 * Any other rank: 404. Started when first needed; it lives as long as
 * its instance (pool.c frees it).
 *
 * One thread (the proxy's loop).
 */
#ifndef PDX_PROXY_SGLANG_BOOT_H
#define PDX_PROXY_SGLANG_BOOT_H

#include <stddef.h>

struct pdx_inst;
struct pdx_proxy;

/* Starts p's bootstrap server unless it runs (p->boot), its port in
 * p->bootstrap_port; -1 with the reason in err. */
int pdx_sglang_boot_open(struct pdx_proxy *px, struct pdx_inst *p, char *err,
			 size_t errlen);

/* The host SGLang decode instances reach this proxy's bootstrap servers
 * at: --bootstrap-host, else --host (127.0.0.1 for a wildcard). */
const char *pdx_sglang_boot_host(const struct pdx_proxy *px);

#endif
