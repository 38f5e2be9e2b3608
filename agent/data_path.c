/* The data paths' names (agent.h): pure tables, for the log, the
 * notifications, the options and the metrics alike. */
#include "agent/agent.h"

const char *data_path_key(enum data_path d)
{
	static const char *const keys[] = {
		[DATA_AUTO] = "auto",	      [DATA_IPC] = "ipc",
		[DATA_PUT] = "put",	      [DATA_AM] = "am",
		[DATA_CUDA_PUT] = "cuda-put", [DATA_CUDA_IPC] = "cuda-ipc",
		[DATA_STAGED] = "staged",
	};

	return keys[d];
}

const char *data_path_name(enum data_path d)
{
	static const char *const names[] = {
		[DATA_AUTO] = "auto",
		[DATA_IPC] = "ipc (mapped shared memory)",
		[DATA_PUT] = "ucx put",
		[DATA_AM] = "ucx active messages",
		[DATA_CUDA_PUT] = "cuda-put (ucx, GPU to GPU)",
		[DATA_CUDA_IPC] = "cuda-ipc (GPU copies into the peer's memory)",
		[DATA_STAGED] = "staged (pinned host buffers, ucx messages)",
	};

	return names[d];
}
