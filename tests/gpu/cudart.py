"""The CUDA runtime through ctypes, for the gpu suite's Python tests (no
torch): device memory and copies. open() exits 77 (the test skipped)
where the library cannot be loaded or no GPU is there."""
import ctypes
import os
import sys

H2D, D2H = 1, 2   # cudaMemcpyKind


def skip(why):
    print("# skip:", why)
    sys.exit(77)


class Runtime:
    def __init__(self, lib):
        self.lib = lib

    def malloc(self, size: int) -> int:
        p = ctypes.c_void_p()
        assert self.lib.cudaMalloc(ctypes.byref(p),
                                   ctypes.c_size_t(size)) == 0
        return p.value

    def copy(self, dst: int, src: int, size: int, kind: int) -> None:
        assert self.lib.cudaMemcpy(ctypes.c_void_p(dst), ctypes.c_void_p(src),
                                   ctypes.c_size_t(size), kind) == 0


def open(path: str) -> Runtime:
    """libcudart at path (meson gives the toolkit's), with a GPU."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        skip("no CUDA runtime: %s" % e)
    n = ctypes.c_int(0)
    e = lib.cudaGetDeviceCount(ctypes.byref(n))
    # with an NVIDIA driver loaded, CUDA failing to count the devices (a
    # driver older than this runtime: cudaErrorInsufficientDriver, 35, the
    # code a machine without any driver gets) fails: never a quiet skip
    if e not in (0, 100) and os.path.exists("/proc/driver/nvidia/version"):
        print("FAIL an NVIDIA driver is loaded, but cudaGetDeviceCount "
              "says error %d (a driver older than %s?)" % (e, path))
        sys.exit(1)
    if e != 0 or n.value == 0:
        skip("no GPU")
    return Runtime(lib)
