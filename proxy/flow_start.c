/* Which flow a call runs (flow.h): the proxy's --flow, chosen once per
 * call and kept in it, so a retry (flow_common.c) runs the same flow again
 * without calling up into this file. */
#include "proxy/flow.h"

#include "proxy/call.h"

void pdx_flow_start(struct pdx_call *c)
{
	c->retry = pdx_flow_retry;
	switch (c->px->o->flow) {
	case PDX_FLOW_CONCURRENT:
		c->flow = pdx_flow_concurrent;
		break;
	case PDX_FLOW_EARLY_CALLBACK:
		c->flow = pdx_flow_early_callback;
		break;
	case PDX_FLOW_SGLANG:
		c->flow = pdx_flow_sglang;
		break;
	default:
		c->flow = pdx_flow_sequential;
	}
	c->flow(c);
}
