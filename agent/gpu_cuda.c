/* agent/gpu.h with the CUDA runtime. Completions: gpu_then() records an
 * event on our stream and hands it to a watcher thread, which waits for
 * the events in order (cudaEventSynchronize, sleeping) and writes each
 * record's address to a pipe that the loop reads (a pointer's write to a
 * pipe is atomic). Not cudaLaunchHostFunc: a host function holds the
 * stream until it has run, which left the GPU idle ~80 us after every
 * transfer's copy (H100 machine: back-to-back 1 GiB copies at 0.90 of the
 * copy kernel's rate). */
#define _GNU_SOURCE /* pipe2 */
#define PDX_LOG_TOPIC "gpu"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "agent/gpu.h"
#include "common/log.h"
#include "kernels/kv_kernels.h"

struct then {
	struct gpu *g;
	void (*fn)(void *arg, pdx_status_t st);
	void *arg;
	cudaEvent_t ev;
	cudaError_t e; /* what waiting for ev said: a fault of the work */
	struct then *next;
};

struct gpu {
	int device;
	cudaStream_t stream;
	int pipe[2];
	struct event *ev;
	uint32_t pending; /* gpu_then records not yet delivered */
	void (*settle)(void *arg);
	void *settle_arg;
	/* the watcher's queue, in stream order; spare events */
	pthread_t watcher;
	bool watching, stop;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct then *head, *tail;
	cudaEvent_t spare[64];
	unsigned n_spare;
};

static pdx_status_t cuda_err(cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return PDX_OK;
	log_warn("%s: %s", what, cudaGetErrorString(e));
	return PDX_EIO;
}

static void event_put(struct gpu *g, cudaEvent_t ev)
{
	pthread_mutex_lock(&g->mu);
	if (g->n_spare < sizeof(g->spare) / sizeof(g->spare[0])) {
		g->spare[g->n_spare++] = ev;
		ev = NULL;
	}
	pthread_mutex_unlock(&g->mu);
	if (ev)
		cudaEventDestroy(ev);
}

static void deliver(struct then *t)
{
	pdx_status_t st = t->e == cudaSuccess ? PDX_OK : PDX_EIO;

	if (t->e != cudaSuccess)
		log_warn("GPU work failed: %s", cudaGetErrorString(t->e));
	t->g->pending--;
	event_put(t->g, t->ev);
	t->fn(t->arg, st);
	free(t);
}

static void drain_pipe(int fd)
{
	struct then *t[64];
	ssize_t n;

	while ((n = read(fd, t, sizeof(t))) > 0)
		for (ssize_t i = 0; i < n / (ssize_t)sizeof(t[0]); i++)
			deliver(t[i]);
}

/* The loop's callback: what the completions started (UCX sends, "done")
 * goes on at once, not at the next event of another kind. */
static void on_pipe(evutil_socket_t fd, short what, void *arg)
{
	struct gpu *g = arg;

	(void)what;
	drain_pipe(fd);
	if (g->settle)
		g->settle(g->settle_arg);
}

static void *watch(void *arg)
{
	struct gpu *g = arg;

	cudaSetDevice(g->device);
	pthread_mutex_lock(&g->mu);
	for (;;) {
		struct then *t;
		ssize_t n;

		while (!g->head && !g->stop)
			pthread_cond_wait(&g->cv, &g->mu);
		if (!g->head)
			break;
		/* only this thread takes from the queue, so t stays at
		 * its head while we wait; once written, it is the loop's */
		t = g->head;
		pthread_mutex_unlock(&g->mu);
		t->e = cudaEventSynchronize(t->ev);
		pthread_mutex_lock(&g->mu);
		g->head = t->next;
		if (!g->head)
			g->tail = NULL;
		pthread_mutex_unlock(&g->mu);
		do
			n = write(g->pipe[1], &t, sizeof(t));
		while (n < 0 && errno == EINTR);
		pthread_mutex_lock(&g->mu);
	}
	pthread_mutex_unlock(&g->mu);
	return NULL;
}

struct gpu *gpu_new(struct event_base *base, int device,
		    void (*settle)(void *arg), void *arg, char *err,
		    size_t errlen)
{
	struct gpu *g = calloc(1, sizeof(*g));
	int count = 0;
	cudaError_t e;

	if (!g) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	g->pipe[0] = g->pipe[1] = -1;
	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || device >= count) {
		snprintf(err, errlen, "no CUDA device %d here (%s)", device,
			 e != cudaSuccess ? cudaGetErrorString(e) :
					    "fewer devices");
		free(g);
		return NULL;
	}
	g->device = device;
	g->settle = settle;
	g->settle_arg = arg;
	if ((e = cudaSetDevice(device)) != cudaSuccess ||
	    (e = cudaStreamCreateWithFlags(&g->stream,
					   cudaStreamNonBlocking)) !=
		    cudaSuccess) {
		snprintf(err, errlen, "CUDA device %d: %s", device,
			 cudaGetErrorString(e));
		free(g);
		return NULL;
	}
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	/* the reader never blocks; the watcher's writes may (a full pipe
	 * only delays that thread, never loses a record) */
	if (pipe2(g->pipe, O_CLOEXEC) || fcntl(g->pipe[0], F_SETFL, O_NONBLOCK) ||
	    !(g->ev = event_new(base, g->pipe[0], EV_READ | EV_PERSIST, on_pipe,
				g)) ||
	    event_add(g->ev, NULL) ||
	    (errno = pthread_create(&g->watcher, NULL, watch, g))) {
		snprintf(err, errlen, "completion pipe and watcher: %s",
			 strerror(errno));
		gpu_free(g);
		return NULL;
	}
	g->watching = true;
	log_info("CUDA device %d: stream ready", device);
	return g;
}

void gpu_free(struct gpu *g)
{
	if (!g)
		return;
	gpu_drain(g);
	if (g->watching) {
		pthread_mutex_lock(&g->mu);
		g->stop = true;
		pthread_cond_signal(&g->cv);
		pthread_mutex_unlock(&g->mu);
		pthread_join(g->watcher, NULL);
	}
	if (g->pipe[0] >= 0)
		drain_pipe(g->pipe[0]);
	if (g->pending)
		log_warn("%u completions lost at close", g->pending);
	while (g->n_spare)
		cudaEventDestroy(g->spare[--g->n_spare]);
	if (g->stream)
		cudaStreamDestroy(g->stream);
	pthread_mutex_destroy(&g->mu);
	pthread_cond_destroy(&g->cv);
	if (g->ev)
		event_free(g->ev);
	if (g->pipe[0] >= 0)
		close(g->pipe[0]);
	if (g->pipe[1] >= 0)
		close(g->pipe[1]);
	free(g);
}

void gpu_drain(struct gpu *g)
{
	if (!g || !g->stream)
		return;
	cudaStreamSynchronize(g->stream);
	/* the watcher writes what completed; wait for every record */
	while (g->pending && g->watching) {
		struct pollfd pfd = { .fd = g->pipe[0], .events = POLLIN };

		if (poll(&pfd, 1, 1000) <= 0)
			break;
		drain_pipe(g->pipe[0]);
	}
}

int gpu_device(const struct gpu *g)
{
	return g->device;
}

pdx_status_t gpu_mem_open(struct gpu *g, const uint8_t h[PDX_CUDA_IPC_BYTES],
			  void **ptr, char *err, size_t errlen)
{
	cudaIpcMemHandle_t mh;
	cudaError_t e;

	memcpy(&mh, h, sizeof(mh));
	cudaSetDevice(g->device);
	e = cudaIpcOpenMemHandle(ptr, mh, cudaIpcMemLazyEnablePeerAccess);
	if (e != cudaSuccess) {
		*ptr = NULL; /* never closed, nor unmapped as host memory */
		snprintf(err, errlen, "cudaIpcOpenMemHandle: %s",
			 cudaGetErrorString(e));
		return PDX_EINVAL;
	}
	return PDX_OK;
}

void gpu_mem_close(struct gpu *g, void *ptr)
{
	if (!ptr)
		return;
	/* nothing of ours may still be reading or writing it */
	cudaStreamSynchronize(g->stream);
	cuda_err(cudaIpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle");
}

pdx_status_t gpu_event_open(struct gpu *g,
			    const uint8_t h[PDX_CUDA_IPC_BYTES], void **ev)
{
	cudaIpcEventHandle_t eh;

	(void)g;
	memcpy(&eh, h, sizeof(eh));
	return cuda_err(cudaIpcOpenEventHandle((cudaEvent_t *)ev, eh),
			"cudaIpcOpenEventHandle");
}

void gpu_event_close(struct gpu *g, void *ev)
{
	(void)g;
	if (ev)
		cudaEventDestroy((cudaEvent_t)ev);
}

pdx_status_t gpu_wait(struct gpu *g, void *ev)
{
	return cuda_err(cudaStreamWaitEvent(g->stream, (cudaEvent_t)ev, 0),
			"cudaStreamWaitEvent");
}

pdx_status_t gpu_then(struct gpu *g, void (*fn)(void *arg, pdx_status_t st),
		      void *arg)
{
	struct then *t = malloc(sizeof(*t));
	cudaEvent_t ev = NULL;

	if (!t) {
		cudaStreamSynchronize(g->stream); /* as below */
		return PDX_ENOMEM;
	}
	pthread_mutex_lock(&g->mu);
	if (g->n_spare)
		ev = g->spare[--g->n_spare];
	pthread_mutex_unlock(&g->mu);
	if ((!ev && cuda_err(cudaEventCreateWithFlags(
				     &ev, cudaEventDisableTiming |
						  cudaEventBlockingSync),
			     "cudaEventCreate")) ||
	    cuda_err(cudaEventRecord(ev, g->stream), "cudaEventRecord")) {
		if (ev)
			event_put(g, ev);
		free(t);
		/* the caller ends what it queued at once (a chunk's slot
		 * reused, a cuda-ipc transfer failed with an abort that
		 * lets the receiver's engine reuse its blocks): that work
		 * must have run by then */
		cudaStreamSynchronize(g->stream);
		return PDX_EIO;
	}
	*t = (struct then){ g, fn, arg, ev, cudaSuccess, NULL };
	g->pending++;
	pthread_mutex_lock(&g->mu);
	if (g->tail)
		g->tail->next = t;
	else
		g->head = t;
	g->tail = t;
	pthread_cond_signal(&g->cv);
	pthread_mutex_unlock(&g->mu);
	return PDX_OK;
}

void *gpu_dev_alloc(struct gpu *g, size_t len)
{
	void *p = NULL;

	cudaSetDevice(g->device);
	return cudaMalloc(&p, len) == cudaSuccess ? p : NULL;
}

void gpu_dev_free(struct gpu *g, void *p)
{
	if (!p)
		return;
	cudaStreamSynchronize(g->stream);
	cudaFree(p);
}

/* Pages of ours pinned with cudaHostRegister rather than cudaMallocHost:
 * the driver's own mapping of the latter is one that process_vm_readv
 * (UCX's cma) cannot read, so UCX fell back to copying through its
 * shared-memory fragments (1.3 GB/s on an H100 machine, against 55 for
 * the copy to it); and shared memory can be pinned by both agents. */
pdx_status_t gpu_host_register(struct gpu *g, void *p, size_t len)
{
	(void)g;
	return cuda_err(cudaHostRegister(p, len, cudaHostRegisterDefault),
			"cudaHostRegister");
}

void gpu_host_unregister(struct gpu *g, void *p)
{
	if (!p)
		return;
	cudaStreamSynchronize(g->stream);
	cudaHostUnregister(p);
}

pdx_status_t gpu_copy(struct gpu *g, void *dst, const void *src, size_t len)
{
	return cuda_err(cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault,
					g->stream),
			"cudaMemcpyAsync");
}

pdx_status_t gpu_plan_new(struct gpu *g, const struct pdx_kv_region *kv,
			  const uint32_t *blocks, uint32_t n,
			  struct pdx_kv_plan **out)
{
	cudaSetDevice(g->device);
	return pdx_kv_plan_new_cuda(kv, blocks, n, out);
}

static void plan_free_now(void *arg, pdx_status_t st)
{
	(void)st;
	pdx_kv_plan_free_cuda(arg);
}

void gpu_plan_free(struct gpu *g, struct pdx_kv_plan *p)
{
	if (p && gpu_then(g, plan_free_now, p)) {
		cudaStreamSynchronize(g->stream);
		pdx_kv_plan_free_cuda(p);
	}
}

pdx_status_t gpu_gather(struct gpu *g, const struct pdx_kv_plan *p,
			uint64_t first, uint64_t count, void *staging)
{
	return pdx_kv_plan_gather_cuda(p, first, count, staging, g->stream);
}

pdx_status_t gpu_scatter(struct gpu *g, const struct pdx_kv_plan *p,
			 uint64_t first, uint64_t count, const void *staging)
{
	return pdx_kv_plan_scatter_cuda(p, first, count, staging, g->stream);
}

pdx_status_t gpu_plan_copy(struct gpu *g, const struct pdx_kv_plan *src,
			   const struct pdx_kv_plan *dst, uint64_t first,
			   uint64_t count)
{
	return pdx_kv_plan_copy_cuda(src, dst, first, count, g->stream);
}

pdx_status_t gpu_plan_copy_piece(struct gpu *g, const struct pdx_kv_plan *src,
				 const struct pdx_kv_plan *dst,
				 const struct pdx_kv_piece *piece,
				 uint64_t first, uint64_t count)
{
	return pdx_kv_plan_copy_piece_cuda(src, dst, piece, first, count,
					   g->stream);
}
