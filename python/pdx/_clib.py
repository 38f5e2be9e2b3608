"""libpdx through ctypes: the C structs of include/pdx/*.h, the functions'
prototypes, and where the library is found. Nothing here speaks the wire
protocol: libpdx does (docs/protocol.md).

The library is looked for, in order: $PDX_LIBRARY (a path); the libdir
meson installed it to (_paths.py, written at install); a build tree
beside this source tree (../../build/lib, for `PYTHONPATH=python` in a
checkout); the dynamic linker's own search (libpdx.so.0).
"""
import ctypes
import os

ADDR_MAX = 256
REASON_MAX = 256
META_MAX = 65536
KV_DTYPE_MAX = 32
CUDA_IPC_BYTES = 64
XFER_ID_BYTES = 16
XFER_TIMEOUT_MAX_MS = 3600000  # PDX_XFER_TIMEOUT_MAX_MS
MAX_LAYERS = 1024              # layout.h: PDX_MAX_LAYERS
MAX_REGIONS = 1024             # layout.h: PDX_MAX_REGIONS
CUDA_EVENT_SLOTS_MAX = 64      # a registration's CUDA event slots
PEERS_MAX = 0x7fff             # struct pdx_recv_opts: n_peers
SHM_NAME_MAX = 255             # a region's shm_open() name
# the widths ctypes cuts a Python int to, without a word
INT_MAX = 2 ** 31 - 1
U32_MAX = 2 ** 32 - 1
U64_MAX = 2 ** 64 - 1
PTR_MAX = 2 ** (8 * ctypes.sizeof(ctypes.c_void_p)) - 1
SONAME = "libpdx.so.0"


class XferIdC(ctypes.Structure):
    _fields_ = [("b", ctypes.c_uint8 * XFER_ID_BYTES)]


class KvRef(ctypes.Structure):
    _fields_ = [("region", ctypes.c_uint32), ("offset", ctypes.c_uint64)]


class KvLayer(ctypes.Structure):
    _fields_ = [("base", KvRef * 2), ("block_stride", ctypes.c_uint64)]


class KvLayout(ctypes.Structure):
    _fields_ = [("layers", ctypes.c_uint32), ("tensors", ctypes.c_uint32),
                ("blocks", ctypes.c_uint32), ("block_tokens", ctypes.c_uint32),
                ("kv_heads", ctypes.c_uint32), ("head_dim", ctypes.c_uint32),
                ("dtype_bytes", ctypes.c_uint32), ("order", ctypes.c_int),
                ("layer", ctypes.POINTER(KvLayer))]


class EngineRegion(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("shm_name", ctypes.c_char_p),
                ("size", ctypes.c_uint64),
                ("cuda_ipc", ctypes.c_uint8 * CUDA_IPC_BYTES),
                ("cuda_device", ctypes.c_int)]


class CudaEvents(ctypes.Structure):
    _fields_ = [("handles", ctypes.POINTER(ctypes.c_uint8 * CUDA_IPC_BYTES)),
                ("slots", ctypes.c_uint32)]


class EngineParams(ctypes.Structure):
    _fields_ = [("agent", ctypes.c_char_p), ("timeout_ms", ctypes.c_int),
                ("xfer_timeout_ms", ctypes.c_uint32),
                ("liveness_ms", ctypes.c_int)]


class RecvOpts(ctypes.Structure):
    _fields_ = [("skip_tokens", ctypes.c_uint32), ("mode", ctypes.c_int),
                ("peers", ctypes.POINTER(ctypes.c_char_p)),
                ("n_peers", ctypes.c_uint32)]


# enum pdx_xfer_mode
XFER_DEFAULT, XFER_PUSH, XFER_PULL = 0, 1, 2


class EngineEvent(ctypes.Structure):
    _fields_ = [("xfer", XferIdC), ("kind", ctypes.c_int),
                ("status", ctypes.c_int), ("bytes", ctypes.c_uint64),
                ("t_first_ns", ctypes.c_uint64), ("t_last_ns", ctypes.c_uint64),
                ("first_token", ctypes.c_int64),
                ("reason", ctypes.c_char * REASON_MAX)]


_P = ctypes.POINTER
_ENG = ctypes.c_void_p
_XID = _P(XferIdC)
_U32S = _P(ctypes.c_uint32)
_STATUS = ctypes.c_int

# name: (restype, argtypes), as include/pdx/*.h declares them
_PROTOTYPES = {
    "pdx_status_str": (ctypes.c_char_p, [_STATUS]),
    "pdx_engine_connect": (_STATUS, [_P(EngineParams), _P(_ENG)]),
    "pdx_engine_free": (None, [_ENG]),
    "pdx_engine_register_cuda": (_STATUS, [_ENG, _P(KvLayout), _P(EngineRegion),
                                           ctypes.c_size_t, _P(CudaEvents),
                                           ctypes.c_char_p, ctypes.c_size_t]),
    "pdx_engine_send": (_STATUS, [_ENG, _XID, ctypes.c_char_p, _U32S,
                                  ctypes.c_size_t]),
    "pdx_engine_recv": (_STATUS, [_ENG, _XID, ctypes.c_char_p, _U32S,
                                  ctypes.c_size_t, ctypes.c_uint32]),
    "pdx_engine_layer_done": (_STATUS, [_ENG, ctypes.c_uint32, _XID,
                                        ctypes.c_size_t]),
    "pdx_engine_layer_done_slot": (_STATUS, [_ENG, ctypes.c_uint32,
                                             ctypes.c_uint32, _XID,
                                             ctypes.c_size_t]),
    "pdx_engine_token": (_STATUS, [_ENG, _XID, ctypes.c_uint32]),
    "pdx_engine_hold": (_STATUS, [_ENG, _XID, ctypes.c_char_p]),
    "pdx_engine_abort": (_STATUS, [_ENG, _XID]),
    "pdx_engine_abort_at": (_STATUS, [_ENG, _XID, ctypes.c_char_p]),
    "pdx_engine_fd": (ctypes.c_int, [_ENG]),
    "pdx_engine_link_status": (_STATUS, [_ENG, ctypes.c_char_p,
                                         ctypes.c_size_t]),
    "pdx_engine_next_event": (_STATUS, [_ENG, _P(EngineEvent)]),
    "pdx_engine_wait_event": (_STATUS, [_ENG, ctypes.c_int, _P(EngineEvent)]),
    "pdx_xfer_id_random": (_STATUS, [_XID]),
    "pdx_kv_layout_check": (_STATUS, [_P(KvLayout), _P(ctypes.c_uint64),
                                      ctypes.c_size_t, ctypes.c_char_p,
                                      ctypes.c_size_t]),
}

# Added after the first release (libpdx 0.2): used when the library has
# them.
_OPTIONAL = {
    "pdx_engine_last_error": (ctypes.c_char_p, [_ENG]),
    "pdx_engine_cuda_region": (_STATUS, [ctypes.c_void_p, ctypes.c_uint64,
                                         _P(EngineRegion), _P(ctypes.c_uint64),
                                         ctypes.c_char_p, ctypes.c_size_t]),
    "pdx_engine_register_cuda_streams": (_STATUS, [_ENG, _P(KvLayout),
                                                   _P(EngineRegion),
                                                   ctypes.c_size_t,
                                                   ctypes.c_uint32,
                                                   ctypes.c_char_p,
                                                   ctypes.c_size_t]),
    "pdx_engine_layer_done_stream": (_STATUS, [_ENG, ctypes.c_uint32,
                                               ctypes.c_void_p, _XID,
                                               ctypes.c_size_t]),
    # libpdx 0.3
    "pdx_engine_recv_opts": (_STATUS, [_ENG, _XID, ctypes.c_char_p, _U32S,
                                       ctypes.c_size_t, _P(RecvOpts)]),
    "pdx_engine_set_tp": (_STATUS, [_ENG, ctypes.c_uint32, ctypes.c_uint32]),
    # libpdx 0.4
    "pdx_engine_meta": (_STATUS, [_ENG, _XID, ctypes.c_char_p,
                                  ctypes.c_size_t]),
    "pdx_engine_event_meta": (_STATUS, [_ENG, _P(ctypes.c_void_p),
                                        _P(ctypes.c_size_t)]),
    # libpdx 0.6
    "pdx_engine_set_kv_dtype": (_STATUS, [_ENG, ctypes.c_char_p]),
}


def _candidates():
    env = os.environ.get("PDX_LIBRARY")
    if env:
        yield env
        return
    try:
        from . import _paths
        yield os.path.join(_paths.LIBDIR, SONAME)
    except ImportError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "..", "..", "build", "lib", SONAME)
    yield SONAME


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        for name, (res, args) in _PROTOTYPES.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        for name, (res, args) in _OPTIONAL.items():
            f = getattr(lib, name, None)
            if f is not None:
                f.restype, f.argtypes = res, args
        return lib, path
    raise ImportError("pdx: libpdx not found; set PDX_LIBRARY to its path. "
                      "Tried: " + "; ".join(tried))


lib, path = _load()
