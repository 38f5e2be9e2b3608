/* kv_mem_cuda.c's twin where the build has no CUDA: a GPU pool is
 * refused with the reason. */
#include <stdio.h>

#include "engine/kv_mem.h"

pdx_status_t pdx__kv_mem_cuda_new(const struct pdx_kv_pool_params *p,
				  struct pdx__kv_mem **out, char *err,
				  size_t errlen)
{
	snprintf(err, errlen,
		 "KV memory on cuda:%d: pdx-engine was built without CUDA "
		 "(meson setup -Dcuda=enabled where nvcc is installed)",
		 p->cuda_device);
	return PDX_EINVAL;
}
