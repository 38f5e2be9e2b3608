/* Whether a gpu test is skipped (77) or fails, from what
 * cudaGetDeviceCount() said. Without a GPU it skips. With an NVIDIA
 * kernel driver loaded (/proc/driver/nvidia/version), CUDA failing to
 * count the devices is a failure: a driver older than this CUDA runtime
 * answers cudaErrorInsufficientDriver, the code a machine without any
 * driver gets, and every gpu test would be "skipped" on a GPU machine. */
#ifndef PDX_TESTS_GPU_SKIP_H
#define PDX_TESTS_GPU_SKIP_H

#include <stdio.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

/* 77: skip; 1: fail (said on stderr); 0: a GPU to test on. */
static inline int gpu_test_gate(cudaError_t e, int count)
{
	if (e == cudaSuccess)
		return count > 0 ? 0 : 77;
	if (e == cudaErrorNoDevice ||
	    access("/proc/driver/nvidia/version", F_OK) != 0)
		return 77;
	fprintf(stderr, "an NVIDIA driver is loaded, but CUDA finds no device: "
		"%s (is the driver older than this CUDA runtime?)\n",
		cudaGetErrorString(e));
	return 1;
}

#endif
