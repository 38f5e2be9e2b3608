/* The operations on an endpoint (see ucx.h): puts, gets, active messages
 * and flushes, each one UCX request the worker (ucx.c) follows, and the
 * peer's memory keys they use. */
#include <stdlib.h>
#include <string.h>

#include "transport/ucx_ep.h"
#include "transport/ucx_internal.h"

struct pdx_ucx_rkey {
	ucp_rkey_h rkey;
};

pdx_status_t pdx_ucx_rkey_unpack(struct pdx_ucx_ep *ep, const void *buf,
				 size_t len, struct pdx_ucx_rkey **out)
{
	struct pdx_ucx_rkey *r = calloc(1, sizeof(*r));
	ucs_status_t s;

	(void)len;
	if (!r)
		return PDX_ENOMEM;
	s = ucp_ep_rkey_unpack(ep->ep, buf, &r->rkey);
	if (s != UCS_OK) {
		free(r);
		return from_ucs(s);
	}
	*out = r;
	return PDX_OK;
}

void pdx_ucx_rkey_free(struct pdx_ucx_rkey *r)
{
	if (!r)
		return;
	ucp_rkey_destroy(r->rkey);
	free(r);
}

/* A put from our buf into the remote address, or a get from it into buf:
 * one operation, the same request either way. */
static pdx_status_t rma(struct pdx_ucx_ep *ep, bool put, void *buf,
			size_t len, struct pdx_ucx_mem *mem,
			uint64_t remote_addr, struct pdx_ucx_rkey *rkey,
			pdx_ucx_done_cb cb, void *arg)
{
	struct op *o = ucx_op_new(ep->u, cb, arg);
	ucp_request_param_t p;

	if (!o)
		return PDX_ENOMEM;
	p = ucx_op_param(o, mem);
	return ucx_op_started(o, put ? ucp_put_nbx(ep->ep, buf, len, remote_addr,
						   rkey->rkey, &p)
				     : ucp_get_nbx(ep->ep, buf, len, remote_addr,
						   rkey->rkey, &p));
}

pdx_status_t pdx_ucx_put(struct pdx_ucx_ep *ep, const void *src, size_t len,
			 struct pdx_ucx_mem *src_mem, uint64_t remote_addr,
			 struct pdx_ucx_rkey *rkey, pdx_ucx_done_cb cb, void *arg)
{
	return rma(ep, true, (void *)src, len, src_mem, remote_addr, rkey, cb,
		   arg);
}

pdx_status_t pdx_ucx_get(struct pdx_ucx_ep *ep, void *dst, size_t len,
			 struct pdx_ucx_mem *dst_mem, uint64_t remote_addr,
			 struct pdx_ucx_rkey *rkey, pdx_ucx_done_cb cb, void *arg)
{
	return rma(ep, false, dst, len, dst_mem, remote_addr, rkey, cb, arg);
}

static pdx_status_t am_send(struct pdx_ucx_ep *ep, unsigned id,
			    const void *hdr, size_t hdr_len, const void *src,
			    size_t len, struct pdx_ucx_mem *src_mem,
			    uint32_t protocol, pdx_ucx_done_cb cb, void *arg)
{
	struct op *o;
	ucp_request_param_t p;

	if (hdr_len > PDX_UCX_AM_HDR_MAX)
		return PDX_EINVAL;
	o = ucx_op_new(ep->u, cb, arg);
	if (!o)
		return PDX_ENOMEM;
	memcpy(o->hdr, hdr, hdr_len);
	if (protocol == UCP_AM_SEND_FLAG_EAGER && len) {
		if (!(o->payload = malloc(len))) {
			ucx_op_drop(o);
			return PDX_ENOMEM;
		}
		src = memcpy(o->payload, src, len);
	}
	p = ucx_op_param(o, src_mem);
	if (protocol) {
		p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
		p.flags = protocol;
	}
	return ucx_op_started(o, ucp_am_send_nbx(ep->ep, id, o->hdr, hdr_len,
						 src, len, &p));
}

pdx_status_t pdx_ucx_am_send(struct pdx_ucx_ep *ep, unsigned id,
			     const void *hdr, size_t hdr_len, const void *src,
			     size_t len, struct pdx_ucx_mem *src_mem,
			     pdx_ucx_done_cb cb, void *arg)
{
	return am_send(ep, id, hdr, hdr_len, src, len, src_mem, 0, cb, arg);
}

pdx_status_t pdx_ucx_am_send_eager(struct pdx_ucx_ep *ep, unsigned id,
				   const void *hdr, size_t hdr_len,
				   const void *src, size_t len,
				   pdx_ucx_done_cb cb, void *arg)
{
	return am_send(ep, id, hdr, hdr_len, src, len, NULL,
		       UCP_AM_SEND_FLAG_EAGER, cb, arg);
}

pdx_status_t pdx_ucx_am_send_rndv(struct pdx_ucx_ep *ep, unsigned id,
				  const void *hdr, size_t hdr_len,
				  const void *src, size_t len,
				  struct pdx_ucx_mem *src_mem,
				  pdx_ucx_done_cb cb, void *arg)
{
	return am_send(ep, id, hdr, hdr_len, src, len, src_mem,
		       UCP_AM_SEND_FLAG_RNDV, cb, arg);
}

pdx_status_t pdx_ucx_flush(struct pdx_ucx_ep *ep, pdx_ucx_done_cb cb, void *arg)
{
	struct op *o = ucx_op_new(ep->u, cb, arg);
	ucp_request_param_t p;

	if (!o)
		return PDX_ENOMEM;
	p = ucx_op_param(o, NULL);
	return ucx_op_started(o, ucp_ep_flush_nbx(ep->ep, &p));
}
