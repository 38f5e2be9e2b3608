/* Touches every page of a shared mapping once, with a write that keeps
 * its contents, so the first transfer through it runs at memory speed.
 *
 * MAP_POPULATE fills the process's page tables, but on a virtual machine
 * with shadow page tables the first write to each page from each process
 * still traps to the hypervisor. Measured on the 2-core development VM
 * with llama3-8b pools (2 GiB): the first 1 GiB transfer took 2.0 s, the
 * next ones 0.3 s; a read pass was not enough; after this pass the first
 * one took 0.33 s too. The pass costs ~1.5 s per GiB there, once, when
 * the mapping is made; on bare metal it costs a cache miss per page.
 *
 * An atomic add of zero is a write that cannot lose a concurrent store of
 * the process that owns the memory (an engine writing its KV).
 */
#ifndef PDX_COMMON_PREFAULT_H
#define PDX_COMMON_PREFAULT_H

#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

static inline void pdx_prefault(void *addr, size_t size)
{
	uint8_t *p = addr;
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	for (size_t o = 0; o < size; o += page)
		__atomic_fetch_add(p + o, 0, __ATOMIC_RELAXED);
}

#endif
