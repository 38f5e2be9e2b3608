"""Host KV memory the agent can map: POSIX shared memory objects.

pdx-agent maps an engine's host KV by its shm_open() name, so host memory
registered with pdx must live in one. SharedPool makes one (torch or numpy
tensors are then views of its buffer); region_of() finds the object and
the offset behind any address in this process (a tensor's data_ptr()),
from /proc/self/maps.
"""
import ctypes
import os
from multiprocessing import shared_memory
from typing import Dict, List, Sequence, Tuple

from .engine import EINVAL, Error, ShmRegion


class SharedPool:
    """A new POSIX shared memory object of size bytes, mapped here;
    unlinked by close() (the agent keeps its own mapping)."""

    def __init__(self, size: int, name: str = None):
        self._shm = shared_memory.SharedMemory(name=name, create=True,
                                               size=size)
        self.size = size
        self.region = ShmRegion("/" + self._shm.name, size)

    def _open(self) -> shared_memory.SharedMemory:
        if self._shm is None:
            raise ValueError("this SharedPool is closed")
        return self._shm

    @property
    def buf(self) -> memoryview:
        return self._open().buf

    @property
    def address(self) -> int:
        """The mapping's first byte in this process."""
        return ctypes.addressof(ctypes.c_char.from_buffer(self._open().buf))

    def close(self) -> None:
        if self._shm is None:
            return
        try:
            self._shm.close()
        except BufferError:
            pass  # views still exported (tensors): the mapping stays
        self._shm.unlink()
        self._shm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _maps() -> List[Tuple[int, int, int, str]]:
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 5:
                continue
            lo, hi = (int(v, 16) for v in parts[0].split("-"))
            path = parts[5].rstrip("\n") if len(parts) == 6 else ""
            out.append((lo, hi, int(parts[2], 16), path))
    return out


def region_of(address: int, size: int,
              maps: Sequence[Tuple[int, int, int, str]] = None
              ) -> Tuple[ShmRegion, int]:
    """The shared memory object holding [address, address + size) and the
    offset of address in it; Error(EINVAL) saying what the memory is
    instead when it is not one the agent can map."""
    for lo, hi, file_off, path in maps if maps is not None else _maps():
        if not lo <= address < hi:
            continue
        if address + size > hi:
            raise Error(EINVAL, "memory at 0x%x (+%d) crosses the end of "
                        "its mapping %s" % (address, size, path or "anon"))
        if path.endswith(" (deleted)"):
            raise Error(EINVAL, "memory at 0x%x is in %s, whose name is "
                        "gone: the agent cannot open it (allocate it in "
                        "a pdx.SharedPool)" % (address, path))
        if not path.startswith("/dev/shm/"):
            raise Error(EINVAL, "memory at 0x%x is %s, not a POSIX shared "
                        "memory object: the agent cannot map it (allocate "
                        "it in a pdx.SharedPool)"
                        % (address, path or "anonymous memory"))
        name = path[len("/dev/shm"):]
        return ShmRegion(name, os.stat(path).st_size), address - lo + file_off
    raise Error(EINVAL, "no mapping holds address 0x%x" % address)


def regions_for(spans: Sequence[Tuple[int, int]]
                ) -> Tuple[List[ShmRegion], List[Tuple[int, int]]]:
    """For (address, size) spans: the distinct regions that hold them and,
    per span, (region index, offset)."""
    maps = _maps()
    regions: List[ShmRegion] = []
    index: Dict[str, int] = {}
    refs = []
    for address, size in spans:
        r, off = region_of(address, size, maps)
        if r.name not in index:
            index[r.name] = len(regions)
            regions.append(r)
        refs.append((index[r.name], off))
    return regions, refs
