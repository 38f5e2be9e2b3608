/* The TP link's messages to bytes and back (layout in tp_wire.h). */
#include "engine/tp_wire.h"

#include <stdlib.h>
#include <string.h>

static const uint8_t magic[4] = {'P', 'D', 'X', 'T'};

/* A buffer that grows; a failed growth sticks (oom) and the caller
 * checks once at the end. */
struct wbuf {
	uint8_t *p;
	size_t len, cap;
	bool oom;
};

static void put(struct wbuf *w, const void *v, size_t n)
{
	if (w->oom)
		return;
	if (w->len + n > w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 256;
		uint8_t *p;

		while (cap < w->len + n)
			cap *= 2;
		p = realloc(w->p, cap);
		if (!p) {
			w->oom = true;
			return;
		}
		w->p = p;
		w->cap = cap;
	}
	memcpy(w->p + w->len, v, n);
	w->len += n;
}

/* Little-endian hosts only (docs/engine.md): the bytes are the value's. */
static void put_u8(struct wbuf *w, uint8_t v)
{
	put(w, &v, 1);
}

static void put_u32(struct wbuf *w, uint32_t v)
{
	put(w, &v, 4);
}

static void put_u64(struct wbuf *w, uint64_t v)
{
	put(w, &v, 8);
}

static void put_str(struct wbuf *w, const char *s, size_t max)
{
	uint16_t n = (uint16_t)strnlen(s, max - 1);

	put(w, &n, 2);
	put(w, s, n);
}

static void put_u32s(struct wbuf *w, const uint32_t *v, uint32_t n)
{
	put_u32(w, n);
	if (n)
		put(w, v, (size_t)n * 4);
}

pdx_status_t pdx_tp_msg_encode(const struct pdx_tp_msg *m, uint8_t **out,
			       size_t *len)
{
	struct wbuf w = {0};

	if (m->kind < PDX_TP_HELLO || m->kind >= PDX_TP_KIND_END)
		return PDX_EINVAL;
	for (uint32_t i = 0; i < m->n_runs; i++)
		if (m->runs[i].b < m->runs[i].a)
			return PDX_EINVAL;
	put(&w, magic, sizeof(magic));
	put_u8(&w, PDX_TP_WIRE_VERSION);
	put_u8(&w, (uint8_t)m->kind);
	put_u32(&w, m->rank);
	put_u32(&w, m->size);
	put_u32(&w, m->blocks);
	put_u64(&w, m->seq);
	put_u32(&w, (uint32_t)m->status);
	put_u32(&w, m->value);
	put(&w, m->xfer.b, sizeof(m->xfer.b));
	put_str(&w, m->peer, sizeof(m->peer));
	put_str(&w, m->text, sizeof(m->text));
	put_u32(&w, m->peers.n);
	for (uint32_t i = 0; i < m->peers.n && i < PDX_TP_MAX; i++)
		put_str(&w, m->peers.addr[i], sizeof(m->peers.addr[i]));
	put_u32s(&w, m->block_ids, m->n_block_ids);
	put_u32s(&w, m->tokens, m->n_tokens);
	put_u32(&w, m->n_runs);
	for (uint32_t i = 0; i < m->n_runs; i++) {
		const struct pdx_tp_run *r = &m->runs[i];

		put_u32(&w, r->a);
		put_u32(&w, r->b);
		put_u32s(&w, r->blocks, r->n_blocks);
		if (r->b > r->a)
			put(&w, r->hash, (size_t)(r->b - r->a) * 8);
	}
	if (w.oom) {
		free(w.p);
		return PDX_ENOMEM;
	}
	*out = w.p;
	*len = w.len;
	return PDX_OK;
}

/* A reader: every get fails once the bytes run out (bad sticks). */
struct rbuf {
	const uint8_t *p;
	size_t left;
	bool bad;
};

static bool get(struct rbuf *r, void *v, size_t n)
{
	if (r->bad || n > r->left) {
		r->bad = true;
		return false;
	}
	memcpy(v, r->p, n);
	r->p += n;
	r->left -= n;
	return true;
}

static uint32_t get_u32(struct rbuf *r)
{
	uint32_t v = 0;

	get(r, &v, 4);
	return v;
}

static void get_str(struct rbuf *r, char *s, size_t max)
{
	uint16_t n = 0;

	get(r, &n, 2);
	if (n >= max) {
		r->bad = true;
		n = 0;
	}
	get(r, s, n);
	s[r->bad ? 0 : n] = '\0';
}

/* n items of `size` bytes into a new array (NULL when n is 0); the count
 * is checked against the bytes left before anything is allocated. */
static void *get_array(struct rbuf *r, uint32_t n, size_t size, bool *oom)
{
	void *v;

	if (r->bad || !n)
		return NULL;
	if ((uint64_t)n * size > r->left) {
		r->bad = true;
		return NULL;
	}
	v = malloc((size_t)n * size);
	if (!v) {
		*oom = true;
		r->bad = true;
		return NULL;
	}
	get(r, v, (size_t)n * size);
	return v;
}

static void get_runs(struct rbuf *r, struct pdx_tp_msg *m, bool *oom)
{
	uint32_t n = get_u32(r);

	/* a run is at least 12 bytes */
	if (r->bad || !n || (uint64_t)n * 12 > r->left) {
		r->bad = r->bad || n;
		return;
	}
	m->runs = calloc(n, sizeof(*m->runs));
	if (!m->runs) {
		*oom = r->bad = true;
		return;
	}
	m->n_runs = n;
	for (uint32_t i = 0; i < n && !r->bad; i++) {
		struct pdx_tp_run *run = &m->runs[i];

		run->a = get_u32(r);
		run->b = get_u32(r);
		run->n_blocks = get_u32(r);
		run->blocks = get_array(r, run->n_blocks, 4, oom);
		if (run->b < run->a)
			r->bad = true;
		else
			run->hash = get_array(r, run->b - run->a, 8, oom);
	}
}

pdx_status_t pdx_tp_msg_decode(const uint8_t *buf, size_t len,
			       struct pdx_tp_msg *m)
{
	struct rbuf r = {.p = buf, .left = len};
	uint8_t head[4], version = 0, kind = 0;
	bool oom = false;

	memset(m, 0, sizeof(*m));
	if (!get(&r, head, 4) || memcmp(head, magic, 4) ||
	    !get(&r, &version, 1) || version != PDX_TP_WIRE_VERSION ||
	    !get(&r, &kind, 1) || kind < PDX_TP_HELLO ||
	    kind >= PDX_TP_KIND_END)
		return PDX_EINVAL;
	m->kind = (enum pdx_tp_kind)kind;
	m->rank = get_u32(&r);
	m->size = get_u32(&r);
	m->blocks = get_u32(&r);
	get(&r, &m->seq, 8);
	m->status = (int32_t)get_u32(&r);
	m->value = get_u32(&r);
	get(&r, m->xfer.b, sizeof(m->xfer.b));
	get_str(&r, m->peer, sizeof(m->peer));
	get_str(&r, m->text, sizeof(m->text));
	m->peers.n = get_u32(&r);
	if (m->peers.n > PDX_TP_MAX)
		r.bad = true;
	for (uint32_t i = 0; i < m->peers.n && !r.bad; i++)
		get_str(&r, m->peers.addr[i], sizeof(m->peers.addr[i]));
	m->n_block_ids = get_u32(&r);
	m->block_ids = get_array(&r, m->n_block_ids, 4, &oom);
	m->n_tokens = get_u32(&r);
	m->tokens = get_array(&r, m->n_tokens, 4, &oom);
	get_runs(&r, m, &oom);
	if (r.bad || r.left) {
		pdx_tp_msg_clear(m);
		return oom ? PDX_ENOMEM : PDX_EINVAL;
	}
	return PDX_OK;
}

void pdx_tp_msg_clear(struct pdx_tp_msg *m)
{
	for (uint32_t i = 0; m->runs && i < m->n_runs; i++) {
		free(m->runs[i].blocks);
		free(m->runs[i].hash);
	}
	free(m->runs);
	free(m->block_ids);
	free(m->tokens);
	memset(m, 0, sizeof(*m));
}
