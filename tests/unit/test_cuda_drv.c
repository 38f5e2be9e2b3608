/* lib/cuda_drv.h's copies of the CUDA driver API's types and constants
 * are the driver's own (cuda.h): libpdx loads the driver at run time and
 * builds without CUDA, so nothing else checks them. Fails to compile
 * where one differs.
 */
#include <cuda.h>
#include <stdio.h>

#include "lib/cuda_drv.h"

#define SAME(ours, theirs)                                                     \
	_Static_assert((long long)(ours) == (long long)(theirs), #ours)

SAME(sizeof(pdx_cu_result), sizeof(CUresult));
SAME(sizeof(pdx_cu_ptr), sizeof(CUdeviceptr));
SAME(sizeof(pdx_cu_device), sizeof(CUdevice));
SAME(sizeof(pdx_cu_mem_handle), sizeof(CUmemGenericAllocationHandle));
SAME(sizeof(struct pdx_cu_ipc), sizeof(CUipcMemHandle));
SAME(sizeof(struct pdx_cu_ipc), sizeof(CUipcEventHandle));
SAME(PDX_CU_IPC_BYTES, CU_IPC_HANDLE_SIZE);
SAME(PDX_CUDA_SUCCESS, CUDA_SUCCESS);
SAME(PDX_CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE);
SAME(PDX_CUDA_ERROR_STUB_LIBRARY, CUDA_ERROR_STUB_LIBRARY);
SAME(PDX_CU_POINTER_CONTEXT, CU_POINTER_ATTRIBUTE_CONTEXT);
SAME(PDX_CU_POINTER_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
SAME(PDX_CU_POINTER_IS_MANAGED, CU_POINTER_ATTRIBUTE_IS_MANAGED);
SAME(PDX_CU_POINTER_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
SAME(PDX_CU_POINTER_IS_LEGACY_CUDA_IPC_CAPABLE,
     CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE);
SAME(PDX_CU_POINTER_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
SAME(PDX_CU_POINTER_RANGE_SIZE, CU_POINTER_ATTRIBUTE_RANGE_SIZE);
SAME(PDX_CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_HOST);
SAME(PDX_CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE);
SAME(PDX_CU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING);
SAME(PDX_CU_EVENT_INTERPROCESS, CU_EVENT_INTERPROCESS);

int main(void)
{
	printf("# lib/cuda_drv.h matches cuda.h %d\n", CUDA_VERSION);
	return 0;
}
