/* The data paths' names (agent.h), for the log, the notifications, the
 * options and the metrics alike; and the handler of each active message
 * (agent/am.h) a path receives. */
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

pdx_status_t data_path_am_register(struct agent *a)
{
	static const struct {
		enum am_id id;
		pdx_ucx_am_cb cb;
	} handlers[] = {
		{ AM_RUN, host_on_run },
		{ AM_STAGED_CHUNK, staged_on_chunk },
		{ AM_STAGED_READY, staged_on_ready },
		{ AM_STAGED_FREE, staged_on_free },
	};

	for (size_t i = 0; i < sizeof(handlers) / sizeof(handlers[0]); i++) {
		pdx_status_t st = pdx_ucx_am_handler(a->ucx, handlers[i].id,
						     handlers[i].cb, a);

		if (st)
			return st;
	}
	return PDX_OK;
}
