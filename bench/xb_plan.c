/* The plan pdx-xferbench's parent and engines share, and the pipes'
 * records (xb_plan.h). */
#define _GNU_SOURCE
#include "bench/xb_plan.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench/xb_fail.h"

static void *shared_alloc(size_t *used, size_t n)
{
	static uint8_t *area;
	static size_t cap;
	void *p;

	if (!area) {
		cap = *used;
		area = mmap(NULL, cap, PROT_READ | PROT_WRITE,
			    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (area == MAP_FAILED)
			xb_fail("mmap shared area: %s", strerror(errno));
		*used = 0;
		return NULL;
	}
	n = (n + 63) & ~(size_t)63;
	if (*used + n > cap)
		xb_fail("shared area too small");
	p = area + *used;
	*used += n;
	return p;
}

void xb_plan_alloc(struct xb_plan *p)
{
	size_t c = p->conc, nb = p->nblocks, rows = p->rows;
	size_t need = 64 * 16 + c * (sizeof(struct pdx_xfer_id) + 8) +
		      rows * (c * 5 * 8 + 2 * 8) + 2 * c * nb * 4 +
		      XB_TP_MAX * PDX_ADDR_MAX + 16 * 64;
	size_t used = need;

	shared_alloc(&used, 0);
	p->ids = shared_alloc(&used, c * sizeof(*p->ids));
	p->seeds = shared_alloc(&used, c * 8);
	p->src = shared_alloc(&used, c * nb * 4);
	p->dst = shared_alloc(&used, c * nb * 4);
	p->peers = shared_alloc(&used, XB_TP_MAX * PDX_ADDR_MAX);
	p->t_send = shared_alloc(&used, rows * c * 8);
	p->t_sent = shared_alloc(&used, rows * c * 8);
	p->t_recv = shared_alloc(&used, rows * c * 8);
	p->t_recv_agent = shared_alloc(&used, rows * c * 8);
	p->ev_bytes = shared_alloc(&used, rows * c * 8);
	p->t_first_ld = shared_alloc(&used, rows * 8);
	p->t_last_ld = shared_alloc(&used, rows * 8);
	p->shape = shared_alloc(&used, sizeof(*p->shape));
}

int xb_plan_xfer_index(const struct xb_plan *p, const struct pdx_xfer_id *x)
{
	for (uint32_t c = 0; c < p->shape->conc; c++)
		if (!memcmp(p->ids[c].b, x->b, sizeof(x->b)))
			return (int)c;
	return -1;
}

uint32_t xb_plan_rank_heads(const struct pdx_model *m, uint32_t tp)
{
	return m->tensors == 1 ? m->kv_heads : m->kv_heads / tp;
}

uint64_t xb_plan_rank_bytes(const struct xb_plan *p,
			    const struct xb_shape *sh)
{
	const struct pdx_model *m = p->model;

	return (uint64_t)(sh->nblocks - sh->skip_blocks) * m->layers *
	       m->tensors * m->block_tokens *
	       xb_plan_rank_heads(m, sh->decode_tp) * m->head_dim *
	       m->dtype_bytes;
}

uint64_t xb_plan_shape_bytes(const struct xb_plan *p,
			     const struct xb_shape *sh)
{
	return xb_plan_rank_bytes(p, sh) * sh->decode_tp;
}

uint64_t xb_plan_xfer_bytes(const struct xb_plan *p)
{
	return xb_plan_shape_bytes(p, p->shape);
}

/* All len bytes, through EINTR and short transfers; -1 at EOF or error. */
static int io_all(int fd, char *p, size_t len, bool out)
{
	while (len) {
		ssize_t n = out ? write(fd, p, len) : read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int xb_write_all(int fd, const void *buf, size_t len)
{
	return io_all(fd, (char *)buf, len, true);
}

int xb_read_all(int fd, void *buf, size_t len)
{
	return io_all(fd, buf, len, false);
}
