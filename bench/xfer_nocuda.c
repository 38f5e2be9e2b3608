/* bench/xfer_cuda.h where pdx was built without CUDA: every function says
 * so, and the probe's answer makes --mem cuda exit XB_CUDA_SKIP. */
#include "bench/xfer_cuda.h"

#include <stdio.h>

#define NOCUDA                                                                 \
	"built without CUDA (reconfigure with -Dcuda=enabled where nvcc and "  \
	"libcudart are installed)"

static int nocuda(char *err, size_t errlen)
{
	snprintf(err, errlen, "%s", NOCUDA);
	return -1;
}

int xb_cuda_probe(int dev, char *err, size_t errlen)
{
	snprintf(err, errlen, "%s", NOCUDA);
	return XB_CUDA_SKIP;
}

int xb_cuda_pool_new(int dev, const struct pdx_model *m, uint32_t blocks,
		     uint32_t event_slots, struct xb_cuda_pool **out, char *err,
		     size_t errlen)
{
	return nocuda(err, errlen);
}

void xb_cuda_pool_free(struct xb_cuda_pool *p)
{
}

const struct pdx_kv_layout *xb_cuda_pool_layout(const struct xb_cuda_pool *p)
{
	return NULL;
}

const struct pdx_engine_region *
xb_cuda_pool_region(const struct xb_cuda_pool *p)
{
	return NULL;
}

const struct pdx_engine_cuda_events *
xb_cuda_pool_events(const struct xb_cuda_pool *p)
{
	return NULL;
}

const char *xb_cuda_pool_device(const struct xb_cuda_pool *p)
{
	return "";
}

int xb_cuda_fill_layer(struct xb_cuda_pool *p, uint32_t layer, uint64_t seed,
		       const uint32_t *blocks, size_t n, size_t first,
		       char *err, size_t errlen)
{
	return nocuda(err, errlen);
}

int xb_cuda_record(struct xb_cuda_pool *p, uint32_t slot, uint32_t layer,
		   char *err, size_t errlen)
{
	return nocuda(err, errlen);
}

int xb_cuda_sync(struct xb_cuda_pool *p, char *err, size_t errlen)
{
	return nocuda(err, errlen);
}

int xb_cuda_upload(struct xb_cuda_pool *p, const void *host, size_t size,
		   char *err, size_t errlen)
{
	return nocuda(err, errlen);
}

int xb_cuda_download(struct xb_cuda_pool *p, void *host, size_t size,
		     char *err, size_t errlen)
{
	return nocuda(err, errlen);
}

int xb_cuda_upload_layer(struct xb_cuda_pool *p, const void *host,
			 uint32_t layer, const uint32_t *blocks, size_t n,
			 size_t first, char *err, size_t errlen)
{
	return nocuda(err, errlen);
}

int xb_cuda_verify(struct xb_cuda_pool *p, uint64_t seed, const uint32_t *src,
		   const uint32_t *dst, size_t n, size_t first, char *err,
		   size_t errlen)
{
	return nocuda(err, errlen);
}

int xb_cuda_yardsticks(struct xb_cuda_pool *p, uint64_t bytes, uint32_t reps,
		       double *d2d_gbps, double *d2h_gbps, char *err,
		       size_t errlen)
{
	return nocuda(err, errlen);
}
