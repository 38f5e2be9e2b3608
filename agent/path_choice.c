/* Which data path a peer's bytes take (docs/architecture.md, "Data path";
 * docs/gpu.md), chosen once per peer when its handshake is applied: from
 * what both sides said, what this host can reach of the peer's memory and
 * --data-path. A forced path that cannot work refuses the handshake with
 * why. */
#define PDX_LOG_TOPIC "peer"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/log.h"
#include "common/prefault.h"

/* UCX shared-memory transports are usable unless UCX_TLS leaves them out. */
bool path_ucx_has_shm(void)
{
	return pdx_ucx_tls_lets_in((const char *const[]){
	    "sm", "shm", "posix", "sysv", "cma", "knem", "xpmem", "all", NULL});
}

/* Maps the peer's shared memory where it can be (same host), else says it
 * cannot be, e.g. when /dev/shm is not shared. */
static bool map_peer_regions(struct peer *p)
{
	for (uint32_t i = 0; i < p->n_regions; i++) {
		struct remote_region *r = &p->regions[i];
		int fd = r->shm_name[0] ? shm_open(r->shm_name, O_RDWR, 0) : -1;
		struct stat st;

		if (fd >= 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_size >= r->size)
			r->map = mmap(NULL, r->size, PROT_READ | PROT_WRITE,
				      MAP_SHARED | MAP_POPULATE, fd, 0);
		if (fd >= 0)
			close(fd);
		if (r->map && r->map != MAP_FAILED) {
			pdx_prefault(r->map, r->size);
			p->agent->held_by = "mapping a peer's memory, page "
					    "by page";
		}
		if (!r->map || r->map == MAP_FAILED) {
			r->map = NULL;
			for (uint32_t j = 0; j < i; j++) {
				munmap(p->regions[j].map, p->regions[j].size);
				p->regions[j].map = NULL;
			}
			return false;
		}
	}
	return true;
}

/* Opens the peer's GPU memory here with CUDA IPC (same host). */
static bool open_peer_gpu(struct agent *a, struct peer *p)
{
	char err[PDX_REASON_MAX];

	for (uint32_t i = 0; i < p->n_regions; i++) {
		struct remote_region *r = &p->regions[i];

		if (gpu_mem_open(a->gpu, r->ipc, &r->dptr, err, sizeof(err))) {
			log_warn("peer %s: its GPU memory cannot be opened here: %s",
				 p->addr, err);
			for (uint32_t j = 0; j < i; j++) {
				gpu_mem_close(a->gpu, p->regions[j].dptr);
				p->regions[j].dptr = NULL;
			}
			return false;
		}
	}
	return true;
}

/* GPU memory on both sides (docs/gpu.md): UCX moves it where it can, else
 * our stream copies into the peer's memory where CUDA IPC opens it (same
 * host), else pinned host staging, which works everywhere. A forced path
 * that cannot work refuses the handshake with why. */
static pdx_status_t choose_gpu_path(struct agent *a, struct peer *p,
				    const msgpack_object *staging, char *err,
				    size_t errlen)
{
	bool put = pdx_ucx_has_cuda(a->ucx) && p->cuda_ucx;

	for (uint32_t i = 0; i < p->n_regions; i++)
		put = put && p->regions[i].rkey; /* it registered them all */
	/* On one host we map its staging whatever our own path: it may send
	 * to us by staged while we send to it otherwise (a forced path, or
	 * its CUDA IPC opening failed where ours worked). */
	if (p->same_host && p->peer_shm)
		staged_peer_map(a, p, staging);

	switch (a->cfg.data_path) {
	case DATA_CUDA_PUT:
		if (!put) {
			snprintf(err, errlen, "data path cuda-put: %s UCX has no CUDA support",
				 pdx_ucx_has_cuda(a->ucx) ? "the peer's" : "our");
			return PDX_EINCOMPAT;
		}
		p->path = DATA_CUDA_PUT;
		return PDX_OK;
	case DATA_CUDA_IPC:
		if (!p->same_host || !open_peer_gpu(a, p)) {
			snprintf(err, errlen, "data path cuda-ipc: cannot open %s's GPU memory here (%s)",
				 p->addr, p->same_host ? "see the log" : "another host");
			return PDX_EINCOMPAT;
		}
		p->path = DATA_CUDA_IPC;
		return PDX_OK;
	case DATA_STAGED:
		break;
	case DATA_AUTO:
		if (put) {
			p->path = DATA_CUDA_PUT;
			return PDX_OK;
		}
		if (p->same_host && open_peer_gpu(a, p)) {
			p->path = DATA_CUDA_IPC;
			return PDX_OK;
		}
		break;
	default:
		snprintf(err, errlen, "data path %s moves host memory; the KV is in GPU memory",
			 data_path_name(a->cfg.data_path));
		return PDX_EINCOMPAT;
	}
	/* Staged. Where the peer's staging maps here, we assume ours maps
	 * there: no copy between the two (a receiver that cannot map it
	 * fails the transfer, saying so). */
	p->path = DATA_STAGED;
	p->staged_shared = p->staging_map != NULL;
	return PDX_OK;
}

/* Measured on one host (docs/architecture.md): a copy between mapped
 * pools runs at memcpy speed, UCX put (emulated by active messages over
 * shared memory) at about half of it, and over
 * TCP UCX emulates put two orders of magnitude slower than messages. */
static enum data_path choose_path(struct agent *a, struct peer *p)
{
	bool shm_lane = p->same_host && path_ucx_has_shm() && p->peer_shm;

	switch (a->cfg.data_path) {
	case DATA_IPC:
		if (p->same_host && map_peer_regions(p))
			return DATA_IPC;
		log_warn("peer %s: cannot map its memory; using ucx", p->addr);
		return shm_lane ? DATA_PUT : DATA_AM;
	case DATA_PUT:
	case DATA_AM:
		return a->cfg.data_path;
	default: /* shared memory only where UCX_TLS allows it */
		if (shm_lane && map_peer_regions(p))
			return DATA_IPC;
		return shm_lane ? DATA_PUT : DATA_AM;
	}
}

pdx_status_t path_choose(struct agent *a, struct peer *p,
			 const msgpack_object *staging, char *err, size_t errlen)
{
	static const struct data_path_ops *const ops[] = {
		[DATA_IPC] = &data_path_ipc_ops,
		[DATA_PUT] = &data_path_put_ops,
		[DATA_AM] = &data_path_am_ops,
		[DATA_CUDA_PUT] = &data_path_cuda_put_ops,
		[DATA_CUDA_IPC] = &data_path_cuda_ipc_ops,
		[DATA_STAGED] = &data_path_staged_ops,
	};
	pdx_status_t st = PDX_OK;

	if (a->reg.cuda) {
		st = choose_gpu_path(a, p, staging, err, errlen);
	} else if (data_path_gpu(a->cfg.data_path)) {
		snprintf(err, errlen, "data path %s needs GPU memory; the KV is in host memory",
			 data_path_name(a->cfg.data_path));
		st = PDX_EINCOMPAT;
	} else {
		p->path = choose_path(a, p);
	}
	if (!st)
		p->ops = ops[p->path];
	return st;
}
