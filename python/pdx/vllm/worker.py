"""PdxConnector's worker side: the agent beside this worker, the KV
caches registered with it, transfers announced as the scheduler side
asks, "layer done" as each layer is saved, and what finished.

Every transfer announced here ends in exactly one agent event; the
request it belongs to is reported once to vLLM: a send in
finished_sending (after vLLM said the request finished), a receive in
finished_recving, a failed receive's blocks in the load errors.
"""
import collections
import logging
import shlex
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Set

import pdx

from . import layout as kv_layout
from . import params
from .agent import AgentProcess
from .meta import PdxHandshake, PdxMetadata

log = logging.getLogger("pdx.vllm")

# forward passes that may be queued on the GPU ahead of the agent
CUDA_EVENT_SLOTS = 4
# the most a preempted request's aborted send is awaited (its agent
# answers at once; an RDMA put in flight ends first)
PREEMPT_WAIT_S = 5.0
# an agent started here that exited is started again at most this often
AGENT_RESTART_S = 5.0


def _rank() -> int:
    try:
        from vllm.distributed.parallel_state import (
            get_tensor_model_parallel_rank)
        return get_tensor_model_parallel_rank()
    except (ImportError, AssertionError, AttributeError):
        return 0


def _agent_args(v) -> List[str]:
    """kv_connector_extra_config agent_args: a list of strings, or one
    string split as a shell would (list() of a string gave its letters,
    which the agent refused as "unexpected argument -")."""
    if isinstance(v, str):
        return shlex.split(v)
    if isinstance(v, (list, tuple)) and all(isinstance(a, str) for a in v):
        return list(v)
    raise ValueError("kv_connector_extra_config agent_args: want a list of "
                     "strings, e.g. [\"--lease-ms\", \"3000\"], got %r" % (v,))


# kv_connector_extra_config's keys (docs/vllm.md)
EXTRA_KEYS = ("agent", "agent_bin", "agent_listen_host", "agent_args",
              "xfer_timeout_ms", "liveness_ms")


def _extra_int(extra, key: str) -> int:
    """An int setting of kv_connector_extra_config, 0 when absent;
    ValueError naming it (int() named only the value)."""
    v = extra.get(key, 0)
    try:
        if isinstance(v, bool) or float(v) != int(v) or int(v) < 0:
            raise ValueError
        return int(v)
    except (TypeError, ValueError, OverflowError):
        raise ValueError("kv_connector_extra_config %s: want an integer "
                         "(ms), 0 or more, not %r" % (key, v)) from None


def kv_dtype_name(cache_dtype: str, kv_caches) -> Optional[str]:
    """What the agents compare (libpdx's set_kv_dtype), in torch's
    names, as docs/protocol.md asks: vLLM's --kv-cache-dtype when set
    (fp8 caches are stored as uint8, e4m3 and e5m2 alike; its "fp8" is
    e4m3), else the tensors' dtype (bfloat16 and float16 are both 2
    bytes: the layout alone paired them)."""
    if cache_dtype and cache_dtype != "auto":
        return {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn",
                "fp8_e5m2": "float8_e5m2"}.get(cache_dtype, cache_dtype)
    first = next(iter(kv_caches.values()), None)
    dtype = getattr(first, "dtype", None)
    return str(dtype).replace("torch.", "") if dtype is not None else None


@dataclass
class _Flight:
    req_id: str
    send: bool
    blocks: List[int]  # a receive's blocks written here (load errors)


def kernel_blocks(manager_tokens: int, kernel_tokens: int) -> int:
    """How many of the caches' blocks make one of the scheduler's: vLLM
    cuts each block of --block-size into kernel blocks when the attention
    backend cannot run that size, and hands the connector views of those
    (NixlConnector maps its ids the same way). Counted as one, the blocks
    sent were others than the request's, and the text was wrong without
    a word. ValueError when the sizes do not divide."""
    if not manager_tokens or manager_tokens == kernel_tokens:
        return 1
    if manager_tokens % kernel_tokens:
        raise ValueError("pdx: vLLM's block of %d tokens is not a whole "
                         "number of the KV cache's blocks of %d tokens"
                         % (manager_tokens, kernel_tokens))
    return manager_tokens // kernel_tokens


def kernel_ids(blocks: List[int], k: int, tokens: int,
               kernel_tokens: int) -> List[int]:
    """The scheduler's block ids as the caches' kernel blocks (k of them
    each), as many as tokens fill (all when tokens is 0): the last block's
    unused kernel blocks are no part of the transfer, and a peer whose
    blocks are the kernel's size (pdx-engine, SGLang) expects
    ceil(tokens / kernel_tokens) of them."""
    if k == 1:
        return list(blocks)
    out = [b * k + i for b in blocks for i in range(k)]
    return out[:-(-tokens // kernel_tokens)] if tokens else out


class PdxWorker:
    def __init__(self, vllm_config, rank: int = None):
        ktc = vllm_config.kv_transfer_config
        extra = dict(ktc.kv_connector_extra_config or {})
        for k in sorted(set(extra) - set(EXTRA_KEYS)):
            log.warning("pdx: kv_connector_extra_config %r: not a key of "
                        "PdxConnector's (%s); ignored", k,
                        ", ".join(EXTRA_KEYS))
        # read before the agent starts: a bad one leaves nothing running
        xfer_timeout_ms = _extra_int(extra, "xfer_timeout_ms")
        liveness_ms = _extra_int(extra, "liveness_ms")
        self.rank = _rank() if rank is None else rank
        self.tp_size = int(getattr(getattr(vllm_config, "parallel_config",
                                           None), "tensor_parallel_size",
                                   1) or 1)
        self.agent = None
        addr = extra.get("agent")
        if addr:
            addr = addr.replace("{rank}", str(self.rank))
        else:
            self.agent = AgentProcess(
                extra.get("agent_bin", "pdx-agent"),
                extra.get("agent_listen_host", "127.0.0.1"),
                _agent_args(extra.get("agent_args", [])),
                listen_host_key="kv_connector_extra_config agent_listen_host")
            addr = self.agent.engine_addr
        self.agent_addr = addr
        self.eng = pdx.Engine(addr, xfer_timeout_ms=xfer_timeout_ms,
                              liveness_ms=liveness_ms)
        cache = getattr(vllm_config, "cache_config", None)
        self.cache_dtype = str(getattr(cache, "cache_dtype", "auto"))
        # the scheduler's block (--block-size): its block ids count these
        self.manager_block_tokens = int(getattr(cache, "block_size", 0)
                                        or 0)
        self.kernel_blocks = 1  # kernel blocks of the caches in one of it
        self.mla = bool(getattr(getattr(vllm_config, "model_config", None),
                                "use_mla", False))
        self.peer_addr = None
        self.layer_of: Dict[str, int] = {}
        self.layers = 0
        self.block_tokens = 1
        self.cuda = False
        self._flights: Dict[pdx.XferId, _Flight] = {}
        self._step_sends: List[pdx.XferId] = []
        self._step_layers: Set[int] = set()
        self._started = None  # the metadata start() took last
        self._preempted = None  # the metadata preempted() took last
        self._sent: Set[str] = set()
        self._finished: Set[str] = set()
        self._send_reqs: Set[str] = set()
        self._recvd: Set[str] = set()
        self._invalid: Set[int] = set()
        self._restart_at = 0.0  # monotonic: no agent restart before
        # transfers ended here: sent, received, failed, bytes_sent,
        # bytes_received (what docs/vllm.md reports; the tests read it)
        self.stats = collections.Counter()

    # -- memory ----------------------------------------------------------
    def register_kv_caches(self, kv_caches) -> None:
        lay, regions, layers, self.cuda = kv_layout.build(kv_caches,
                                                          self.mla)
        self.kernel_blocks = kernel_blocks(self.manager_block_tokens,
                                           lay.block_tokens)
        if self.tp_size > 1:  # our heads: the agents reshard between sizes
            self.eng.set_tp(self.rank, self.tp_size)
        dtype = kv_dtype_name(self.cache_dtype, kv_caches)
        if hasattr(pdx.engine.lib, "pdx_engine_set_kv_dtype"):
            self.eng.set_kv_dtype(dtype)
        else:  # libpdx before 0.6: unnamed, it pairs with any
            log.info("pdx: libpdx %s cannot name the KV's element type "
                     "(%s); the agents do not compare it",
                     pdx._clib.path, dtype)
        # GPU KV: libpdx makes the layers' interprocess events and records
        # them on vLLM's stream at each layer_done (never a synchronize)
        self.peer_addr = self.eng.register(
            lay, regions, cuda_event_slots=CUDA_EVENT_SLOTS if self.cuda
            else 0)
        self.layer_of = {n: i for i, names in enumerate(layers)
                         for n in names}
        self.layers = len(layers)
        self.block_tokens = lay.block_tokens
        log.info("pdx: rank %d registered %d layers x %d blocks with %s",
                 self.rank, self.layers, lay.blocks, self.peer_addr)
        if self.kernel_blocks > 1:
            log.info("pdx: each vLLM block of %d tokens is %d kernel "
                     "blocks of the KV cache", self.manager_block_tokens,
                     self.kernel_blocks)

    def _kernel(self, blocks: List[int], tokens: int) -> List[int]:
        return kernel_ids(blocks, self.kernel_blocks, tokens,
                          self.block_tokens)

    def handshake(self) -> PdxHandshake:
        return PdxHandshake(self.rank, self.peer_addr, self.agent_addr)

    # -- a step ------------------------------------------------------------
    def _pair(self, peers: List[str]) -> Optional[str]:
        """The one agent of the other side (its ranks', in rank order)
        that ours deals with: at equal TP sizes our rank's; None at
        different sizes, where our agent takes our heads from the ranks
        that hold them (docs/protocol.md, "TP legs")."""
        return peers[self.rank] if len(peers) == self.tp_size else None

    def _dealt_with(self, peers: List[str]) -> List[str]:
        """Our pair, or at different TP sizes every rank's agent."""
        pair = self._pair(peers)
        return [pair] if pair else list(peers)

    def start(self, meta: PdxMetadata) -> None:
        """The step's holds, receives, sends and aborts: once a step
        (bind_connector_metadata, then start_load_kv with the same
        metadata)."""
        if meta is None or meta is self._started:
            return
        self._started = meta
        e = self.eng
        for h in meta.holds:
            for peer in self._dealt_with(h.peers):
                try:
                    e.hold(params.xfer(h.xfer), peer)
                except pdx.Error as err:
                    log.warning("pdx: hold %s: %s", h.req_id, err)
        for r in meta.recvs:
            x = params.xfer(r.xfer)
            blocks = self._kernel(r.blocks, r.tokens)
            held = r.skip_tokens // self.block_tokens
            pair = self._pair(r.peers)
            try:
                if pair:
                    e.recv(x, pair, blocks, r.skip_tokens)
                else:
                    e.recv(x, None, blocks, r.skip_tokens, peers=r.peers)
                self._flights[x] = _Flight(r.req_id, False, blocks[held:])
            except pdx.Error as err:  # ends now: its blocks are not loaded
                log.warning("pdx: recv %s: %s", r.req_id, err)
                self.stats["failed"] += 1
                self._recvd.add(r.req_id)
                self._invalid.update(blocks[held:])
        self._step_sends = []
        self._step_layers = set()
        for s in meta.sends:
            x = params.xfer(s.xfer)
            self._send_reqs.add(s.req_id)
            try:  # open at different TP sizes: the legs claim it
                e.send(x, self._pair(s.peers),
                       self._kernel(s.blocks, s.tokens))
                self._flights[x] = _Flight(s.req_id, True, [])
                self._step_sends.append(x)
            except pdx.Error as err:  # its blocks may be freed when done
                log.warning("pdx: send %s: %s", s.req_id, err)
                self.stats["failed"] += 1
                self._sent.add(s.req_id)
        for a in meta.aborts:
            x = params.xfer(a.xfer)
            try:
                if a.peers is not None:
                    for peer in self._dealt_with(a.peers):
                        e.abort(x, peer)
                elif x in self._flights:
                    e.abort(x)
            except pdx.Error as err:
                log.warning("pdx: abort %s: %s", a.req_id, err)

    def preempted(self, meta: PdxMetadata) -> None:
        """handle_preemptions, before this step's forward: a request
        preempted after its send was announced has its blocks free again,
        and the forward may write them while the agent still reads them
        (the decode side has not claimed the transfer yet, or it is under
        way). The send is aborted and its end awaited: after its event
        the agent touches those blocks no more. vLLM is not told of it
        (the scheduler side does not delay that request's free)."""
        if meta is None or not meta.preempted or meta is self._preempted:
            return
        self._preempted = meta
        waiting = []
        for p in meta.preempted:
            x = params.xfer(p.xfer)
            if x in self._flights:
                try:
                    self.eng.abort(x)
                except pdx.Error as err:
                    log.warning("pdx: abort of preempted %s: %s", p.req_id,
                                err)
                waiting.append(x)
        end = time.monotonic() + PREEMPT_WAIT_S
        while any(x in self._flights for x in waiting):
            left = end - time.monotonic()
            if left <= 0:
                log.error("pdx: the sends of preempted %s did not end in "
                          "%.0f s; their blocks may be read while reused",
                          [p.req_id for p in meta.preempted],
                          PREEMPT_WAIT_S)
                # their events, if they come, are no news of the
                # request's next send (vLLM after PR 50297 computes it
                # again and sends under a new id): one would say that
                # one finished while it still reads the blocks
                for x in waiting:
                    self._flights.pop(x, None)
                break
            for ev in self.eng.poll(left):
                self._ended(ev)
        for p in meta.preempted:
            self._sent.discard(p.req_id)
            self._send_reqs.discard(p.req_id)
            self._finished.discard(p.req_id)

    def layer_saved(self, layer_name: str) -> None:
        """The layer's KV of this step is in memory: its layer is done for
        the sends whose last prefill chunk this step computes."""
        if not self._step_sends:
            return
        i = self.layer_of.get(layer_name)
        if i is None or i in self._step_layers:
            return
        self._step_layers.add(i)
        self._layer_done(i)

    def _layer_done(self, i: int) -> None:
        """An error here must not reach vLLM: raised out of save_kv_layer
        it ends the engine's step, and EngineCore with it. The sends of
        this step end in their events instead (the agent away: libpdx's
        EAGENT, at once; else the agent's layer bound), so the rest of
        the step's layers are not reported."""
        try:
            if self.cuda:  # the layer's KV writes are queued on this stream
                self.eng.layer_done(i, self._step_sends,
                                    stream=pdx.current_stream())
            else:
                self.eng.layer_done(i, self._step_sends)
        except pdx.Error as err:
            log.warning("pdx: layer %d done, for the sends of %s: %s; "
                        "they fail", i,
                        [self._flights[x].req_id for x in self._step_sends
                         if x in self._flights], err)
            self._step_sends = []

    def step_saved(self) -> None:
        """The forward pass is over: any layer not saved through the hook
        (a model whose hooks were skipped) is done now."""
        for i in range(self.layers):
            if not self._step_sends:  # none, or they failed
                break
            if i not in self._step_layers:
                self._layer_done(i)
        self._step_sends = []
        self._step_layers = set()

    def _agent_alive(self) -> None:
        """An agent started here that exited (killed, crashed) is started
        again at its addresses: until then every send fails and the
        scheduler side still names it to decode sides, which then fail
        their loads and recompute, for as long as the worker lives."""
        a = self.agent
        if a is None or not a.exited() or time.monotonic() < self._restart_at:
            return
        self._restart_at = time.monotonic() + AGENT_RESTART_S
        log.error("pdx: rank %d's pdx-agent exited (%s; its log: %s): "
                  "starting it again at %s", self.rank, a.proc.returncode,
                  a.log_tail(2), a.listen)
        try:
            a.restart()
        except RuntimeError as err:
            log.error("pdx: rank %d: %s", self.rank, err)
            self.agent = None

    def finished(self, finished_req_ids):
        self._agent_alive()
        self._finished.update(r for r in finished_req_ids
                              if r in self._send_reqs)
        for ev in self.eng.events():
            self._ended(ev)
        sending = self._sent & self._finished
        self._sent -= sending
        self._finished -= sending
        self._send_reqs -= sending
        recving, self._recvd = self._recvd, set()
        return sending or None, recving or None

    def _ended(self, ev: pdx.Event) -> None:
        """A transfer announced here ended (one event each)."""
        f = self._flights.pop(ev.xfer, None)
        if f is None:
            return
        if not ev.ok:
            log.warning("pdx: %s of %s failed: %s (%s)",
                        "send" if f.send else "recv", f.req_id,
                        ev.reason, ev.status_name)
            self.stats["failed"] += 1
        else:
            self.stats[ev.kind] += 1
            self.stats["bytes_" + ev.kind] += ev.bytes
        if f.send:
            self._sent.add(f.req_id)
        else:
            self._recvd.add(f.req_id)
            if not ev.ok:
                self._invalid.update(f.blocks)

    def load_errors(self) -> Set[int]:
        """The scheduler's ids of the blocks failed receives left
        unwritten (kept as kernel blocks)."""
        out, self._invalid = self._invalid, set()
        return {b // self.kernel_blocks for b in out}

    def close(self) -> None:
        self.eng.close()
        if self.agent is not None:
            self.agent.stop()
