/* The sequential flow (vLLM-compatible): P gets the request with
 * max_tokens=1, stream=false and kv_transfer_params.do_remote_decode =
 * true; P's returned kv_transfer_params go unchanged into D's request
 * (opaque to the proxy, so real vLLM engines with vLLM's own connectors
 * work behind it); D's response is relayed to the client as it arrives.
 * P returning no kv_transfer_params (a colocated engine) sends D the
 * client's request as it came, and D computes the prefill itself. An
 * empty prefill pool sends every request straight to D, and so does a
 * failed prefill leg under --on-prefill-failure local.
 *
 * D is picked first: P's kv_transfer_params name D's agent
 * (remote_agent, from D's GET /v1/pdx/info, asked once per instance) so
 * P's agent knows where to push. The proxy also names each transfer: an
 * xfer_id (32 hex digits, 128 random bits) unless the client sent one.
 *
 * One thread. Ends the call in every case.
 */
#ifndef PDX_PROXY_FLOW_SEQUENTIAL_H
#define PDX_PROXY_FLOW_SEQUENTIAL_H

struct pdx_call;

/* c->body holds the client's JSON object; c->path the route. */
void pdx_flow_sequential(struct pdx_call *c);

#endif
