/* The KV pool: a shared-memory object another process can map, laid out
 * as registered, gone when freed; refusals with a reason. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/shm_object.h"
#include "engine/kv_pool.h"
#include "tests/check.h"

static char name[64];

/* The object as an agent sees it: opened by name, its size. */
static long long shm_size(void)
{
	struct stat st;
	int fd = shm_open(name, O_RDONLY, 0);

	if (fd < 0)
		return -errno;
	fstat(fd, &st);
	close(fd);
	return (long long)st.st_size;
}

static void layout(void)
{
	const struct pdx_model *m = pdx_model_find("tiny");
	struct pdx_kv_pool_params pp = { .shm_name = name, .model = m,
					 .blocks = 32 };
	const struct pdx_shm_pool *shm;
	struct pdx_block_stats bs;
	struct pdx_kv_pool *pool;
	char err[128];
	uint64_t size;

	/* a stale object of that name (a run that died) is replaced */
	close(shm_open(name, O_CREAT | O_RDWR, 0600));
	CHECK_EQ(pdx_kv_pool_new(&pp, &pool, err, sizeof(err)), PDX_OK);
	shm = pdx_kv_pool_shm(pool);
	size = 32ULL * 256 * m->layers * m->tensors; /* 256 B a tiny block */
	CHECK_EQ(shm->size, size);
	CHECK_EQ(shm_size(), size);
	CHECK(!strcmp(shm->region.shm_name, name));
	CHECK_EQ(shm->region.size, size);
	CHECK_EQ(shm->block_bytes, 256);
	CHECK_EQ(pdx_kv_layout_check(&shm->layout, &size, 1, err, sizeof(err)),
		 PDX_OK);
	/* layer-major, K then V */
	CHECK_EQ(shm->layout.layer[1].base[0].offset, 2 * 32 * 256);
	CHECK_EQ(shm->layout.layer[1].base[1].offset, 3 * 32 * 256);
	CHECK_EQ(shm->layout.layer[3].block_stride, 256);
	pdx_block_alloc_stats(pdx_kv_pool_blocks(pool), &bs);
	CHECK_EQ(bs.total, 32);
	CHECK_EQ(bs.free, 32);
	pdx_kv_pool_free(pool);
	CHECK_EQ(shm_size(), -ENOENT);
	pdx_kv_pool_free(NULL);
}

/* What the engine writes, a second mapping of the object (the agent's)
 * reads: the pool is the memory the transfer moves. */
static void shared_bytes(void)
{
	struct pdx_kv_pool_params pp = { .shm_name = name,
					 .model = pdx_model_find("tiny"),
					 .blocks = 16,
					 .prefault = true };
	struct pdx_kv_pool *pool;
	struct pdx_synth_seq seq;
	struct pdx_synth_run run;
	uint32_t blocks[2], tokens[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, bad, slot;
	uint64_t hash[8], wrong;
	uint8_t *other;
	char err[128];
	int fd;

	CHECK_EQ(pdx_kv_pool_new(&pp, &pool, err, sizeof(err)), PDX_OK);
	CHECK_EQ(pdx_block_alloc_get(pdx_kv_pool_blocks(pool), 2, blocks),
		 PDX_OK);
	pdx_synth_hashes(PDX_SYNTH_HASH_SEED, tokens, 8, hash);
	/* one forward pass writes all of it, and its token is the model's */
	run = (struct pdx_synth_run){ .blocks = blocks, .hash = hash,
				      .a = 0, .b = 8, .want_token = true };
	CHECK_EQ(pdx_kv_pool_pass(pool, &run, 1, 1024, &slot), PDX_OK);
	CHECK_EQ(slot, PDX_KV_POOL_NO_SLOT);
	seq = (struct pdx_synth_seq){ .layout = pdx_kv_pool_layout(pool),
				      .base = pdx_kv_pool_shm(pool)->base,
				      .blocks = blocks, .hash = hash };
	CHECK(pdx_synth_check(&seq, 0, 8, &bad));
	CHECK_EQ(run.token, pdx_synth_next_token(&seq, 8, 1024));
	CHECK_EQ(pdx_kv_pool_verify(pool, blocks, hash, 8, &wrong, &bad),
		 PDX_OK);
	CHECK_EQ(wrong, 0);
	CHECK_EQ(bad, UINT32_MAX);
	CHECK(pdx_kv_pool_events(pool) == NULL);
	fd = shm_open(name, O_RDWR, 0);
	other = mmap(NULL, pdx_kv_pool_shm(pool)->size, PROT_READ | PROT_WRITE,
		     MAP_SHARED, fd, 0);
	close(fd);
	CHECK(other != MAP_FAILED);
	if (other != MAP_FAILED) {
		CHECK(!memcmp(other, pdx_kv_pool_shm(pool)->base,
			      pdx_kv_pool_shm(pool)->size));
		other[pdx_kv_pool_shm(pool)->layout.layer[2].base[1].offset +
		      256 * blocks[1] + 64 * 2] ^= 0x80;
		CHECK(!pdx_synth_check(&seq, 0, 8, &bad));
		CHECK_EQ(bad, 6);
		/* verify probes a block's first and last positions: not 6,
		 * but 7 */
		CHECK_EQ(pdx_kv_pool_verify(pool, blocks, hash, 8, &wrong,
					    &bad),
			 PDX_OK);
		CHECK_EQ(wrong, 0);
		other[pdx_kv_pool_shm(pool)->layout.layer[2].base[1].offset +
		      256 * blocks[1] + 64 * 3] ^= 0x80;
		CHECK_EQ(pdx_kv_pool_verify(pool, blocks, hash, 8, &wrong,
					    &bad),
			 PDX_OK);
		CHECK_EQ(wrong, 1);
		CHECK_EQ(bad, 7);
		munmap(other, pdx_kv_pool_shm(pool)->size);
	}
	pdx_kv_pool_free(pool);
}

static void refusals(void)
{
	struct pdx_kv_pool_params pp = { .shm_name = name,
					 .model = pdx_model_find("tiny") };
	struct pdx_kv_pool *pool = NULL;
	char err[128] = "";

	CHECK_EQ(pdx_kv_pool_new(&pp, &pool, err, sizeof(err)), PDX_EINVAL);
	CHECK(err[0] != '\0');
	pp.blocks = 4;
	pp.shm_name = "/a-name-longer-than-the-sixty-four-bytes-a-pool-"
		      "keeps-for-it-so-refused";
	CHECK_EQ(pdx_kv_pool_new(&pp, &pool, err, sizeof(err)), PDX_EINVAL);
	pp.shm_name = name;
	pp.model = NULL;
	CHECK_EQ(pdx_kv_pool_new(&pp, &pool, err, sizeof(err)), PDX_EINVAL);
	CHECK(pool == NULL);
	CHECK_EQ(shm_size(), -ENOENT);
}

/* A GPU pool on a device no machine has: refused with the reason, and
 * PDX_ENOENT (pdx-engine exits 77) unless the build has no CUDA or CUDA
 * itself fails (PDX_EIO: e.g. a GPU under AddressSanitizer). */
static void no_such_gpu(void)
{
	struct pdx_kv_pool_params pp = { .mem = PDX_MEM_CUDA,
					 .cuda_device = 1023,
					 .model = pdx_model_find("tiny"),
					 .blocks = 4 };
	struct pdx_kv_pool *pool = NULL;
	char err[256] = "";
	pdx_status_t st;

	st = pdx_kv_pool_new(&pp, &pool, err, sizeof(err));
	CHECK(pool == NULL);
	if (st == PDX_EINVAL)
		CHECK_STR_CONTAINS(err, "built without CUDA");
	else if (st == PDX_EIO)
		CHECK_STR_CONTAINS(err, "initialising CUDA");
	else
		CHECK_EQ(st, PDX_ENOENT);
	if (st == PDX_ENOENT)
		CHECK_STR_CONTAINS(err, "no CUDA device");
}

/* Every model of the table makes a pool the synthetic model can fill. */
static void every_model(void)
{
	const struct pdx_model *m;
	char err[128];

	for (unsigned i = 0; (m = pdx_model_at(i)); i++) {
		struct pdx_kv_pool_params pp = { .shm_name = name,
						 .model = m,
						 .blocks = 1 };
		struct pdx_kv_pool *pool = NULL;

		CHECK_EQ(pdx_kv_pool_new(&pp, &pool, err, sizeof(err)),
			 PDX_OK);
		pdx_kv_pool_free(pool);
	}
}

/* A pool whose process died (SIGKILL: nothing destroyed it) is swept; a
 * live one is not, nor one younger than the minimum age. */
static void sweep(void)
{
	char prefix[64], dead[80], live[80];
	struct pdx_kv_pool_params pp = { .model = pdx_model_find("tiny"),
					 .blocks = 4 };
	struct pdx_kv_pool *mine = NULL;
	char err[256];
	pid_t child;
	int fd = -1;

	snprintf(prefix, sizeof(prefix), "pdx-unit-sweep-%d-", (int)getpid());
	snprintf(dead, sizeof(dead), "/%sdead", prefix);
	snprintf(live, sizeof(live), "/%slive", prefix);
	child = fork();
	if (child == 0) {
		struct pdx_kv_pool *p = NULL;

		pp.shm_name = dead;
		if (pdx_kv_pool_new(&pp, &p, err, sizeof(err)) != PDX_OK)
			_exit(1);
		pause();
		_exit(0);
	}
	pp.shm_name = live;
	CHECK_EQ(pdx_kv_pool_new(&pp, &mine, err, sizeof(err)), PDX_OK);
	for (int i = 0; i < 500 && fd < 0; i++) {
		fd = shm_open(dead, O_RDONLY, 0);
		if (fd < 0)
			usleep(10000);
	}
	CHECK(fd >= 0);
	if (fd >= 0)
		close(fd);
	CHECK_EQ(pdx_shm_object_sweep(prefix, 0), 0); /* both alive */
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	CHECK_EQ(pdx_shm_object_sweep(prefix, 3600), 0); /* too young */
	CHECK_EQ(pdx_shm_object_sweep(prefix, 0), 1);
	CHECK(shm_open(dead, O_RDONLY, 0) < 0 && errno == ENOENT);
	fd = shm_open(live, O_RDONLY, 0);
	CHECK(fd >= 0);
	if (fd >= 0)
		close(fd);
	pdx_kv_pool_free(mine);
}

/* The inode the name stands for now; 0 when none. */
static ino_t name_ino(const char *n)
{
	char path[128];
	struct stat st;

	snprintf(path, sizeof(path), "/dev/shm%s", n);
	return stat(path, &st) ? 0 : st.st_ino;
}

/* Two engines whose pools got one name (each PID 1 of its container,
 * both sharing /dev/shm): the second is refused, saying so, and the
 * first's pool keeps its name (it was unlinked and replaced: the first's
 * agent then mapped the second's KV). A pool whose name now stands for
 * another object (removed by hand, made again) leaves it at its free. */
static void live_name(void)
{
	struct pdx_kv_pool_params pp = { .shm_name = name,
					 .model = pdx_model_find("tiny"),
					 .blocks = 4 };
	struct pdx_kv_pool *first = NULL, *second = NULL;
	char err[256] = "";
	ino_t ino;
	int fd;

	CHECK_EQ(pdx_kv_pool_new(&pp, &first, err, sizeof(err)), PDX_OK);
	ino = name_ino(name);
	CHECK(ino != 0);
	CHECK(pdx_kv_pool_new(&pp, &second, err, sizeof(err)) != PDX_OK);
	CHECK(second == NULL);
	CHECK(strstr(err, "a live process holds it") != NULL);
	CHECK_EQ(name_ino(name), ino);
	/* someone removes the name and another object takes it */
	shm_unlink(name);
	fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
	CHECK(fd >= 0);
	ino = name_ino(name);
	pdx_kv_pool_free(first);
	CHECK_EQ(name_ino(name), ino);
	if (fd >= 0)
		close(fd);
	shm_unlink(name);
}

int main(void)
{
	snprintf(name, sizeof(name), "/pdx-unit-kv-pool-%d", (int)getpid());
	layout();
	shared_bytes();
	refusals();
	no_such_gpu();
	every_model();
	sweep();
	live_name();
	CHECK_DONE();
}
