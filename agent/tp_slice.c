/* Which KV heads two TP ranks exchange (docs/protocol.md, "TP legs"):
 * rank r of TP n holds heads [r * H / n, (r + 1) * H / n) of H; a leg
 * moves the overlap of its sender's and its receiver's heads, as pieces
 * contiguous on both sides. Pure arithmetic: it calls nothing. */
#include <stdio.h>

#include "agent/agent.h"
#include "common/kv_order.h"

void tp_leg_id(const struct pdx_xfer_id *xfer, uint32_t sender,
	       uint32_t receiver, struct pdx_xfer_id *out)
{
	uint32_t v = 0x80000000u | (sender & 0x7fff) << 16 | (receiver & 0xffff);

	*out = *xfer;
	for (int i = 0; i < 4; i++)
		out->b[12 + i] ^= (uint8_t)(v >> (24 - 8 * i));
}

bool tp_slice_of(uint32_t heads, struct tp_rank s, struct tp_rank r,
		 struct tp_slice *out)
{
	uint32_t s_lo = s.rank * (heads / s.size), s_hi = s_lo + heads / s.size;
	uint32_t r_lo = r.rank * (heads / r.size), r_hi = r_lo + heads / r.size;
	uint32_t lo = s_lo > r_lo ? s_lo : r_lo, hi = s_hi < r_hi ? s_hi : r_hi;

	if (lo >= hi)
		return false;
	*out = (struct tp_slice){ .src_head = lo - s_lo, .dst_head = lo - r_lo,
				  .n = hi - lo };
	return true;
}

/* The latent is on every rank: receiver j reads it from sender j % p.
 * With p > d the senders outnumber the receivers: each other sender i
 * with i % d == j hears a want for nothing from j, and ends at once. */
bool tp_mla_pair(struct tp_rank s, struct tp_rank r, bool *skip_all)
{
	*skip_all = false;
	if (s.rank == r.rank % s.size)
		return true;
	*skip_all = s.size > r.size && s.rank % r.size == r.rank;
	return *skip_all;
}

const char *tp_size_refusal(uint32_t size, char *why, size_t len)
{
	if (size && !(size & (size - 1)) && size <= 0x7fff)
		return NULL;
	snprintf(why, len, "tp size %u is not a power of two (1..16384)", size);
	return why;
}

/* The lanes that move a slice of heads (and convert the order). */
static bool path_moves_slices(enum data_path path)
{
	return path == DATA_IPC || path == DATA_PUT || path == DATA_AM ||
	       path == DATA_CUDA_IPC;
}

const char *tp_slice_refusal(const struct tp_slice *s, enum data_path path,
			     struct tp_rank from, struct tp_rank to, char *why,
			     size_t len)
{
	if (!s->n || path_moves_slices(path))
		return NULL; /* whole blocks go by any path */
	snprintf(why, len, "TP %u -> %u over the %s lane is not supported yet "
		 "(ipc, put, am and cuda-ipc are)", from.size, to.size,
		 data_path_key(path));
	return why;
}

void tp_order_slice(struct xfer *x, const struct peer *p)
{
	const struct pdx_kv_layout *ours = &x->agent->reg.layout;
	/* one head: NHD and HND are the same bytes */
	bool convert = p->layout.order != ours->order && ours->kv_heads > 1;

	if (x->slice.n && !x->order_slice)
		return; /* a TP leg's heads */
	/* decided again each time: the peer's engine may have registered
	 * again, in the other order, since the last */
	x->order_slice = convert;
	x->slice = (struct tp_slice){ .n = convert ? ours->kv_heads : 0 };
}

uint64_t tp_slice_block_bytes(const struct tp_slice *s,
			      const struct pdx_kv_layout *l)
{
	return (uint64_t)s->n * l->head_dim * l->dtype_bytes * l->block_tokens;
}

/* Bytes from one token's head to the next token's, and to the next
 * head's, inside a block of l: NHD is [tokens][heads][dim], HND
 * [heads][tokens][dim]. */
static void head_steps(const struct pdx_kv_layout *l, uint64_t head,
		       uint64_t *per_token, uint64_t *per_head)
{
	if (l->order == PDX_KV_HND) {
		*per_token = head;
		*per_head = head * l->block_tokens;
	} else {
		*per_token = head * l->kv_heads;
		*per_head = head;
	}
}

/* The piece of one block that moves heads [src_head, src_head + n) of a
 * src block to [dst_head, ...) of a dst block: a row per head and token,
 * in the src block's order (NHD: a group per token of a row per head;
 * HND: a group per head of a row per token), so that src is read front
 * to back and dst written strided (NHD to HND the other way round took
 * 1.4 times as long); then rows and groups that lie end to end on both
 * sides folded into longer rows (equal orders: HND one row, NHD one per
 * token; between the orders a row per head and token stays). */
static struct pdx_kv_piece piece_of_slice(const struct tp_slice *s,
				       const struct pdx_kv_layout *src,
				       const struct pdx_kv_layout *dst)
{
	uint64_t head = (uint64_t)src->head_dim * src->dtype_bytes;
	uint64_t src_tok, src_head, dst_tok, dst_head;
	bool by_token = src->order == PDX_KV_NHD;
	struct pdx_kv_piece p = { .len = head };

	head_steps(src, head, &src_tok, &src_head);
	head_steps(dst, head, &dst_tok, &dst_head);
	p.src_off = s->src_head * src_head;
	p.dst_off = s->dst_head * dst_head;
	p.groups = by_token ? src->block_tokens : s->n;
	p.rows = by_token ? s->n : src->block_tokens;
	p.src_group = by_token ? src_tok : src_head;
	p.dst_group = by_token ? dst_tok : dst_head;
	p.src_stride = by_token ? src_head : src_tok;
	p.dst_stride = by_token ? dst_head : dst_tok;
	for (int fold = 0; fold < 2; fold++) {
		if (p.rows > 1 && p.src_stride == p.len &&
		    p.dst_stride == p.len) { /* a group's rows end to end */
			p.len *= p.rows;
			p.rows = 1;
		}
		if (p.groups > 1 && p.src_group == p.len &&
		    p.dst_group == p.len) { /* the groups end to end */
			p.len *= p.groups;
			p.groups = 1;
		}
	}
	if (p.groups == 1)
		p.src_group = p.dst_group = 0;
	if (p.rows == 1)
		p.src_stride = p.dst_stride = 0;
	return p;
}

bool tp_slice_in_rows(const struct xfer *x)
{
	struct pdx_kv_piece p;

	if (!x->slice.n || !x->peer)
		return false;
	p = x->role == XFER_RECV ? piece_of_slice(&x->slice, &x->peer->layout,
						  &x->agent->reg.layout)
				 : piece_of_slice(&x->slice, &x->agent->reg.layout,
						  &x->peer->layout);
	return (uint64_t)p.groups * p.rows > 1;
}

pdx_status_t tp_slice_each_piece(struct xfer *x, const struct tp_slice *s,
				 const struct pdx_kv_layout *src,
				 const struct pdx_kv_layout *dst, uint32_t count,
				 tp_piece_fn fn, const void *ctx)
{
	uint64_t sbb = pdx_kv_layout_block_bytes(src);
	uint64_t dbb = pdx_kv_layout_block_bytes(dst);
	struct pdx_kv_piece p = piece_of_slice(s, src, dst);
	pdx_status_t st = PDX_OK;

	for (uint32_t k = 0; k < count && !st; k++) {
		struct pdx_kv_piece q = p;

		q.src_off += k * sbb;
		q.dst_off += k * dbb;
		st = fn(x, ctx, &q);
	}
	return st;
}

const char *tp_heads_refusal(const struct pdx_kv_layout *a, struct tp_rank ta,
			     const struct pdx_kv_layout *b, struct tp_rank tb,
			     char *why, size_t len)
{
	if (tp_size_refusal(tb.size, why, len))
		return why;
	if (tb.rank >= tb.size)
		snprintf(why, len, "tp rank %u of size %u", tb.rank, tb.size);
	else if (a->tensors == 1 && a->kv_heads != b->kv_heads)
		snprintf(why, len, "kv_heads %u != %u (MLA: every rank holds "
			 "the whole latent)", a->kv_heads, b->kv_heads);
	else if (a->tensors != 1 && (uint64_t)a->kv_heads * ta.size !=
					    (uint64_t)b->kv_heads * tb.size)
		snprintf(why, len, "kv_heads %u x tp %u = %llu != %u x tp %u = "
			 "%llu", a->kv_heads, ta.size,
			 (unsigned long long)a->kv_heads * ta.size, b->kv_heads,
			 tb.size, (unsigned long long)b->kv_heads * tb.size);
	else
		return NULL;
	return why;
}

const char *tp_peer_refusal(const struct xfer *x, const struct peer *p,
			    char *why, size_t len)
{
	struct tp_rank me = x->agent->reg.tp;

	if (x->group && (p->tp.rank != x->peer_tp.rank ||
			 p->tp.size != x->peer_tp.size)) {
		snprintf(why, len, "%s is rank %u of TP %u, not rank %u of TP %u "
			 "as listed", p->addr, p->tp.rank, p->tp.size,
			 x->peer_tp.rank, x->peer_tp.size);
		return why;
	}
	/* a receiver holding every block moves nothing to convert */
	if (x->order_slice && x->skip < x->n_blocks &&
	    !path_moves_slices(p->path)) {
		enum pdx_kv_order ours = x->agent->reg.layout.order;
		bool recv = x->role == XFER_RECV;

		snprintf(why, len, "KV blocks of order %s into %s over the %s "
			 "lane are not supported yet (ipc, put, am and cuda-ipc "
			 "convert)", pdx_kv_order_name(recv ? p->layout.order : ours),
			 pdx_kv_order_name(recv ? ours : p->layout.order),
			 data_path_key(p->path));
		return why;
	}
	return x->role == XFER_RECV
		       ? tp_slice_refusal(&x->slice, p->path, p->tp, me, why,
					  len)
		       : tp_slice_refusal(&x->slice, p->path, me, p->tp, why,
					  len);
}
