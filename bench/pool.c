/* Models, KV pools in shared memory, the data pattern and block picking. */
#include "bench/pdx_bench.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const struct pb_model models[] = {
	{ "llama3-8b", 32, 2, 8, 128, 2, 16 },
	{ "tiny", 4, 2, 2, 16, 2, 4 },
};

const struct pb_model *pb_model_find(const char *name)
{
	for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++)
		if (name && strcmp(models[i].name, name) == 0)
			return &models[i];
	return NULL;
}

const char *pb_model_names(void)
{
	return "llama3-8b|tiny";
}

int pb_pool_create(struct pb_pool *p, const char *shm_name,
		   const struct pb_model *m, uint32_t blocks)
{
	struct pdx_kv_layer *ly;
	uint64_t bb, size;
	void *base;
	int fd;

	memset(p, 0, sizeof(*p));
	if (strlen(shm_name) >= sizeof(p->name) || blocks == 0) {
		fprintf(stderr, "pool: bad name or size\n");
		return -1;
	}
	bb = (uint64_t)m->block_tokens * m->kv_heads * m->head_dim *
	     m->dtype_bytes;
	if (bb == 0 || bb % 8) {
		fprintf(stderr, "pool: block bytes %" PRIu64
				" is not a multiple of 8\n", bb);
		return -1;
	}
	size = bb * blocks * m->tensors * m->layers;
	ly = calloc(m->layers, sizeof(*ly));
	if (!ly)
		return -1;
	for (uint32_t l = 0; l < m->layers; l++) {
		for (uint32_t t = 0; t < m->tensors; t++) {
			ly[l].base[t].region = 0;
			ly[l].base[t].offset =
				((uint64_t)m->tensors * l + t) * blocks * bb;
		}
		ly[l].block_stride = bb;
	}

	fd = shm_open(shm_name, O_CREAT | O_EXCL | O_RDWR, 0600);
	if (fd < 0 && errno == EEXIST) {
		/* left over by a run that died; the name carries our pid */
		shm_unlink(shm_name);
		fd = shm_open(shm_name, O_CREAT | O_EXCL | O_RDWR, 0600);
	}
	if (fd < 0) {
		fprintf(stderr, "pool: shm_open %s: %s\n", shm_name,
			strerror(errno));
		free(ly);
		return -1;
	}
	snprintf(p->name, sizeof(p->name), "%s", shm_name);
	pb_track_shm(p->name);
	if (ftruncate(fd, (off_t)size)) {
		fprintf(stderr, "pool: ftruncate %s to %" PRIu64 " bytes: %s\n",
			shm_name, size, strerror(errno));
		goto fail;
	}
	base = mmap(NULL, size, PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_POPULATE, fd, 0);
	if (base == MAP_FAILED) {
		fprintf(stderr, "pool: mmap %s (%" PRIu64 " bytes): %s\n",
			shm_name, size, strerror(errno));
		goto fail;
	}
	close(fd);
	p->base = base;
	p->size = size;
	p->block_bytes = bb;
	p->layout = (struct pdx_kv_layout){
		.layers = m->layers,
		.tensors = m->tensors,
		.blocks = blocks,
		.block_tokens = m->block_tokens,
		.kv_heads = m->kv_heads,
		.head_dim = m->head_dim,
		.dtype_bytes = m->dtype_bytes,
		.order = PDX_KV_NHD,
		.layer = ly,
	};
	p->region = (struct pdx_engine_region){
		.type = PDX_MEM_SHM,
		.shm_name = p->name,
		.size = size,
	};
	return 0;
fail:
	close(fd);
	shm_unlink(p->name);
	pb_untrack_shm(p->name);
	p->name[0] = '\0';
	free(ly);
	return -1;
}

void pb_pool_destroy(struct pb_pool *p)
{
	if (p->base)
		munmap(p->base, p->size);
	if (p->name[0]) {
		shm_unlink(p->name);
		pb_untrack_shm(p->name);
	}
	free(p->layout.layer);
	memset(p, 0, sizeof(*p));
}

/* ---- the pattern ---- */

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

#define WORD_STEP 0x9e3779b97f4a7c15ULL

/* The first word of token-block idx of (layer, tensor) of transfer seed;
 * word w of the block is key + w * WORD_STEP. */
static inline uint64_t block_key(uint64_t seed, uint32_t layer, uint32_t tensor,
				 size_t idx)
{
	return mix64(seed ^ mix64((uint64_t)idx | (uint64_t)layer << 32 |
				  (uint64_t)tensor << 48));
}

static void fill_words(uint64_t *w, size_t n, uint64_t key)
{
	for (size_t i = 0; i < n; i++)
		w[i] = key + i * WORD_STEP;
}

void pb_fill(const struct pb_pool *p, uint64_t seed, const uint32_t *blocks,
	     size_t n, size_t first)
{
	size_t words = p->block_bytes / 8;

	for (uint32_t l = 0; l < p->layout.layers; l++)
		for (uint32_t t = 0; t < p->layout.tensors; t++)
			for (size_t i = first; i < n; i++)
				fill_words((uint64_t *)pb_block(p, l, t, blocks[i]),
					   words, block_key(seed, l, t, i));
}

void pb_poison(const struct pb_pool *p, const uint32_t *blocks, size_t n,
	       size_t first)
{
	for (uint32_t l = 0; l < p->layout.layers; l++)
		for (uint32_t t = 0; t < p->layout.tensors; t++)
			for (size_t i = first; i < n; i++)
				memset(pb_block(p, l, t, blocks[i]), 0,
				       p->block_bytes);
}

/* OR of the differences: zero when the block matches (vectorizes). */
static uint64_t diff_words(const uint64_t *w, size_t n, uint64_t key)
{
	uint64_t d = 0;

	for (size_t i = 0; i < n; i++)
		d |= w[i] ^ (key + i * WORD_STEP);
	return d;
}

int pb_verify(const struct pb_pool *p, uint64_t seed, const uint32_t *blocks,
	      size_t n, size_t first, char *err, size_t errlen)
{
	size_t words = p->block_bytes / 8;

	for (uint32_t l = 0; l < p->layout.layers; l++) {
		for (uint32_t t = 0; t < p->layout.tensors; t++) {
			for (size_t i = first; i < n; i++) {
				const uint64_t *w = (const uint64_t *)pb_block(
					p, l, t, blocks[i]);
				uint64_t key = block_key(seed, l, t, i);

				if (!diff_words(w, words, key))
					continue;
				for (size_t k = 0; k < words; k++) {
					uint64_t want = key + k * WORD_STEP;

					if (w[k] == want)
						continue;
					snprintf(err, errlen,
						 "layer %u tensor %u token-block %zu (pool block %u) byte offset %zu: got 0x%016" PRIx64
						 " want 0x%016" PRIx64,
						 l, t, i, blocks[i], k * 8, w[k],
						 want);
					return -1;
				}
			}
		}
	}
	return 0;
}

uint64_t pb_runs(const uint32_t *src, const uint32_t *dst, size_t n)
{
	uint64_t runs = n ? 1 : 0;

	for (size_t i = 1; i < n; i++)
		if (src[i] != src[i - 1] + 1 || dst[i] != dst[i - 1] + 1)
			runs++;
	return runs;
}

uint64_t pb_rand(uint64_t *state)
{
	*state += WORD_STEP;
	return mix64(*state);
}

void pb_pick_blocks(uint32_t *out, size_t n, uint32_t pool_blocks, bool random,
		    uint64_t *rng)
{
	uint32_t *all;

	if (!random || n > pool_blocks) {
		for (size_t i = 0; i < n; i++)
			out[i] = (uint32_t)i;
		return;
	}
	all = malloc((size_t)pool_blocks * sizeof(*all));
	if (!all) {
		for (size_t i = 0; i < n; i++)
			out[i] = (uint32_t)i;
		return;
	}
	for (uint32_t i = 0; i < pool_blocks; i++)
		all[i] = i;
	/* partial Fisher-Yates: the first n are a uniform random subset */
	for (size_t i = 0; i < n; i++) {
		size_t j = i + pb_rand(rng) % (pool_blocks - i);
		uint32_t t = all[i];

		all[i] = all[j];
		all[j] = t;
		out[i] = all[i];
	}
	free(all);
}
