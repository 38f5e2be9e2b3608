#include <pdx/engine.h>

#include <errno.h>
#include <stdio.h>
#include <sys/random.h>

pdx_status_t pdx_xfer_id_random(struct pdx_xfer_id *id)
{
	size_t got = 0;

	if (!id)
		return PDX_EINVAL;
	while (got < sizeof(id->b)) {
		ssize_t n = getrandom(id->b + got, sizeof(id->b) - got, 0);

		if (n < 0 && errno == EINTR)
			continue; /* a signal before the pool was ready */
		if (n < 0)
			return PDX_EIO;
		got += (size_t)n;
	}
	return PDX_OK;
}

void pdx_xfer_id_hex(const struct pdx_xfer_id *id, char out[33])
{
	if (!out)
		return;
	out[0] = '\0';
	if (!id)
		return;
	for (size_t i = 0; i < sizeof(id->b); i++)
		snprintf(out + 2 * i, 3, "%02x", id->b[i]);
}
