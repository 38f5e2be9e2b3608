/* The proxy's reading of the agents' notifications (proxy/transfers.c,
 * docs/protocol.md section 3): xfer_event frames against the transfers
 * the proxy counts in its instances' load. The file is included so its
 * static reader is reachable; its socket is never opened.
 *
 * Input: records of u8 kind, u16 length (little-endian), that many bytes.
 * Kind modulo 3: 0 a notification frame; 1 a transfer starts, its id the
 * record's bytes (at most 40) and its instances picked by the first one;
 * 2 the proxy forgets the transfer with that id. Every instance's count
 * of transfers must match the table, and be 0 at the end. */
#include "proxy/transfers.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct pdx_pool pool[2];

static void pools(void)
{
	char err[128];

	if (pool[0].n)
		return;
	pdx_log_level = PDX_LOG_ERROR;
	pool[1].role = PDX_POOL_DECODE;
	if (pdx_pool_add(&pool[0], "p1:8000", err, sizeof(err)) ||
	    pdx_pool_add(&pool[0], "p2:8000", err, sizeof(err)) ||
	    pdx_pool_add(&pool[1], "d1:8000", err, sizeof(err)))
		abort();
}

/* Each instance counts exactly the table's transfers that name it. */
static void check(struct pdx_transfers *t)
{
	unsigned want[3] = {0}, n = 0;
	struct pdx_inst *inst[3] = {pool[0].inst[0], pool[0].inst[1],
				    pool[1].inst[0]};
	struct pdx_transfer *x, *tmp;

	HASH_ITER(hh, t->table, x, tmp)
	{
		n++;
		for (int k = 0; k < 3; k++)
			want[k] +=
			    x->side[0] == inst[k] || x->side[1] == inst[k];
	}
	if (n != t->n)
		abort();
	for (int k = 0; k < 3; k++)
		if (inst[k]->xfers != want[k] || inst[k]->refs != 1 + want[k])
			abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct pdx_transfers t = {0};
	struct pdx_transfer *x, *tmp;
	char sock;

	pools();
	t.sock = &sock; /* "listening"; never used as a socket */
	t.timeout_ns = UINT64_MAX;
	while (size >= 3) {
		size_t n = (size_t)data[1] | (size_t)data[2] << 8;
		uint8_t kind = data[0] % 3;
		char id[41];

		data += 3;
		size -= 3;
		n = n < size ? n : size;
		if (kind == 0) {
			uint8_t *frame = malloc(n ? n : 1);

			if (!frame)
				abort();
			memcpy(frame, data, n);
			on_event(&t, frame, n);
			free(frame);
		} else {
			size_t len = n < sizeof(id) - 1 ? n : sizeof(id) - 1;
			uint8_t pick = len ? data[0] : 0;

			memcpy(id, data, len);
			id[len] = '\0';
			if (kind == 2)
				pdx_transfers_forget(&t, id);
			else
				pdx_transfers_start(
				    &t, id,
				    pick & 1 ? NULL
					     : pool[0].inst[pick >> 1 & 1],
				    pick & 4 ? NULL : pool[1].inst[0]);
		}
		check(&t);
		data += n;
		size -= n;
	}
	HASH_ITER(hh, t.table, x, tmp)
	{
		transfer_free(&t, x);
	}
	check(&t);
	return 0;
}
