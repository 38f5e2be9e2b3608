/* The few types and constants of the CUDA driver API (cuda.h) that
 * lib/cuda.c uses, under our own names: libpdx builds where CUDA is not
 * installed and loads the driver at run time. Their values are the
 * driver's ABI (stable since CUDA 11); tests/unit/test_cuda_drv.c checks
 * them against cuda.h wherever CUDA is installed.
 */
#ifndef PDX_LIB_CUDA_DRV_H
#define PDX_LIB_CUDA_DRV_H

typedef int pdx_cu_result;             /* CUresult */
typedef unsigned long long pdx_cu_ptr; /* CUdeviceptr */
typedef int pdx_cu_device;             /* CUdevice */
typedef void *pdx_cu_context;          /* CUcontext */
typedef void *pdx_cu_event;            /* CUevent */
typedef void *pdx_cu_stream;           /* CUstream */
typedef unsigned long long pdx_cu_mem_handle; /* CUmemGenericAllocationHandle */

#define PDX_CU_IPC_BYTES 64 /* CU_IPC_HANDLE_SIZE */

/* CUipcMemHandle, CUipcEventHandle */
struct pdx_cu_ipc {
	char reserved[PDX_CU_IPC_BYTES];
};

enum {
	PDX_CUDA_SUCCESS = 0,
	PDX_CUDA_ERROR_INVALID_VALUE = 1,
	PDX_CUDA_ERROR_STUB_LIBRARY = 34,
};

/* CUpointer_attribute */
enum {
	PDX_CU_POINTER_CONTEXT = 1,
	PDX_CU_POINTER_MEMORY_TYPE = 2,
	PDX_CU_POINTER_IS_MANAGED = 8,
	PDX_CU_POINTER_DEVICE_ORDINAL = 9,
	PDX_CU_POINTER_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
	PDX_CU_POINTER_RANGE_START_ADDR = 11,
	PDX_CU_POINTER_RANGE_SIZE = 12,
};

/* CUmemorytype */
enum {
	PDX_CU_MEMORYTYPE_HOST = 1,
	PDX_CU_MEMORYTYPE_DEVICE = 2,
};

/* CUevent_flags */
enum {
	PDX_CU_EVENT_DISABLE_TIMING = 0x2,
	PDX_CU_EVENT_INTERPROCESS = 0x4,
};

#endif
