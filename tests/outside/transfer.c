/* A C engine outside the tree, built against an installed libpdx alone:
 *   cc transfer.c $(pkg-config --cflags --libs pdx)
 * Usage: transfer PREFILL-AGENT DECODE-AGENT (their ipc:// engine
 * addresses). One KV pool in shared memory per side; moves blocks 1, 3, 5
 * of every layer from the prefill side into blocks 6, 2, 0 of the decode
 * side and checks every byte. Exit 0 when it did (tests/integ/libpdx_install.sh). */
#include <pdx/engine.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define LAYERS 4
#define BLOCKS 8
#define N 3
#define CHECK(c, what) do { if (!(c)) { fprintf(stderr, "transfer: %s\n", what); return 1; } } while (0)

static struct pdx_kv_layer layer[LAYERS];
static char shm[2][64]; /* the pools' names, removed at exit */
static struct pdx_kv_layout lo = { LAYERS, 2, BLOCKS, 16, 2, 64, 2, PDX_KV_NHD, layer };

/* A side: its pool (name, mapping), its link, its agent's peer address. */
static int side(const char *agent, const char *shm, uint8_t **mem, struct pdx_engine **e, char *peer)
{
	uint64_t size = pdx_kv_layout_block_bytes_all(&lo) * BLOCKS;
	struct pdx_engine_params p = { .agent = agent };
	struct pdx_engine_region r = { .type = PDX_MEM_SHM, .shm_name = shm, .size = size };
	int fd = shm_open(shm, O_RDWR | O_CREAT | O_TRUNC, 0600);

	CHECK(fd >= 0 && ftruncate(fd, (off_t)size) == 0, "shm_open");
	*mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	CHECK(*mem != MAP_FAILED, "mmap");
	CHECK(pdx_engine_connect(&p, e) == PDX_OK, "connect");
	CHECK(pdx_engine_register(*e, &lo, &r, 1, peer, PDX_ADDR_MAX) == PDX_OK, "register");
	return 0;
}

static void unlink_pools(void)
{
	shm_unlink(shm[0]);
	shm_unlink(shm[1]);
}

int main(int argc, char **argv)
{
	uint64_t bb = pdx_kv_layout_block_bytes(&lo);
	uint32_t from[N] = { 1, 3, 5 }, to[N] = { 6, 2, 0 };
	char ppeer[PDX_ADDR_MAX], dpeer[PDX_ADDR_MAX];
	struct pdx_engine *p, *d;
	struct pdx_engine_event ev;
	struct pdx_xfer_id x;
	uint8_t *pm, *dm;

	for (uint32_t l = 0; l < LAYERS; l++)
		layer[l] = (struct pdx_kv_layer){ { { 0, 2 * l * BLOCKS * bb }, { 0, (2 * l + 1) * BLOCKS * bb } }, bb };
	CHECK(argc == 3, "usage: transfer PREFILL-AGENT DECODE-AGENT");
	snprintf(shm[0], sizeof(shm[0]), "/pdx-outside-%d-p", (int)getpid());
	snprintf(shm[1], sizeof(shm[1]), "/pdx-outside-%d-d", (int)getpid());
	atexit(unlink_pools);
	if (side(argv[1], shm[0], &pm, &p, ppeer) || side(argv[2], shm[1], &dm, &d, dpeer))
		return 1;
	for (uint64_t i = 0; i < pdx_kv_layout_block_bytes_all(&lo) * BLOCKS; i++)
		pm[i] = (uint8_t)(i * 7 + i / 4096);
	CHECK(pdx_xfer_id_random(&x) == PDX_OK, "xfer id");
	CHECK(pdx_engine_recv(d, &x, ppeer, to, N, 0) == PDX_OK, "recv");
	CHECK(pdx_engine_send(p, &x, dpeer, from, N) == PDX_OK, "send");
	for (uint32_t l = 0; l < LAYERS; l++)
		CHECK(pdx_engine_layer_done(p, l, &x, 1) == PDX_OK, "layer_done");
	CHECK(pdx_engine_wait_event(p, 20000, &ev) == PDX_OK && ev.kind == PDX_EVENT_SENT, "sent");
	CHECK(pdx_engine_wait_event(d, 20000, &ev) == PDX_OK && ev.kind == PDX_EVENT_RECEIVED, "received");
	CHECK(ev.bytes == N * pdx_kv_layout_block_bytes_all(&lo), "received: byte count");
	for (uint32_t l = 0; l < LAYERS; l++)
		for (int t = 0; t < 2; t++)
			for (int i = 0; i < N; i++)
				CHECK(!memcmp(pm + layer[l].base[t].offset + from[i] * bb,
					      dm + layer[l].base[t].offset + to[i] * bb, bb), "bytes differ");
	pdx_engine_free(p);
	pdx_engine_free(d);
	printf("transfer: %u layers x 2 x %d blocks of %llu bytes, byte-exact\n", LAYERS, N, (unsigned long long)bb);
	return 0;
}
