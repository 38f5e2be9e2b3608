"""pdx.Engine: an engine's link to the pdx-agent beside it, over libpdx
(include/pdx/engine.h says what each call means; docs/libpdx.md how an
engine uses them). A thin layer: Python objects in, C calls, exceptions
out. What the C calls could not take raises TypeError or ValueError,
naming the parameter, before any of them; what libpdx refuses raises
pdx.Error. One Engine belongs to one thread at a time, like its C struct.
"""
import array
import ctypes
import math
import numbers
import operator
import select
import threading
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

from . import _clib
from ._clib import lib

# include/pdx/status.h
OK, EAGAIN = 0, 1
EINVAL, ERANGE, ENOENT, EEXIST = -1, -2, -3, -4
ETIMEDOUT, ECANCELED, EPERM, ETOOBIG = -5, -6, -7, -8
EPEER, EINCOMPAT = -100, -101
ENOMEM, EIO, ENOTREG, EAGENT = -200, -201, -202, -203

_STATUS_NAMES = {
    OK: "OK", EAGAIN: "EAGAIN", EINVAL: "EINVAL", ERANGE: "ERANGE",
    ENOENT: "ENOENT", EEXIST: "EEXIST", ETIMEDOUT: "ETIMEDOUT",
    ECANCELED: "ECANCELED", EPERM: "EPERM", ETOOBIG: "ETOOBIG",
    EPEER: "EPEER", EINCOMPAT: "EINCOMPAT", ENOMEM: "ENOMEM", EIO: "EIO",
    ENOTREG: "ENOTREG", EAGENT: "EAGENT",
}

NHD, HND = 0, 1  # enum pdx_kv_order
SENT, RECEIVED, FAILED = "sent", "received", "failed"
_KINDS = {0: SENT, 1: RECEIVED, 2: FAILED}


def status_str(status: int) -> str:
    return lib.pdx_status_str(status).decode()


class Error(Exception):
    """A libpdx call failed: status (a negative pdx status), its name
    (e.g. "EINVAL"), and the reason in words."""

    def __init__(self, status: int, reason: str = ""):
        self.status = status
        self.name = _STATUS_NAMES.get(status, str(status))
        self.reason = reason or status_str(status)
        super().__init__("%s: %s" % (self.name, self.reason))


class XferId:
    """A transfer id: 16 bytes, written as 32 lowercase hex digits."""
    __slots__ = ("_c",)

    def __init__(self, value: Union[str, bytes, "XferId", None] = None):
        self._c = _clib.XferIdC()
        if value is None:
            _check(lib.pdx_xfer_id_random(ctypes.byref(self._c)))
            return
        if isinstance(value, XferId):
            raw = bytes(value._c.b)
        elif isinstance(value, str):
            try:
                raw = bytes.fromhex(value) if len(value) == 32 else b""
            except ValueError:
                raw = b""
        else:
            raw = _buffer("a transfer id is an XferId, 32 hex digits or 16 "
                          "bytes", value)
        if len(raw) != _clib.XFER_ID_BYTES:
            raise ValueError("a transfer id is 16 bytes or 32 hex digits")
        ctypes.memmove(self._c.b, raw, len(raw))

    @property
    def hex(self) -> str:
        return bytes(self._c.b).hex()

    def __bytes__(self):
        return bytes(self._c.b)

    def __str__(self):
        return self.hex

    def __repr__(self):
        return "XferId(%r)" % self.hex

    def __eq__(self, other):
        return isinstance(other, XferId) and bytes(self) == bytes(other)

    def __hash__(self):
        return hash(bytes(self))


XferLike = Union[XferId, str, bytes]


def _xid(x: XferLike) -> XferId:
    return x if isinstance(x, XferId) else XferId(x)


def _check(status: int, reason: str = "") -> None:
    if status < 0:
        raise Error(status, reason)


# What libpdx takes is checked here, before any C call: ctypes cuts a
# Python int to its C type's width without a word (token -5 reached the
# decode side as 4294967291, blocks=2**32 became 0), and a str or bytes
# where the other is wanted fails deep inside. A wrong type is a
# TypeError, a value outside what the C call takes a ValueError; both
# name the parameter as the caller wrote it.

def _int(name: str, value, lo: int, hi: int, note: str = "") -> int:
    """value (an int, or anything with __index__: numpy's, torch's) if
    it is in lo..hi; note: what its values mean, for the error."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError("%s: want an int, not %s"
                        % (name, type(value).__name__))
    v = operator.index(value)
    if not lo <= v <= hi:
        raise ValueError("%s: %d outside %d..%d%s"
                         % (name, v, lo, hi, " (%s)" % note if note else ""))
    return v


def _cstr(name: str, value, what: str, none_ok: bool = False,
          max_bytes: int = _clib.ADDR_MAX - 1) -> Optional[bytes]:
    """value, a str, as the C string libpdx takes: 1 to max_bytes bytes
    of UTF-8, no NUL (C would end it there)."""
    if value is None and none_ok:
        return None
    if not isinstance(value, str):
        raise TypeError("%s: want %s (a str%s), not %s"
                        % (name, what, " or None" if none_ok else "",
                           type(value).__name__))
    try:
        raw = value.encode()
    except UnicodeEncodeError:   # a lone surrogate: no UTF-8 for it
        raise ValueError("%s: want %s in UTF-8, not %r"
                         % (name, what, value)) from None
    if not 0 < len(raw) <= max_bytes or b"\0" in raw:
        raise ValueError("%s: want %s of 1 to %d bytes without NUL, not %r"
                         % (name, what, max_bytes, value))
    return raw


def _buffer(what: str, value) -> bytes:
    """The bytes of a bytes-like value, or of a list or tuple of ints
    (0..255), as bytes() takes them. Not of an int: bytes(16) is 16 zero
    bytes. what: the error's words, "name: want ..." """
    try:
        if isinstance(value, (list, tuple)):
            return bytes(value)
        return bytes(memoryview(value))
    except TypeError:
        raise TypeError("%s, not %s" % (what, type(value).__name__)) from None


def _engine_addr(agent) -> bytes:
    """The agent's engine address: ipc://PATH, as pdx-agent --engine
    takes it (any other would only time out at register)."""
    raw = _cstr("agent", agent, "the agent's engine address, ipc://PATH")
    if not raw.startswith(b"ipc://") or raw == b"ipc://":
        raise ValueError(
            "agent: the engine link is ipc://PATH (the agent's --engine), "
            "not %r%s" % (agent, "; tcp:// is an agent's peer address (its "
                          "--listen), the one send and recv name"
                          if agent.startswith("tcp://") else ""))
    return raw


@dataclass
class ShmRegion:
    """Host memory: a POSIX shared memory object the agent maps by name
    ("/name", as shm_open takes it)."""
    name: str
    size: int


@dataclass
class CudaRegion:
    """GPU memory: the CUDA IPC handle (cudaIpcGetMemHandle, 64 bytes) of
    an allocation's first byte, its size and its device. base: that first
    byte's address when cuda_region() made it (0: not known)."""
    ipc_handle: bytes
    size: int
    device: int = 0
    base: int = 0


def _lib_fn(name: str):
    f = getattr(lib, name, None)
    if f is None:
        raise Error(EINVAL, "%s: this libpdx (%s) is older than the call"
                    % (name, _clib.path))
    return f


def cuda_region(ptr: int, size: int) -> Tuple[CudaRegion, int]:
    """The region holding the device memory [ptr, ptr + size) (e.g. a KV
    tensor's data_ptr() and its bytes) and where ptr is in it: (region,
    offset). Tensors inside one allocation give equal regions (the same
    base): register each base once and name each tensor (its region's
    index, offset). Memory legacy CUDA IPC cannot share (cuMemCreate,
    managed, host) raises Error saying which; so does a machine without
    a CUDA driver or device (docs/libpdx.md)."""
    ptr = _int("ptr", ptr, 0, _clib.PTR_MAX)
    size = _int("size", size, 0, _clib.U64_MAX)
    out = _clib.EngineRegion()
    off = ctypes.c_uint64()
    why = ctypes.create_string_buffer(512)
    st = _lib_fn("pdx_engine_cuda_region")(ptr, size, ctypes.byref(out),
                                           ctypes.byref(off), why, len(why))
    if st < 0:
        raise Error(st, "cuda_region: " + why.value.decode(errors="replace"))
    return (CudaRegion(bytes(out.cuda_ipc), out.size, out.cuda_device,
                       ptr - off.value), off.value)


def cuda_regions_for(spans: Sequence[Tuple[int, int]]
                     ) -> Tuple[List["CudaRegion"], List[Tuple[int, int]]]:
    """As pdx.regions_for, for device memory: for (address, size) spans,
    one region per CUDA allocation that holds them and, per span,
    (region index, offset)."""
    regions, index, refs = [], {}, []
    for address, size in spans:
        r, off = cuda_region(address, size)
        if r.base not in index:
            index[r.base] = len(regions)
            regions.append(r)
        refs.append((index[r.base], off))
    return regions, refs


def _stream(stream) -> int:
    """A CUDA stream as a pointer: an int (0: the legacy default stream)
    or anything with .cuda_stream (torch.cuda.Stream)."""
    return _int("stream", getattr(stream, "cuda_stream", stream), 0,
                _clib.PTR_MAX, "a CUstream; 0: the legacy default stream")


def current_stream():
    """The CUDA stream an engine computes on now, for layer_done(stream=):
    torch's current one where torch drives CUDA (vLLM, SGLang), else 0,
    the legacy default stream, which follows the work queued before it on
    blocking streams only: an engine whose KV writes go on a stream made
    with cudaStreamNonBlocking passes that stream itself."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.current_stream() if torch.cuda.is_available() else 0


Region = Union[ShmRegion, CudaRegion]

# the layout's uint32 fields: here only what ctypes would cut (their
# ranges are pdx_kv_layout_check's, in lib/layout.c, below)
_LAYOUT_U32 = ("blocks", "block_tokens", "kv_heads", "head_dim",
               "dtype_bytes")


@dataclass
class Layout:
    """Where block b of tensor t of layer l lives: in region bases[l][t][0]
    at offset bases[l][t][1] + b * block_stride[l] (include/pdx/layout.h).
    tensors is 2 (K and V) or 1 (MLA); order NHD or HND."""
    blocks: int
    block_tokens: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    bases: Sequence[Sequence[Tuple[int, int]]]
    block_stride: Sequence[int]
    tensors: int = 2
    order: int = NHD

    @property
    def layers(self) -> int:
        return len(self.bases)

    @property
    def block_bytes(self) -> int:
        """One block of one tensor of one layer."""
        return self.block_tokens * self.kv_heads * self.head_dim * \
            self.dtype_bytes

    def _c(self):
        """The C struct, each field checked against what
        pdx_kv_layout_check takes first."""
        n = _int("layout.layers", self.layers, 1, _clib.MAX_LAYERS,
                 "one bases entry per layer")
        tensors = _int("layout.tensors", self.tensors, 1, 2,
                       "1: MLA, 2: K and V")
        f = {k: _int("layout." + k, getattr(self, k), 1, _clib.U32_MAX)
             for k in _LAYOUT_U32}
        order = _int("layout.order", self.order, NHD, HND,
                     "pdx.NHD or pdx.HND")
        if len(self.block_stride) != n:
            raise ValueError("layout: one block_stride per layer")
        layers = (_clib.KvLayer * n)()
        for i, (bases, stride) in enumerate(zip(self.bases,
                                                self.block_stride)):
            if len(bases) != tensors:
                raise ValueError("layout: layer %d has %d bases, want %d"
                                 % (i, len(bases), tensors))
            for t, (region, offset) in enumerate(bases):
                at = "layout.bases[%d][%d]" % (i, t)
                layers[i].base[t].region = _int(at + " region", region, 0,
                                                _clib.U32_MAX)
                layers[i].base[t].offset = _int(at + " offset", offset, 0,
                                                _clib.U64_MAX)
            layers[i].block_stride = _int("layout.block_stride[%d]" % i,
                                          stride, 0, _clib.U64_MAX)
        c = _clib.KvLayout(n, tensors, f["blocks"], f["block_tokens"],
                           f["kv_heads"], f["head_dim"], f["dtype_bytes"],
                           order, layers)
        return c, layers  # layers: kept alive with c


@dataclass
class Event:
    """A transfer's one outcome: kind is "sent", "received" or "failed"
    (then status and reason say why)."""
    xfer: XferId
    kind: str
    status: int
    bytes: int
    t_first_ns: int
    t_last_ns: int
    first_token: Optional[int]
    reason: str = ""
    meta: bytes = b""  # received: what the sender's meta() attached

    @property
    def ok(self) -> bool:
        return self.kind != FAILED

    @property
    def status_name(self) -> str:
        return _STATUS_NAMES.get(self.status, str(self.status))


# wait_event() in the main thread: the longest a signal's handler waits
_WAIT_SLICE_MS = 100


def _blocks(blocks: Sequence[int]):
    """A uint32 array C can read without a copy per element. Sets (no
    token order) and bytes (read as raw uint32s) are refused."""
    if isinstance(blocks, (set, frozenset, bytes, bytearray, memoryview)):
        raise Error(EINVAL, "blocks: want block ids in token order (a "
                    "list, tuple or array), not %s" % type(blocks).__name__)
    if isinstance(blocks, array.array) and blocks.typecode == "I":
        a = blocks
    else:
        try:
            a = array.array("I", blocks)
        except (OverflowError, TypeError):
            for i, b in enumerate(blocks):  # which one, and why
                _int("blocks[%d]" % i, b, 0, _clib.U32_MAX)
            raise
    if not a:
        raise Error(EINVAL, "blocks: want at least one block id")
    ptr = (ctypes.c_uint32 * len(a)).from_buffer(a)
    return ptr, len(a)


def _xids(xfers: Sequence[XferLike]):
    n = len(xfers)
    arr = (_clib.XferIdC * max(n, 1))()
    for i, x in enumerate(xfers):
        arr[i] = _xid(x)._c
    return arr, n


def _peer(peer: Optional[str], name: str = "peer") -> Optional[bytes]:
    return _cstr(name, peer, "an agent's peer address", none_ok=True)


class Engine:
    """The link to one pdx-agent (agent: its engine address, ipc://...).
    Connecting does not wait for the agent; register() does.

    Calls that announce or abort transfers return at once; each announced
    transfer ends in exactly one Event (next_event, wait_event, events).
    fileno() is readable, edge-triggered, when events may be waiting:
    after it fires, drain with events() before sleeping on it again."""

    def __init__(self, agent: str, timeout_ms: int = 0,
                 xfer_timeout_ms: int = 0, liveness_ms: int = 0):
        params = _clib.EngineParams(
            _engine_addr(agent),
            _int("timeout_ms", timeout_ms, 0, _clib.INT_MAX, "0: 10000"),
            _int("xfer_timeout_ms", xfer_timeout_ms, 0,
                 _clib.XFER_TIMEOUT_MAX_MS,
                 "an hour; 0: the agent's --xfer-timeout-ms"),
            _int("liveness_ms", liveness_ms, 0, _clib.INT_MAX, "0: 1000"))
        self._agent = agent
        h = ctypes.c_void_p()
        self._call(lib.pdx_engine_connect(ctypes.byref(params),
                                          ctypes.byref(h)),
                   "connect to %s" % agent)
        self._h = h
        self._ev = _clib.EngineEvent()
        self.peer_addr: Optional[str] = None

    # -- life --------------------------------------------------------
    def close(self) -> None:
        """Closes the link, which ends the registration: the agent fails
        the transfers in flight, their events unheard (abort them and take
        their events first: a receive's blocks may be written until
        then). Another
        thread in a call on this Engine (wait_event(None), say) gets
        pdx.Error (EINVAL) at once; one that calls after gets it too."""
        h, self._h = getattr(self, "_h", None), None
        if h:
            self._closed = True
            lib.pdx_engine_free(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def _handle(self):
        if not self._h:
            raise Error(EINVAL, "this Engine is closed")
        return self._h

    def _call(self, status: int, what: str) -> int:
        if status >= 0:
            return status
        why = ""
        last = getattr(lib, "pdx_engine_last_error", None)
        if getattr(self, "_closed", False):
            # close() from another thread during the call: libpdx woke
            # the call and freed the engine as it returned (its reason
            # went with it)
            why = "this Engine was closed during the call"
        elif last is not None and getattr(self, "_h", None):
            msg = last(self._h)
            why = msg.decode(errors="replace") if msg else ""
        if why.startswith(what + ":"):  # libpdx named the call already
            raise Error(status, why)
        raise Error(status, "%s: %s" % (what, why or status_str(status)))

    # -- registration ------------------------------------------------
    def register(self, layout: Layout, regions: Sequence[Region],
                 cuda_events: Optional[Sequence[bytes]] = None,
                 cuda_event_slots: int = 0) -> str:
        """Registers the KV memory and layout with the agent and waits for
        its answer; returns the agent's peer address (the one the other
        side of a transfer names). cuda_events: slots x layers IPC event
        handles (64 bytes each), slot-major, for a GPU engine that makes
        and records its own events (layer_done(..., slot=)). Without
        them, cuda_event_slots > 0 has libpdx make the events (on the
        device of the first CudaRegion): then layer_done(..., stream=)."""
        lay, keep = layout._c()
        _int("len(regions)", len(regions), 1, _clib.MAX_REGIONS)
        slots = _int("cuda_event_slots", cuda_event_slots,
                     0 if cuda_events is None else 1,
                     _clib.CUDA_EVENT_SLOTS_MAX)
        regs = (_clib.EngineRegion * len(regions))()
        names = []
        for i, r in enumerate(regions):
            at = "regions[%d]" % i
            if isinstance(r, ShmRegion):
                names.append(_cstr(at + ".name", r.name, "an shm_open() name",
                                   max_bytes=_clib.SHM_NAME_MAX))
                regs[i].type, regs[i].shm_name = 0, names[-1]
            elif isinstance(r, CudaRegion):
                if len(r.ipc_handle) != _clib.CUDA_IPC_BYTES:
                    raise ValueError("a CUDA IPC handle is 64 bytes")
                regs[i].type = 1
                regs[i].cuda_device = _int(at + ".device", r.device, 0,
                                           _clib.INT_MAX)
                ctypes.memmove(regs[i].cuda_ipc, r.ipc_handle,
                               _clib.CUDA_IPC_BYTES)
            else:
                raise TypeError("regions: ShmRegion or CudaRegion")
            regs[i].size = _int(at + ".size", r.size, 1, _clib.U64_MAX)
        events = None
        if cuda_events is not None:
            if len(cuda_events) != slots * lay.layers:
                raise ValueError("cuda_events: want cuda_event_slots x "
                                 "layers = %d handles, not %d"
                                 % (slots * lay.layers, len(cuda_events)))
            Handle = ctypes.c_uint8 * _clib.CUDA_IPC_BYTES
            hs = (Handle * len(cuda_events))()
            for i, h in enumerate(cuda_events):
                h = _buffer("cuda_events[%d]: want 64 bytes" % i, h)
                if len(h) != _clib.CUDA_IPC_BYTES:
                    raise ValueError("cuda_events[%d]: a CUDA IPC event "
                                     "handle is 64 bytes, not %d"
                                     % (i, len(h)))
                ctypes.memmove(hs[i], h, _clib.CUDA_IPC_BYTES)
            events = _clib.CudaEvents(
                ctypes.cast(hs, ctypes.POINTER(Handle)), slots)
        err = ctypes.create_string_buffer(256)
        sizes = (ctypes.c_uint64 * len(regions))(*[r.size for r in regions])
        st = lib.pdx_kv_layout_check(ctypes.byref(lay), sizes, len(regions),
                                     err, len(err))
        if st < 0:  # its status, as C's register gives it (ERANGE, EINVAL)
            raise Error(st, "layout: " + err.value.decode())
        peer = ctypes.create_string_buffer(_clib.ADDR_MAX)
        if cuda_events is None and slots:
            st = _lib_fn("pdx_engine_register_cuda_streams")(
                self._handle(), ctypes.byref(lay), regs, len(regions),
                slots, peer, len(peer))
        else:
            st = lib.pdx_engine_register_cuda(
                self._handle(), ctypes.byref(lay), regs, len(regions),
                ctypes.byref(events) if events is not None else None,
                peer, len(peer))
        self._call(st, "register with %s" % self._agent)
        del keep, names
        self.peer_addr = peer.value.decode()
        return self.peer_addr

    # -- transfers ---------------------------------------------------
    def send(self, xfer: XferLike, peer: Optional[str],
             blocks: Sequence[int]) -> None:
        """Prefill side: xfer is produced in these blocks (token order),
        pushed to the agent at peer (None: the first agent that claims
        it; docs/security.md)."""
        b, n = _blocks(blocks)
        self._call(lib.pdx_engine_send(self._handle(),
                                       ctypes.byref(_xid(xfer)._c),
                                       _peer(peer), b, n), "send")

    def set_tp(self, rank: int, size: int) -> None:
        """Tensor parallelism: this engine is rank of a TP instance of size
        ranks, from the next register on (docs/protocol.md, "TP legs")."""
        size = _int("size", size, 0, _clib.U32_MAX)  # libpdx says the rest
        rank = _int("rank", rank, 0, _clib.U32_MAX)
        self._call(_lib_fn("pdx_engine_set_tp")(self._handle(), rank, size),
                   "set_tp")

    def set_kv_dtype(self, name: Optional[str]) -> None:
        """The KV's element type by name ("bfloat16", "float16",
        "float8_e4m3fn"; None: none), from the next register on: agents
        whose engines name different ones refuse to pair (the layout
        knows only its bytes)."""
        raw = _cstr("name", name, "an element type's name", none_ok=True,
                    max_bytes=_clib.KV_DTYPE_MAX - 1)
        self._call(_lib_fn("pdx_engine_set_kv_dtype")(self._handle(), raw),
                   "set_kv_dtype")

    def recv(self, xfer: XferLike, peer: Optional[str], blocks: Sequence[int],
             skip_tokens: int = 0, pull: Optional[bool] = None,
             peers: Optional[Sequence[str]] = None) -> None:
        """Decode side: receive xfer from the agent at peer into these
        blocks; the first skip_tokens tokens are held here already.
        pull: True, our agent reads the sender's blocks once all layers
        are computed; False, the sender pushes each layer; None, the
        agent's default (--pull) (docs/protocol.md, "Pull"). peers: every
        prefill rank's agent, rank order (TP; peer is then None): our
        agent takes our heads from those that hold them."""
        skip_tokens = _int("skip_tokens", skip_tokens, 0, _clib.U32_MAX)
        b, n = _blocks(blocks)
        xid = ctypes.byref(_xid(xfer)._c)
        if isinstance(peers, (str, bytes)):
            raise TypeError("peers: want a list of peer addresses, not %s"
                            % type(peers).__name__)
        if peers:
            if len(peers) > _clib.PEERS_MAX:
                raise ValueError("peers: %d, at most %d"
                                 % (len(peers), _clib.PEERS_MAX))
            arr = (ctypes.c_char_p * len(peers))(
                *[_peer(p, "peers[%d]" % i) for i, p in enumerate(peers)])
            opts = _clib.RecvOpts(skip_tokens, 0 if pull is None else
                                  _clib.XFER_PULL if pull else _clib.XFER_PUSH,
                                  arr, len(peers))
            st = _lib_fn("pdx_engine_recv_opts")(self._handle(), xid, None,
                                                  b, n, ctypes.byref(opts))
        elif pull is None:
            st = lib.pdx_engine_recv(self._handle(), xid, _peer(peer), b, n,
                                     skip_tokens)
        else:
            opts = _clib.RecvOpts(skip_tokens, _clib.XFER_PULL if pull
                                  else _clib.XFER_PUSH)
            st = _lib_fn("pdx_engine_recv_opts")(self._handle(), xid,
                                                  _peer(peer), b, n,
                                                  ctypes.byref(opts))
        self._call(st, "recv")

    def layer_done(self, layer: int, xfers: Sequence[XferLike],
                   slot: Optional[int] = None, stream=None) -> None:
        """Prefill side: layer is computed for these transfers. slot: the
        CUDA event slot the engine recorded for it (registered with
        cuda_events). stream: registered with cuda_event_slots alone, the
        CUDA stream (a pointer, or a torch.cuda.Stream) whose work so far
        computes the layer: libpdx records the layer's event on it (no
        synchronize) and picks the slot; once per layer per forward pass,
        with all that pass's transfers."""
        layer = _int("layer", layer, 0, _clib.MAX_LAYERS - 1)
        if slot is not None:
            slot = _int("slot", slot, 0, _clib.CUDA_EVENT_SLOTS_MAX - 1)
        arr, n = _xids(xfers)
        if stream is not None:
            st = _lib_fn("pdx_engine_layer_done_stream")(
                self._handle(), layer, _stream(stream), arr, n)
        elif slot is None:
            st = lib.pdx_engine_layer_done(self._handle(), layer, arr, n)
        else:
            st = lib.pdx_engine_layer_done_slot(self._handle(), layer, slot,
                                                arr, n)
        self._call(st, "layer_done")

    def token(self, xfer: XferLike, token: int) -> None:
        """Prefill side: the first token sampled, carried to the decode
        side's "received" event. Before the last layer_done."""
        token = _int("token", token, 0, _clib.U32_MAX)
        self._call(lib.pdx_engine_token(self._handle(),
                                        ctypes.byref(_xid(xfer)._c), token),
                   "token")

    def meta(self, xfer: XferLike, data: bytes) -> None:
        """Prefill side: up to META_MAX bytes carried beside the KV to the
        decode side's "received" event (Event.meta). Before the last
        layer_done; a second call replaces the first."""
        data = _buffer("data: want bytes", data)
        self._call(_lib_fn("pdx_engine_meta")(
            self._handle(), ctypes.byref(_xid(xfer)._c), data, len(data)),
            "meta")

    def hold(self, xfer: XferLike, peer: str) -> None:
        """Decode side: the request waits in our queue; keep the sender's
        lease on its KV alive until recv() or abort()."""
        self._call(lib.pdx_engine_hold(self._handle(),
                                       ctypes.byref(_xid(xfer)._c),
                                       _peer(peer)), "hold")

    def abort(self, xfer: XferLike, peer: Optional[str] = None) -> None:
        """Aborts the transfer here and at the peer; with peer, one never
        announced here (the agent at peer is told)."""
        x = ctypes.byref(_xid(xfer)._c)
        if peer is None:
            st = lib.pdx_engine_abort(self._handle(), x)
        else:
            st = lib.pdx_engine_abort_at(self._handle(), x, _peer(peer))
        self._call(st, "abort")

    # -- events ------------------------------------------------------
    def fileno(self) -> int:
        """Readable (edge-triggered) when events may be waiting."""
        return lib.pdx_engine_fd(self._handle())

    def link_status(self) -> Tuple[bool, str]:
        """(True, "") while the agent is there and holds our registration;
        (False, why) while it is away. Never waits, and reads nothing: the
        state as of the last call that read the link (events(), an
        announcement), so a health check that only asks this should read
        events too."""
        why = ctypes.create_string_buffer(_clib.REASON_MAX)
        st = lib.pdx_engine_link_status(self._handle(), why, len(why))
        return st == OK, why.value.decode(errors="replace")

    def _event(self) -> Event:
        e = self._ev
        x = XferId(bytes(e.xfer.b))
        return Event(x, _KINDS.get(e.kind, FAILED), e.status, e.bytes,
                     e.t_first_ns, e.t_last_ns,
                     e.first_token if e.first_token >= 0 else None,
                     e.reason.decode(errors="replace"), self._event_meta())

    def _event_meta(self) -> bytes:
        """The meta of the event just taken (libpdx keeps it only until
        the next)."""
        f = getattr(lib, "pdx_engine_event_meta", None)
        if f is None:
            return b""
        data, n = ctypes.c_void_p(), ctypes.c_size_t()
        self._call(f(self._handle(), ctypes.byref(data), ctypes.byref(n)),
                   "event_meta")
        return ctypes.string_at(data, n.value) if n.value else b""

    def next_event(self) -> Optional[Event]:
        """The next event, or None when there is none now."""
        st = lib.pdx_engine_next_event(self._handle(), ctypes.byref(self._ev))
        if st == EAGAIN:
            return None
        self._call(st, "next_event")
        return self._event()

    def wait_event(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event within timeout seconds (None: forever; 0 or
        less: only one already there), or None when none came in time.
        In the main thread a signal's handler runs during the wait (Ctrl-C
        raises KeyboardInterrupt), as in time.sleep()."""
        ms = -1
        if timeout is not None:
            if isinstance(timeout, bool) or \
                    not isinstance(timeout, numbers.Real):
                raise TypeError("timeout: want seconds (a number) or None, "
                                "not %s" % type(timeout).__name__)
            if not timeout <= _clib.INT_MAX / 1000:  # NaN is not either
                raise ValueError("timeout: %r s past the %.3f s libpdx "
                                 "waits at most (None: forever)"
                                 % (timeout, _clib.INT_MAX / 1000))
            ms = min(int(timeout * 1000), _clib.INT_MAX) if timeout > 0 else 0
        # libpdx's wait goes on through EINTR, and Python runs a signal's
        # handler (Ctrl-C's KeyboardInterrupt) only once the call returned:
        # in the main thread, where handlers run, wait in slices.
        end = None if ms < 0 else time.monotonic() + ms / 1000
        while True:
            left = ms
            if threading.current_thread() is threading.main_thread():
                left = _WAIT_SLICE_MS if end is None else max(0, min(
                    _WAIT_SLICE_MS,
                    math.ceil((end - time.monotonic()) * 1000)))
            st = lib.pdx_engine_wait_event(self._handle(), left,
                                           ctypes.byref(self._ev))
            if st != ETIMEDOUT:
                break
            if left == ms or (end is not None and time.monotonic() >= end):
                return None
        self._call(st, "wait_event")
        return self._event()

    def events(self) -> List[Event]:
        """Every event waiting now (drains to EAGAIN, as the fd wants)."""
        out = []
        while True:
            ev = self.next_event()
            if ev is None:
                return out
            out.append(ev)

    def poll(self, timeout: float) -> List[Event]:
        """Waits up to timeout seconds on fileno(), then drains."""
        evs = self.events()
        if evs:
            return evs
        select.select([self.fileno()], [], [], timeout)
        return self.events()
