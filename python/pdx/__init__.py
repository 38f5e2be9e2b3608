"""pdx from Python: the engine link to a pdx-agent (pdx.Engine) over the
libpdx C library through ctypes, and host KV memory the agent can map.

    import pdx
    with pdx.Engine("ipc:///run/pdx/p.engine") as eng:
        peer = eng.register(layout, [pool.region])
        eng.send(xfer, decode_agent_peer, blocks)
        for layer in range(layout.layers):
            eng.layer_done(layer, [xfer])
        ev = eng.wait_event(timeout=30)

docs/libpdx.md explains the calls; include/pdx/engine.h is the contract.
"""
from .engine import (CudaRegion, Engine, Error, Event, Layout, ShmRegion,
                     XferId, cuda_region, cuda_regions_for, current_stream,
                     status_str, NHD, HND, SENT, RECEIVED, FAILED,
                     OK, EAGAIN, EINVAL, ERANGE, ENOENT, EEXIST, ETIMEDOUT,
                     ECANCELED, EPERM, ETOOBIG, EPEER, EINCOMPAT, ENOMEM, EIO,
                     ENOTREG, EAGENT)
from .shm import SharedPool, region_of, regions_for
from ._clib import META_MAX, path as library_path

__all__ = [
    "CudaRegion", "Engine", "Error", "Event", "Layout", "ShmRegion", "XferId",
    "SharedPool", "region_of", "regions_for", "cuda_region",
    "cuda_regions_for", "current_stream", "status_str",
    "library_path", "META_MAX",
    "NHD", "HND", "SENT", "RECEIVED", "FAILED", "OK", "EAGAIN", "EINVAL",
    "ERANGE", "ENOENT", "EEXIST", "ETIMEDOUT", "ECANCELED", "EPERM",
    "ETOOBIG", "EPEER", "EINCOMPAT", "ENOMEM", "EIO", "ENOTREG", "EAGENT",
]
