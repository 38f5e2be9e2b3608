/* The synthetic model's fill, check and next token as CUDA kernels; the
 * rules are synth_model.h's, the CPU code in synth_model.c is the
 * reference. */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "engine/synth_cuda.h"
#include "kernels/cuda_util.cuh"

#define WORD_STEP 0x9e3779b97f4a7c15ULL
#define THREADS 256
#define MAX_GRID 65536u

/* One staged position: its prefix hash, its block and the position. */
struct pos_entry {
	uint64_t hash;
	uint32_t block;
	uint32_t p;
};

/* One run wanting a token: n = b, and where its block table starts. */
struct tok_entry {
	uint32_t n;
	uint32_t table;
};

struct dlayer {
	uint64_t off[2];
	uint64_t stride;
};

struct pdx_synth_cuda {
	uint32_t layers, tensors, bt, blocks;
	uint64_t words; /* 64-bit words per slot */
	uint64_t hwords; /* ... per head: the token reads head 0's */
	uint8_t *base;
	cudaStream_t stream;
	struct dlayer *h_layers, *d_layers;
	/* staged: [pos entries][tok entries][block tables], pinned on the
	 * host and uploaded in one copy; `uploaded` is recorded after it so
	 * the pinned buffer is not rewritten under a copy in flight */
	uint8_t *h_stage, *d_stage;
	size_t stage_cap;
	cudaEvent_t uploaded;
	uint64_t n_pos;
	uint32_t n_tok;
	size_t tok_off, tab_off;
	/* answers: [tokens: n_tok][flags: n_pos], one uint32_t each */
	uint32_t *h_out, *d_out;
	size_t out_cap;
};

/* synth_model.c's mix64 (splitmix64's finaliser, no increment: not the
 * kernels' pdx_kv_mix64) and salt. */
__device__ __forceinline__ uint64_t dmix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

__device__ __forceinline__ uint64_t dsalt(uint32_t layer, uint32_t tensor,
					  uint32_t p)
{
	return dmix((uint64_t)p | (uint64_t)tensor << 32 |
		    (uint64_t)layer << 33);
}

__device__ __forceinline__ uint64_t *dslot(uint8_t *base,
					   const struct dlayer *ly, uint32_t t,
					   uint32_t block, uint32_t off,
					   uint64_t words)
{
	return (uint64_t *)(base + ly->off[t] + (uint64_t)block * ly->stride) +
	       (uint64_t)off * words;
}

/* One thread per word: consecutive threads write consecutive words of a
 * slot, whatever the slot's size. */
__global__ void k_fill(uint8_t *base, struct dlayer ly, uint32_t layer,
		       const struct pos_entry *pos, uint64_t n_pos,
		       uint32_t tensors, uint32_t bt, uint64_t words)
{
	uint64_t total = n_pos * tensors * words;

	for (uint64_t x = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     x < total; x += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t i = x % words, item = x / words;
		uint32_t t = (uint32_t)(item % tensors);
		struct pos_entry e = pos[item / tensors];
		uint64_t key = dmix(e.hash ^ dsalt(layer, t, e.p));

		dslot(base, &ly, t, e.block, e.p % bt, words)[i] =
			key + i * WORD_STEP;
	}
}

/* flags[e] = 1 where any word of entry e, in any layer and tensor,
 * differs from what k_fill writes. */
__global__ void k_check(uint8_t *base, const struct dlayer *layers,
			uint32_t n_layers, const struct pos_entry *pos,
			uint64_t n_pos, uint32_t tensors, uint32_t bt,
			uint64_t words, uint32_t *flags)
{
	uint64_t total = n_pos * n_layers * tensors * words;

	for (uint64_t x = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     x < total; x += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t i = x % words, item = x / words, k;
		uint32_t t = (uint32_t)(item % tensors), layer;
		struct pos_entry e;

		item /= tensors;
		layer = (uint32_t)(item % n_layers);
		k = item / n_layers;
		e = pos[k];
		if (dslot(base, &layers[layer], t, e.block, e.p % bt,
			  words)[i] !=
		    dmix(e.hash ^ dsalt(layer, t, e.p)) + i * WORD_STEP)
			flags[k] = 1;
	}
}

/* One CTA per run: the sum of pdx_synth_next_token() over (block, layer,
 * tensor), modulo 2^64, so the reduction order does not matter. */
__global__ void k_tokens(const uint8_t *base, const struct dlayer *layers,
			 uint32_t n_layers, const struct tok_entry *tok,
			 uint32_t n_tok, const uint32_t *tables,
			 uint32_t tensors, uint32_t bt, uint64_t words,
			 uint64_t hwords, uint32_t vocab, uint32_t *out)
{
	__shared__ uint64_t part[THREADS];

	for (uint32_t r = blockIdx.x; r < n_tok; r += gridDim.x) {
		uint32_t n = tok[r].n, off = (n - 1) % bt;
		uint64_t items = (uint64_t)((n - 1) / bt + 1) * n_layers *
				 tensors,
			 sum = 0;
		const uint32_t *tab = tables + tok[r].table;

		for (uint64_t it = threadIdx.x; it < items; it += blockDim.x) {
			uint32_t t = (uint32_t)(it % tensors);
			uint64_t k = it / tensors;
			uint32_t layer = (uint32_t)(k % n_layers);
			uint32_t blk = (uint32_t)(k / n_layers);
			uint32_t p = off + blk * bt;
			const uint64_t *w = dslot((uint8_t *)base,
						  &layers[layer], t, tab[blk],
						  off, words);
			uint64_t last = w[hwords - 1];

			sum += dmix(w[0] ^ (last << 32 | last >> 32) ^
				    dsalt(layer, t, p));
		}
		sum = pdx__cta_sum(part, sum);
		if (threadIdx.x == 0)
			out[r] = (uint32_t)(dmix(sum ^ n) % vocab);
		__syncthreads();
	}
}

static unsigned grid_for(uint64_t threads)
{
	uint64_t ctas = (threads + THREADS - 1) / THREADS;

	return ctas == 0 ? 1 : ctas < MAX_GRID ? (unsigned)ctas : MAX_GRID;
}

static pdx_status_t launched(void)
{
	return cudaGetLastError() == cudaSuccess ? PDX_OK : PDX_EIO;
}

extern "C" pdx_status_t pdx_synth_cuda_new(const struct pdx_kv_layout *l,
					   void *base, void *stream,
					   struct pdx_synth_cuda **out)
{
	struct pdx_synth_cuda *c;
	uint64_t slot;

	if (pdx_synth_layout_check(l) != PDX_OK || l->order != PDX_KV_NHD ||
	    !base)
		return PDX_EINVAL;
	slot = (uint64_t)l->kv_heads * l->head_dim * l->dtype_bytes;
	for (uint32_t i = 0; i < l->layers; i++)
		for (uint32_t t = 0; t < l->tensors; t++)
			if ((l->layer[i].base[t].offset |
			     l->layer[i].block_stride) % 8)
				return PDX_EINVAL;
	c = (struct pdx_synth_cuda *)calloc(1, sizeof(*c));
	if (!c)
		return PDX_ENOMEM;
	c->layers = l->layers;
	c->tensors = l->tensors;
	c->bt = l->block_tokens;
	c->blocks = l->blocks;
	c->words = slot / 8;
	c->hwords = (uint64_t)l->head_dim * l->dtype_bytes / 8;
	c->base = (uint8_t *)base;
	c->stream = (cudaStream_t)stream;
	c->h_layers = (struct dlayer *)calloc(l->layers, sizeof(struct dlayer));
	if (!c->h_layers) {
		free(c);
		return PDX_ENOMEM;
	}
	for (uint32_t i = 0; i < l->layers; i++) {
		for (uint32_t t = 0; t < l->tensors; t++)
			c->h_layers[i].off[t] = l->layer[i].base[t].offset;
		c->h_layers[i].stride = l->layer[i].block_stride;
	}
	if (cudaEventCreateWithFlags(&c->uploaded, cudaEventDisableTiming) !=
	    cudaSuccess) {
		free(c->h_layers);
		free(c);
		return PDX_EIO;
	}
	if (cudaMalloc((void **)&c->d_layers,
		       sizeof(struct dlayer) * l->layers) != cudaSuccess ||
	    cudaMemcpy(c->d_layers, c->h_layers,
		       sizeof(struct dlayer) * l->layers,
		       cudaMemcpyHostToDevice) != cudaSuccess) {
		pdx_synth_cuda_free(c);
		return PDX_EIO;
	}
	*out = c;
	return PDX_OK;
}

extern "C" void pdx_synth_cuda_free(struct pdx_synth_cuda *c)
{
	if (!c)
		return;
	cudaStreamSynchronize(c->stream);
	cudaFreeHost(c->h_stage);
	cudaFreeHost(c->h_out);
	cudaFree(c->d_stage);
	cudaFree(c->d_out);
	cudaFree(c->d_layers);
	cudaEventDestroy(c->uploaded);
	free(c->h_layers);
	free(c);
}

/* Grows a pinned host buffer and its device twin to at least need
 * bytes. The device one is stream-ordered (no device synchronisation);
 * the host one is only replaced once the last upload from it is done. */
static pdx_status_t grow(struct pdx_synth_cuda *c, void **h, void **d,
			 size_t *cap, size_t need)
{
	size_t n = *cap ? *cap : 4096;
	void *nh, *nd;

	if (need <= *cap)
		return PDX_OK;
	while (n < need)
		n *= 2;
	if (cudaEventSynchronize(c->uploaded) != cudaSuccess ||
	    cudaMallocHost(&nh, n) != cudaSuccess)
		return PDX_EIO;
	if (cudaMallocAsync(&nd, n, c->stream) != cudaSuccess) {
		cudaFreeHost(nh);
		return PDX_EIO;
	}
	cudaFreeHost(*h);
	if (*d)
		cudaFreeAsync(*d, c->stream);
	*h = nh;
	*d = nd;
	*cap = n;
	return PDX_OK;
}

static size_t align16(size_t x)
{
	return (x + 15) & ~(size_t)15;
}

static uint32_t blocks_of(const struct pdx_synth_cuda *c, uint32_t b)
{
	return (uint32_t)(((uint64_t)b + c->bt - 1) / c->bt);
}

/* Sizes of what runs[0..n) stage; PDX_EINVAL/PDX_ERANGE on a bad run. */
static pdx_status_t measure(const struct pdx_synth_cuda *c,
			    const struct pdx_synth_run *runs, size_t n,
			    uint64_t *n_pos, uint32_t *n_tok, uint64_t *n_tab)
{
	*n_pos = 0;
	*n_tok = 0;
	*n_tab = 0;
	for (size_t i = 0; i < n; i++) {
		const struct pdx_synth_run *r = &runs[i];
		uint32_t from = r->a / c->bt, to = blocks_of(c, r->b);

		if (r->a > r->b || (r->b > r->a && (!r->blocks || !r->hash)) ||
		    (r->want_token && (!r->blocks || r->b == 0)))
			return PDX_EINVAL;
		if (r->a == r->b && !r->want_token)
			continue;
		if (r->want_token) {
			from = 0;
			(*n_tok)++;
			*n_tab += to;
		}
		for (uint32_t k = from; k < to; k++)
			if (r->blocks[k] >= c->blocks)
				return PDX_ERANGE;
		*n_pos += r->b - r->a;
	}
	if (*n_tok > UINT32_MAX / 2 || *n_tab > UINT32_MAX)
		return PDX_ETOOBIG;
	return PDX_OK;
}

extern "C" pdx_status_t pdx_synth_cuda_stage(struct pdx_synth_cuda *c,
					     const struct pdx_synth_run *runs,
					     size_t n)
{
	uint64_t n_pos, n_tab;
	uint32_t n_tok, tab = 0;
	struct pos_entry *pos;
	struct tok_entry *tok;
	uint32_t *tables;
	size_t size;
	pdx_status_t st;

	c->n_pos = 0;
	c->n_tok = 0;
	st = measure(c, runs, n, &n_pos, &n_tok, &n_tab);
	if (st != PDX_OK)
		return st;
	c->tok_off = align16(n_pos * sizeof(*pos));
	c->tab_off = c->tok_off + align16(n_tok * sizeof(*tok));
	size = c->tab_off + n_tab * sizeof(*tables);
	if (size == 0)
		return PDX_OK;
	st = grow(c, (void **)&c->h_stage, (void **)&c->d_stage,
		  &c->stage_cap, size);
	if (st == PDX_OK)
		st = grow(c, (void **)&c->h_out, (void **)&c->d_out,
			  &c->out_cap, (n_tok + n_pos) * sizeof(uint32_t));
	if (st != PDX_OK)
		return st;
	/* the last upload from h_stage is done before it is rewritten */
	if (cudaEventSynchronize(c->uploaded) != cudaSuccess)
		return PDX_EIO;
	pos = (struct pos_entry *)c->h_stage;
	tok = (struct tok_entry *)(c->h_stage + c->tok_off);
	tables = (uint32_t *)(c->h_stage + c->tab_off);
	for (size_t i = 0; i < n; i++) {
		const struct pdx_synth_run *r = &runs[i];

		for (uint32_t p = r->a; p < r->b; p++, pos++) {
			pos->hash = r->hash[p];
			pos->block = r->blocks[p / c->bt];
			pos->p = p;
		}
		if (!r->want_token)
			continue;
		tok->n = r->b;
		tok->table = tab;
		tok++;
		memcpy(tables + tab, r->blocks,
		       sizeof(uint32_t) * blocks_of(c, r->b));
		tab += blocks_of(c, r->b);
	}
	if (cudaMemcpyAsync(c->d_stage, c->h_stage, size,
			    cudaMemcpyHostToDevice, c->stream) != cudaSuccess ||
	    cudaEventRecord(c->uploaded, c->stream) != cudaSuccess)
		return PDX_EIO;
	c->n_pos = n_pos;
	c->n_tok = n_tok;
	return PDX_OK;
}

extern "C" pdx_status_t pdx_synth_cuda_fill(struct pdx_synth_cuda *c,
					    uint32_t layer)
{
	uint64_t threads = c->n_pos * c->tensors * c->words;

	if (layer >= c->layers)
		return PDX_ERANGE;
	if (!c->n_pos)
		return PDX_OK;
	pdx__cuda_launch_begin();
	k_fill<<<grid_for(threads), THREADS, 0, c->stream>>>(
		c->base, c->h_layers[layer], layer,
		(const struct pos_entry *)c->d_stage, c->n_pos, c->tensors,
		c->bt, c->words);
	return launched();
}

extern "C" pdx_status_t pdx_synth_cuda_tokens(struct pdx_synth_cuda *c,
					      struct pdx_synth_run *runs,
					      size_t n, uint32_t vocab)
{
	uint32_t k = 0;

	if (vocab == 0)
		return PDX_EINVAL;
	if (!c->n_tok)
		return PDX_OK;
	pdx__cuda_launch_begin();
	k_tokens<<<c->n_tok < MAX_GRID ? c->n_tok : MAX_GRID, THREADS, 0,
		   c->stream>>>(c->base, c->d_layers, c->layers,
				(const struct tok_entry *)(c->d_stage +
							   c->tok_off),
				c->n_tok, (const uint32_t *)(c->d_stage +
							     c->tab_off),
				c->tensors, c->bt, c->words, c->hwords, vocab,
				c->d_out);
	if (launched() != PDX_OK ||
	    cudaMemcpyAsync(c->h_out, c->d_out, c->n_tok * sizeof(uint32_t),
			    cudaMemcpyDeviceToHost, c->stream) != cudaSuccess ||
	    cudaStreamSynchronize(c->stream) != cudaSuccess)
		return PDX_EIO;
	for (size_t i = 0; i < n && k < c->n_tok; i++)
		if (runs[i].want_token)
			runs[i].token = c->h_out[k++];
	return PDX_OK;
}

extern "C" pdx_status_t pdx_synth_cuda_check(struct pdx_synth_cuda *c,
					     uint64_t *mismatches,
					     uint32_t *lowest)
{
	const struct pos_entry *pos = (const struct pos_entry *)c->h_stage;
	uint32_t *flags = c->d_out + c->n_tok;
	uint64_t threads = c->n_pos * c->layers * c->tensors * c->words;
	uint64_t bad = 0;
	uint32_t low = UINT32_MAX;

	if (c->n_pos) {
		if (cudaMemsetAsync(flags, 0, c->n_pos * sizeof(uint32_t),
				    c->stream) != cudaSuccess)
			return PDX_EIO;
		pdx__cuda_launch_begin();
		k_check<<<grid_for(threads), THREADS, 0, c->stream>>>(
			c->base, c->d_layers, c->layers,
			(const struct pos_entry *)c->d_stage, c->n_pos,
			c->tensors, c->bt, c->words, flags);
		if (launched() != PDX_OK ||
		    cudaMemcpyAsync(c->h_out + c->n_tok, flags,
				    c->n_pos * sizeof(uint32_t),
				    cudaMemcpyDeviceToHost,
				    c->stream) != cudaSuccess ||
		    cudaStreamSynchronize(c->stream) != cudaSuccess)
			return PDX_EIO;
	}
	/* the host copy of the entries is still the one staged */
	for (uint64_t k = 0; k < c->n_pos; k++) {
		if (!c->h_out[c->n_tok + k])
			continue;
		bad++;
		if (pos[k].p < low)
			low = pos[k].p;
	}
	*mismatches = bad;
	*lowest = low;
	return PDX_OK;
}
