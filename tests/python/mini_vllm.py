"""A small engine that drives a vLLM KV connector in vLLM's own order.

vLLM cannot be installed here, so this stands in for the parts of vLLM
(commit 52a31cc, the one pdx.vllm follows) that call a connector: the
factory that loads it by kv_connector_module_path, EngineCore's start-up,
the V1 scheduler (vllm/v1/core/sched/scheduler.py) and the V1 GPU model
runner with its KV-connector mixin. The calls, their order and their
arguments are vLLM's; the model is pdx-engine's synthetic one (through
mini_model.py), running on torch CPU tensors that are views of one
pdx.SharedPool, so the KV an agent moves is read back as tokens: the
same text as pdx-engine for the same prompt when the bytes are right.

What is simplified, and why it does not change what a connector sees:
one process plays EngineCore and its workers (one per tensor-parallel
rank, each with its connector, its share of the KV heads and the rank
vllm.distributed.parallel_state reports while it is built; they run one
after another, rank 0's sampled token is every rank's, as vLLM
broadcasts it), scheduler output and worker output still go through
pickle as they do between vLLM's processes; there is no sampler (the next token is read from the KV),
no stop strings or EOS (every request runs to max_tokens, finish
"length"), no speculative decoding, no HMA (one KV cache group).

vLLM's assertions on a connector's answers (VLLM_NOTES.md 7.6) are
asserts here too, so a connector that breaks them fails its test.

    eng = MiniVllm(kv_transfer_config={...}, role="decode")
    with eng:                      # an engine thread steps it
        out = eng.generate(prompt_ids, max_tokens=8,
                           kv_transfer_params={...})
    eng.step()                     # or step it by hand, without start()
"""
import array
import collections
import importlib
import inspect
import itertools
import io
import pickle
import queue
import threading
import time
import uuid
from typing import Any, Dict, List, Optional

import torch

import pdx
from mini_model import Model
from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig,
                         ParallelConfig, SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorRole)
from vllm import forward_context
from vllm.distributed import parallel_state
from vllm.forward_context import ForwardContext
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.sched.output import (CachedRequestData, NewRequestData,
                                       SchedulerOutput)
from vllm.v1.kv_cache_interface import (KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

ROLES = {"prefill": "kv_producer", "decode": "kv_consumer",
         "both": "kv_both"}
# KV cache tensor shapes a connector may meet (VLLM_NOTES.md 5):
# "blocks_first" FlashAttention at 52a31cc (num_blocks, 2, block_size,
# heads, head_dim); "kv_first" the older FA and ROCm (2, num_blocks, ...);
# "mla" (num_blocks, block_size, heads * head_dim), one tensor;
# "packed" vLLM after PR 44455: (num_blocks, heads, block_size,
# 2 * head_dim), K and V side by side in each row; "packed_kernel" the
# same as the connector sees it when the attention backend cannot run
# the block size: each block cut into kernel blocks of half its tokens
# (create_kv_cache_views), the scheduler's block ids still counting
# whole blocks. Each in memory in the order the KV cache layout asks
# (STRIDE_ORDERS).
KV_LAYOUTS = ("blocks_first", "kv_first", "mla", "packed", "packed_kernel")


def layer_name(i: int) -> str:
    return "model.layers.%d.self_attn.attn" % i


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------
# Loading: KVConnectorFactory (factory.py:43-128)
# ---------------------------------------------------------------------

def connector_class(ktc: KVTransferConfig) -> type:
    """kv_connector_module_path imported, kv_connector its class name;
    the 3-argument constructor required (#39832)."""
    if not ktc.kv_connector:
        raise ValueError("Connector name is not set in KVTransferConfig")
    if not ktc.kv_connector_module_path:
        raise ValueError("mini_vllm has no built-in connectors: set "
                         "kv_connector_module_path")
    module = importlib.import_module(ktc.kv_connector_module_path)
    cls = getattr(module, ktc.kv_connector)
    params = inspect.signature(cls).parameters
    if "kv_cache_config" not in params and not any(
            p.kind == p.VAR_KEYWORD for p in params.values()):
        raise ValueError("Connector %s uses deprecated 2-argument "
                         "constructor signature" % cls.__name__)
    return cls


# ---------------------------------------------------------------------
# Pickling between "processes" (shm_broadcast.py:736)
# ---------------------------------------------------------------------

class _NoRequests(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, Request):
            raise AssertionError("connector metadata holds a Request (%s): "
                                 "vLLM pickles it to the workers"
                                 % obj.request_id)
        return NotImplemented


def over_the_wire(obj):
    buf = io.BytesIO()
    _NoRequests(buf).dump(obj)
    return pickle.loads(buf.getvalue())


# ---------------------------------------------------------------------
# The KV cache layout: vllm/v1/attention/backends/utils.py's
# get_kv_cache_layout and the backends' get_kv_cache_stride_order
# ---------------------------------------------------------------------

KV_CACHE_LAYOUTS = ("NHD", "HND")  # KVCacheLayoutType


def kv_cache_layout(connector_cls, vllm_config,
                    backend_layout: Optional[str] = None,
                    env_layout: Optional[str] = None) -> str:
    """The order inside a block every attention layer's cache gets
    (get_kv_cache_layout, once a process, before the caches exist): the
    one the selected attention backend requires (the selector's
    set_kv_cache_layout: FlashInfer on Blackwell says HND), else the
    user's VLLM_KV_CACHE_LAYOUT, else the connector's
    (get_kv_connector_cache_layout: get_required_kvcache_layout, called
    on the class before any instance exists), else NHD."""
    for given in (backend_layout, env_layout):
        if given is not None:
            if given not in KV_CACHE_LAYOUTS:
                raise ValueError("KV cache layout %r: NHD or HND" % given)
            return given
    if connector_cls is not None:
        required = connector_cls.get_required_kvcache_layout(vllm_config)
        if required is not None:
            if required not in KV_CACHE_LAYOUTS:  # the backend's refusal
                raise ValueError("Unknown cache layout format %s."
                                 % required)
            return required
    return "NHD"


# get_kv_cache_stride_order by cache shape and layout: where each
# dimension of the backend's logical shape (get_kv_cache_shape) lies in
# memory. FlashAttention's HND swaps block_size and heads; a packed cache
# (heads before tokens in its logical shape) keeps tokens outermost for
# NHD (LBNHC, its default) and heads for HND (LBHNC); MLA's backends have
# one order whatever the layout.
STRIDE_ORDERS = {
    "NHD": {"blocks_first": (0, 1, 2, 3, 4), "kv_first": (0, 1, 2, 3, 4),
            "mla": (0, 1, 2), "packed": (0, 2, 1, 3),
            "packed_kernel": (0, 2, 1, 3)},
    "HND": {"blocks_first": (0, 1, 3, 2, 4), "kv_first": (0, 1, 3, 2, 4),
            "mla": (0, 1, 2), "packed": (0, 1, 2, 3),
            "packed_kernel": (0, 1, 2, 3)},
}


# ---------------------------------------------------------------------
# KV memory: one pdx.SharedPool, one tensor view per layer
# ---------------------------------------------------------------------

class KvCaches:
    """The KV cache tensors (layer name -> torch CPU tensor, all views of
    one pdx.SharedPool the agent can map), allocated as the GPU model
    runner does (the logical shape's dimensions in the stride order of
    the layout, then permuted back), and the pdx layout the synthetic
    model writes and reads them through, in that order. Rank rank of
    tp_size holds its share of the KV heads, from head0 on (MLA: the
    whole latent on every rank)."""

    def __init__(self, model: Model, num_blocks: int, kv_layout: str,
                 tp_size: int = 1, rank: int = 0, order: str = "NHD"):
        if kv_layout not in KV_LAYOUTS:
            raise ValueError("kv_layout: one of %s" % (KV_LAYOUTS,))
        m = model
        self.kv_layout, self.num_blocks = kv_layout, num_blocks
        mla = kv_layout == "mla"
        packed = kv_layout in ("packed", "packed_kernel")
        # kernel blocks a block: the caches' (and the model's) blocks
        self.split = split = 2 if kv_layout == "packed_kernel" else 1
        if not mla and m.kv_heads % tp_size:
            raise ValueError("%d KV heads over %d ranks" % (m.kv_heads,
                                                            tp_size))
        heads, dim = (1, m.kv_heads * m.head_dim) if mla else \
            (m.kv_heads // tp_size, m.head_dim * (2 if packed else 1))
        self.head0 = 0 if mla else rank * heads
        tensors = 1 if mla or packed else 2
        nb, bt = num_blocks * split, m.block_tokens // split
        bb = bt * heads * dim * m.dtype_bytes
        self.layer_bytes = tensors * nb * bb
        self.pool = pdx.SharedPool(m.layers * self.layer_bytes)
        self.base = self.pool.address
        dtype = {2: torch.bfloat16, 4: torch.float32}[m.dtype_bytes]
        if kv_layout == "blocks_first":
            shape = (nb, 2, bt, heads, dim)
            bases, stride = lambda o: [(0, o), (0, o + bb)], 2 * bb
        elif kv_layout == "kv_first":
            shape = (2, nb, bt, heads, dim)
            bases, stride = lambda o: [(0, o), (0, o + nb * bb)], bb
        elif packed:
            shape = (nb, heads, bt, dim)
            bases, stride = lambda o: [(0, o)], bb
        else:
            shape = (nb, bt, dim)
            bases, stride = lambda o: [(0, o)], bb
        so = STRIDE_ORDERS[order][kv_layout]
        inv = [so.index(i) for i in range(len(so))]
        # what the attention layers and register_kv_caches get
        self.tensors: Dict[str, torch.Tensor] = {}
        for i in range(m.layers):
            raw = torch.frombuffer(self.pool.buf, dtype=dtype,
                                   count=self.layer_bytes // m.dtype_bytes,
                                   offset=i * self.layer_bytes)
            self.tensors[layer_name(i)] = raw.view(
                tuple(shape[d] for d in so)).permute(*inv)
        self.order = pdx.HND if order == "HND" and not mla else pdx.NHD
        self.layout = pdx.Layout(
            blocks=nb, block_tokens=bt, kv_heads=heads, head_dim=dim,
            dtype_bytes=m.dtype_bytes, tensors=tensors, order=self.order,
            bases=[bases(i * self.layer_bytes) for i in range(m.layers)],
            block_stride=[stride] * m.layers)
        self.layout_c, self._layers_c = self.layout._c()
        assert Model.layout_ok(self.layout_c)

    def table(self, blocks: array.array) -> array.array:
        """A request's block ids, the scheduler's, as the caches' blocks
        the model writes (split kernel blocks each)."""
        if self.split == 1:
            return blocks
        return array.array("I", (b * self.split + k for b in blocks
                                 for k in range(self.split)))

    def close(self):
        self.tensors.clear()
        self.pool.close()


# ---------------------------------------------------------------------
# KV cache manager and block pool (vllm/v1/core/kv_cache_manager.py,
# block_pool.py): one group, prefix caching by chained block hashes
# ---------------------------------------------------------------------

class BlockPool:
    """Block 0 is the null block, never handed out (as in vLLM)."""

    def __init__(self, num_blocks: int):
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        self.free_queue = collections.OrderedDict(
            (b.block_id, b) for b in self.blocks[1:])
        self.cached: Dict[Any, KVCacheBlock] = {}

    def get_num_free_blocks(self) -> int:
        return len(self.free_queue)

    def touch(self, blk: KVCacheBlock) -> None:
        if blk.ref_cnt == 0:
            del self.free_queue[blk.block_id]
        blk.ref_cnt += 1

    def get_new_block(self) -> KVCacheBlock:
        _, blk = self.free_queue.popitem(last=False)
        if blk.block_hash is not None:
            if self.cached.get(blk.block_hash) is blk:
                del self.cached[blk.block_hash]
            blk.reset_hash()
        blk.ref_cnt = 1
        return blk

    def free(self, blk: KVCacheBlock) -> None:
        blk.ref_cnt -= 1
        assert blk.ref_cnt >= 0
        if blk.ref_cnt == 0:
            self.free_queue[blk.block_id] = blk


def block_hasher(block_size: int):
    """vLLM's get_request_block_hasher: the hashes of a request's new full
    blocks, each chained to the one before."""

    def new_hashes(req: Request) -> list:
        out = []
        prev = req.block_hashes[-1] if req.block_hashes else None
        toks = req._all_token_ids
        for i in range(len(req.block_hashes), len(toks) // block_size):
            prev = hash((prev, tuple(toks[i * block_size:
                                          (i + 1) * block_size])))
            out.append(prev)
        return out
    return new_hashes


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int,
                 enable_caching: bool):
        self.block_pool = BlockPool(num_blocks)
        self.block_size, self.enable_caching = block_size, enable_caching
        self.req_blocks: Dict[str, List[KVCacheBlock]] = {}
        self.num_cached: Dict[str, int] = {}

    def get_computed_blocks(self, req: Request):
        """The local prefix hit: whole blocks, at most num_tokens - 1
        tokens (kv_cache_manager.py:210-219)."""
        if not self.enable_caching:
            return [], 0
        hits = []
        for h in req.block_hashes[:(req.num_tokens - 1) // self.block_size]:
            blk = self.block_pool.cached.get(h)
            if blk is None:
                break
            hits.append(blk)
        return hits, len(hits) * self.block_size

    def allocate_slots(self, req: Request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks=(),
                       num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False
                       ) -> Optional[KVCacheBlocks]:
        have = self.req_blocks.get(req.request_id, [])
        computed = (req.num_computed_tokens + num_new_computed_tokens +
                    num_external_computed_tokens)
        need = max(0, cdiv(computed + num_new_tokens, self.block_size) -
                   len(have) - len(new_computed_blocks))
        touched_free = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if need > self.block_pool.get_num_free_blocks() - touched_free:
            return None
        blocks = self.req_blocks.setdefault(req.request_id, have)
        for b in new_computed_blocks:
            self.block_pool.touch(b)
            blocks.append(b)
        new = [self.block_pool.get_new_block() for _ in range(need)]
        blocks.extend(new)
        if self.enable_caching and not delay_cache_blocks:
            self.cache_blocks(req, min(computed + num_new_tokens,
                                       req.num_tokens))
        return KVCacheBlocks((new,))

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        if not self.enable_caching:
            return
        blocks = self.req_blocks.get(req.request_id, [])
        full = min(num_tokens // self.block_size, len(blocks))
        start = self.num_cached.get(req.request_id, 0)
        for i in range(start, full):
            blk, h = blocks[i], req.block_hashes[i]
            if blk.block_hash is None:
                blk.block_hash = h
                self.block_pool.cached.setdefault(h, blk)
        self.num_cached[req.request_id] = max(start, full)

    def free(self, req: Request) -> None:
        """Tail blocks first, so they are evicted first."""
        for blk in reversed(self.req_blocks.pop(req.request_id, [])):
            self.block_pool.free(blk)
        self.num_cached.pop(req.request_id, None)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks((list(self.req_blocks.get(request_id, [])),))

    def get_block_ids(self, request_id: str):
        return self.get_blocks(request_id).get_block_ids()


# ---------------------------------------------------------------------
# The scheduler (sched.py), the parts that meet the connector
# ---------------------------------------------------------------------

class Scheduler:
    def __init__(self, vllm_config: VllmConfig, kv_cache_config,
                 connector: Optional[KVConnectorBase_V1],
                 drops_stale_output: bool = False):
        self.vllm_config = vllm_config
        sc = vllm_config.scheduler_config
        self.max_num_batched_tokens = sc.max_num_batched_tokens
        self.max_num_seqs = sc.max_num_seqs
        self.block_size = vllm_config.cache_config.block_size
        self.kv = KVCacheManager(kv_cache_config.num_blocks, self.block_size,
                                 vllm_config.cache_config.enable_prefix_caching)
        self.connector = connector
        ktc = vllm_config.kv_transfer_config
        self.recompute_kv_load_failures = (
            ktc is not None and ktc.kv_load_failure_policy == "recompute")
        # after PR 50297: the connector's word (vLLM's base class says
        # True for a producer)
        self.requires_kv_delivery = (
            drops_stale_output and connector is not None and
            getattr(connector, "requires_kv_delivery",
                    ktc.is_kv_producer))
        self.requests: Dict[str, Request] = {}
        self.waiting: collections.deque = collections.deque()
        self.skipped_waiting: collections.deque = collections.deque()
        self.running: List[Request] = []
        self.finished_req_ids: set = set()
        self.finished_recving_kv_req_ids: set = set()
        self.failed_recving_kv_req_ids: set = set()
        # the harness's own bookkeeping for the 7.6 assertions
        self.delayed_free: set = set()
        self.promoted_after_load: set = set()
        self.reported_sending: set = set()
        self.reported_recving: set = set()
        if connector is not None:
            connector.bind_gpu_block_pool(self.kv.block_pool)

    # --- requests in and out ---
    def add_request(self, req: Request) -> None:
        self.waiting.append(req)
        self.requests[req.request_id] = req
        if self.connector is not None:
            self.connector.on_new_request(req)

    def finish_requests(self, req_ids, status: RequestStatus):
        """Aborts (sched.py:1779-1840): the kv_transfer_params of each
        finished request, by id."""
        out = {}
        for rid in req_ids:
            req = self.requests.get(rid)
            if req is None or req.is_finished():
                continue
            delay = False
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                # the worker still owns the blocks until finished_recving
                delay = rid not in self.finished_recving_kv_req_ids
                self.finished_recving_kv_req_ids.discard(rid)
                self.failed_recving_kv_req_ids.discard(rid)
            if req in self.running:
                self.running.remove(req)
            for q in (self.waiting, self.skipped_waiting):
                if req in q:
                    q.remove(req)
            req.status = status
            out[rid] = self._free_request(req, delay)
        return out

    def _free_request(self, req: Request, delay_free_blocks=False):
        assert req.is_finished()
        connector_delay, params = self._connector_finished(req)
        self.finished_req_ids.add(req.request_id)
        if connector_delay:
            self.delayed_free.add(req.request_id)
        if not (delay_free_blocks or connector_delay):
            self._free_blocks(req)
        return params

    def _connector_finished(self, req: Request):
        if self.connector is None:
            return False, None
        block_ids = self.kv.get_block_ids(req.request_id)
        assert len(block_ids) == 1  # no HMA: one KV cache group
        return self.connector.request_finished(req, block_ids[0])

    def _free_blocks(self, req: Request) -> None:
        assert req.is_finished()
        self.kv.free(req)
        del self.requests[req.request_id]

    def has_requests(self) -> bool:
        """Unfinished requests, or finished ones whose blocks wait for a
        delayed free: either keeps the engine stepping."""
        return bool(self.requests)

    # --- schedule() (sched.py:329-922) ---
    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        num_scheduled: Dict[str, int] = {}
        new_blocks: Dict[str, KVCacheBlocks] = {}
        scheduled_new: List[Request] = []
        scheduled_resumed: List[Request] = []
        scheduled_running: List[Request] = []
        preempted: List[Request] = []

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if n <= 0:  # its last token not sampled yet (async)
                i += 1
                continue
            while True:
                blocks = self.kv.allocate_slots(req, n)
                if blocks is not None:
                    break
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if blocks is None:
                break
            scheduled_running.append(req)
            new_blocks[req.request_id] = blocks
            num_scheduled[req.request_id] = n
            budget -= n
            i += 1

        # WAITING_FOR_REMOTE_KVS requests wait in skipped_waiting, which
        # goes first (sched.py:544-569)
        self.waiting = collections.deque(
            list(self.skipped_waiting) + list(self.waiting))
        self.skipped_waiting = collections.deque()
        while (not preempted and self.waiting and budget > 0 and
               len(self.running) < self.max_num_seqs):
            req = self.waiting[0]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if req.request_id not in self.finished_recving_kv_req_ids:
                    self.skipped_waiting.append(self.waiting.popleft())
                    continue
                self._update_waiting_for_remote_kv(req)
            ext, load_async = 0, False
            if req.num_computed_tokens == 0:
                computed, local = self.kv.get_computed_blocks(req)
                if self.connector is not None:
                    ext, load_async = self.connector.get_num_new_matched_tokens(
                        req, local)
                    if ext is None:  # ask again next step
                        self.skipped_waiting.append(self.waiting.popleft())
                        continue
                    assert ext >= 0 and (ext > 0 or not load_async), (
                        "get_num_new_matched_tokens(%s) = (%r, %r): async "
                        "must be False when no token is matched"
                        % (req.request_id, ext, load_async))
                    assert local + ext <= req.num_tokens, (
                        "get_num_new_matched_tokens(%s): %d local + %d "
                        "external > %d tokens" % (req.request_id, local, ext,
                                                  req.num_tokens))
            else:  # promoted after an async load, or resumed
                computed, local = [], 0
            num_computed = req.num_computed_tokens + local + ext
            if load_async:
                n = 0
            else:
                n = min(req.num_tokens - num_computed, budget)
                assert n > 0, (
                    "%s: %d local + %d external tokens leave none of %d to "
                    "compute (a synchronous hit must leave the last one)"
                    % (req.request_id, local, ext, req.num_tokens))
            blocks = self.kv.allocate_slots(
                req, n, num_new_computed_tokens=local,
                new_computed_blocks=computed,
                num_external_computed_tokens=ext,
                delay_cache_blocks=load_async)
            if blocks is None:
                break
            if self.connector is not None:
                self.connector.update_state_after_alloc(
                    req, self.kv.get_blocks(req.request_id), ext)
            self.waiting.popleft()
            req.num_computed_tokens = num_computed
            if load_async:
                req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                self.skipped_waiting.append(req)
                continue
            self.running.append(req)
            (scheduled_resumed if req.status == RequestStatus.PREEMPTED
             else scheduled_new).append(req)
            req.status = RequestStatus.RUNNING
            new_blocks[req.request_id] = blocks
            num_scheduled[req.request_id] = n
            budget -= n

        cached = CachedRequestData()
        for req in scheduled_running + scheduled_resumed:
            rid = req.request_id
            cached.req_ids.append(rid)
            if req in scheduled_resumed:
                cached.resumed_req_ids.add(rid)
                cached.all_token_ids[rid] = req.all_token_ids
                cached.new_block_ids.append(self.kv.get_block_ids(rid))
            else:
                ids = new_blocks[rid].get_block_ids()
                cached.new_block_ids.append(ids if ids[0] else None)
            cached.new_token_ids.append([])
            cached.num_computed_tokens.append(req.num_computed_tokens)
            cached.num_output_tokens.append(req.num_output_tokens)
        so = SchedulerOutput(
            scheduled_new_reqs=[NewRequestData(
                req_id=r.request_id, prompt_token_ids=r.prompt_token_ids,
                block_ids=self.kv.get_block_ids(r.request_id),
                num_computed_tokens=r.num_computed_tokens,
                max_tokens=r.max_tokens) for r in scheduled_new],
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0], finished_req_ids=self.finished_req_ids,
            free_encoder_mm_hashes=[],
            preempted_req_ids={r.request_id for r in preempted})
        if self.connector is not None:
            so.kv_connector_metadata = self.connector.build_connector_meta(so)
        # _update_after_schedule (sched.py:951-991)
        for rid, n in num_scheduled.items():
            self.requests[rid].num_computed_tokens += n
        self.finished_req_ids = set()
        return so

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.appendleft(req)

    def _update_waiting_for_remote_kv(self, req: Request) -> None:
        """sched.py:2077-2109."""
        rid = req.request_id
        if rid in self.failed_recving_kv_req_ids:
            self.failed_recving_kv_req_ids.remove(rid)
            if req.num_computed_tokens:
                self.kv.cache_blocks(req, req.num_computed_tokens)
            else:
                self.kv.free(req)
        else:
            n = min(req.num_computed_tokens, req.num_tokens)
            if n == req.num_tokens:
                n -= 1  # a full hit: recompute the last token to sample
            self.kv.cache_blocks(req, n)
            req.num_computed_tokens = n
        self.finished_recving_kv_req_ids.remove(rid)
        self.promoted_after_load.add(rid)
        req.status = (RequestStatus.PREEMPTED if req.num_preemptions
                      else RequestStatus.WAITING)

    # --- update_from_output() (sched.py:1283-1603) ---
    def update_from_output(self, so: SchedulerOutput,
                           ro: ModelRunnerOutput):
        """[(request, new token ids, kv_transfer_params)] for the
        requests that produced something or finished."""
        kvo = ro.kv_connector_output
        failed = set()
        if kvo is not None and kvo.invalid_block_ids:
            failed = self._handle_invalid_blocks(kvo.invalid_block_ids)
        outs = []
        stopped_running, stopped_preempted = [], []
        for rid, n in so.num_scheduled_tokens.items():
            req = self.requests.get(rid)
            if req is None or req.is_finished() or rid in failed:
                continue
            toks = ro.sampled_token_ids.get(rid)
            if not toks:
                continue
            # async scheduling: a request preempted while this step ran
            # gets its token all the same, and may stop with it, its
            # blocks freed already (stopped_preempted_reqs); after PR
            # 50297, where the connector requires KV delivery, the token
            # is dropped and the request computed again
            if req.status == RequestStatus.PREEMPTED and \
                    self.requires_kv_delivery:
                continue
            before = req.status
            req.append_output_token_ids(toks)
            params = None
            if req.num_output_tokens >= req.max_tokens:
                req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                (stopped_running if before == RequestStatus.RUNNING
                 else stopped_preempted).append(req)
                params = self._free_request(req)
            outs.append((req, toks, params))
        for req in stopped_running:
            self.running.remove(req)
        for req in stopped_preempted:
            self.waiting.remove(req)
        if failed and not self.recompute_kv_load_failures:
            reqs = [self.requests[r] for r in failed if r in self.requests]
            done = self.finish_requests(failed, RequestStatus.FINISHED_ERROR)
            outs.extend((r, [], done.get(r.request_id)) for r in reqs)
        if kvo is not None:
            self._update_from_kv_xfer_finished(kvo)
        if self.connector is not None:
            list(self.connector.take_events())
        return outs

    def _handle_invalid_blocks(self, invalid: set) -> set:
        """sched.py:2173-2345: the requests whose loaded blocks failed
        restart from the valid prefix (recompute), or fail."""
        bs = self.block_size
        affected_async, affected_sync = set(), set()
        for req in itertools.chain(self.skipped_waiting, self.waiting,
                                   self.running):
            if req.status not in (RequestStatus.WAITING_FOR_REMOTE_KVS,
                                  RequestStatus.RUNNING):
                continue
            ids = self.kv.get_block_ids(req.request_id)[0]
            bad = [i for i, b in enumerate(ids[:cdiv(req.num_computed_tokens,
                                                      bs)]) if b in invalid]
            if not bad:
                continue
            assert req.request_id not in self.promoted_after_load, (
                "load errors for %s reported after its finished_recving "
                "(blocks %s): vLLM already computed on them"
                % (req.request_id, sorted(set(ids) & invalid)))
            req.num_computed_tokens = bad[0] * bs
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                affected_async.add(req.request_id)
            else:
                affected_sync.add(req.request_id)
        if not self.recompute_kv_load_failures:
            return affected_async | affected_sync
        self.failed_recving_kv_req_ids |= affected_async
        return affected_sync

    def _update_from_kv_xfer_finished(self, kvo: KVConnectorOutput) -> None:
        """sched.py:2144-2171, with the harness's checks of 7.6."""
        if self.connector is not None:
            self.connector.update_connector_output(kvo)
        for rid in kvo.finished_recving or ():
            assert rid in self.requests, (
                "finished_recving for unknown request %s" % rid)
            assert rid not in self.reported_recving, (
                "finished_recving for %s reported twice" % rid)
            self.reported_recving.add(rid)
            req = self.requests[rid]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(rid)
            else:
                assert RequestStatus.is_finished(req.status), (
                    "finished_recving for %s, which is %s, neither waiting "
                    "for remote KV nor finished" % (rid, req.status))
                self._free_blocks(req)
        for rid in kvo.finished_sending or ():
            assert rid in self.requests, (
                "finished_sending for unknown request %s" % rid)
            assert rid in self.delayed_free, (
                "finished_sending for %s before request_finished returned "
                "True for it" % rid)
            assert rid not in self.reported_sending, (
                "finished_sending for %s reported twice" % rid)
            self.reported_sending.add(rid)
            self._free_blocks(self.requests[rid])


# ---------------------------------------------------------------------
# The worker: V1 GPU model runner + KVConnectorModelRunnerMixin
# ---------------------------------------------------------------------

class AttnMetadata:
    """Stand-in for a backend's per-layer attention metadata (not in the
    notes; kept minimal): the slots this step writes, per request."""

    def __init__(self, slot_mapping, block_table, seq_lens,
                 query_start_loc):
        self.slot_mapping = slot_mapping
        self.block_table = block_table
        self.seq_lens = seq_lens
        self.query_start_loc = query_start_loc
        self.num_actual_tokens = int(slot_mapping.numel())


class AttentionLayer:
    """forward_context.no_compile_layers[name]: the layer and its cache."""

    def __init__(self, name: str, kv_cache: torch.Tensor):
        self.layer_name, self.kv_cache = name, kv_cache


class _ReqState:
    def __init__(self, tokens, block_ids, num_computed):
        self.tokens = list(tokens)
        self.blocks = array.array("I", block_ids)
        self.hashes = array.array("Q")
        self.num_computed = num_computed


def _copy_kv_blocks(src_kv_caches, dst_kv_caches, src_block_ids,
                    dst_block_ids, direction) -> None:
    """set_host_xfer_buffer_ops' copy: blocks between two cache dicts
    (blocks-first tensors; CPU only here)."""
    for name, src in src_kv_caches.items():
        dst_kv_caches[name][dst_block_ids] = src[src_block_ids]


class Worker:
    def __init__(self, vllm_config, connector, kv: KvCaches, model: Model,
                 calls: Optional[list] = None, rank: int = 0,
                 deferred_load_start: bool = False,
                 preemptions_by_id: bool = False):
        self.vllm_config, self.connector = vllm_config, connector
        self.deferred_load_start = deferred_load_start
        self.preemptions_by_id = preemptions_by_id
        self.in_forward = False  # its forward is under way
        self.kv, self.model, self.rank = kv, model, rank
        self.states: Dict[str, _ReqState] = {}
        self.layers = {n: AttentionLayer(n, t) for n, t in kv.tensors.items()}
        self.bs = vllm_config.cache_config.block_size
        self.reported: set = set()

    def register(self) -> None:
        """gmr.py:7203-7212, once, after the caches exist."""
        if self.connector is None:
            return
        self.connector.register_kv_caches(self.kv.tensors)
        self.connector.set_host_xfer_buffer_ops(_copy_kv_blocks)

    def handshake_metadata(self):
        """gpu_worker.py:512-525: {tp_rank: metadata} or None."""
        if self.connector is None:
            return None
        md = self.connector.get_handshake_metadata()
        return None if md is None else {self.rank: md}

    def _update_states(self, so: SchedulerOutput) -> None:
        for rid in so.finished_req_ids:
            self.states.pop(rid, None)
        for rid in so.preempted_req_ids or ():
            self.states.pop(rid, None)
        for nr in so.scheduled_new_reqs:
            self.states[nr.req_id] = _ReqState(
                nr.prompt_token_ids, nr.block_ids[0], nr.num_computed_tokens)
        c = so.scheduled_cached_reqs
        for i, rid in enumerate(c.req_ids):
            if rid in c.resumed_req_ids:
                self.states[rid] = _ReqState(c.all_token_ids[rid],
                                             c.new_block_ids[i][0],
                                             c.num_computed_tokens[i])
                continue
            st = self.states[rid]
            if c.new_block_ids[i] is not None:
                st.blocks.extend(c.new_block_ids[i][0])
            st.num_computed = c.num_computed_tokens[i]

    def execute_model(self, so: SchedulerOutput,
                      sampled: Optional[dict] = None) -> ModelRunnerOutput:
        """sampled: rank 0's tokens, for the other ranks (their heads do
        not hold head 0, which the synthetic model reads)."""
        c = self.connector
        if c is not None:
            c.handle_preemptions(so.preempted_req_ids
                                 if self.preemptions_by_id
                                 else so.kv_connector_metadata)
        self._update_states(so)
        if so.total_num_scheduled_tokens == 0:
            return self._no_forward(so)
        runs = []
        slots, table, seq_lens, qsl = [], [], [], [0]
        for rid, n in so.num_scheduled_tokens.items():
            st = self.states[rid]
            a, b = st.num_computed, st.num_computed + n
            assert b <= len(st.tokens), "scheduled past the known tokens"
            Model.extend_hashes(st.hashes, st.tokens, b)
            runs.append((rid, st, a, b))
            slots.extend(st.blocks[p // self.bs] * self.bs + p % self.bs
                         for p in range(a, b))
            table.append(list(st.blocks))
            seq_lens.append(b)
            qsl.append(qsl[-1] + n)
        md = AttnMetadata(torch.tensor(slots, dtype=torch.long), table,
                          seq_lens, qsl)
        attn_metadata = {name: md for name in self.layers}
        ctx = ForwardContext(no_compile_layers=self.layers,
                             attn_metadata=attn_metadata,
                             slot_mapping={n: md.slot_mapping
                                           for n in self.layers})
        forward_context._set(ctx)
        try:
            kvo = self._kv_connector_output(so, ctx, self._forward, runs,
                                            attn_metadata)
        finally:
            forward_context._set(None)
        out = {}
        for rid, st, a, b in runs:  # V1: sampling after the forward
            st.num_computed = b
            if b == len(st.tokens):  # not a partial prefill
                tok = sampled[rid][0] if sampled is not None else \
                    self.model.next_token(self.kv.layout_c, self.kv.base,
                                          self.kv.table(st.blocks), b)
                st.tokens.append(tok)
                out[rid] = [tok]
        return ModelRunnerOutput(req_ids=list(so.num_scheduled_tokens),
                                 sampled_token_ids=out,
                                 kv_connector_output=kvo)

    def _forward(self, runs, attn_metadata) -> None:
        """The model: each layer's attention op writes this step's KV
        (unified_kv_cache_update) inside the hooks of
        maybe_transfer_kv_layer (kv_transfer_utils.py:15-61)."""
        c = self.connector
        for i, (name, layer) in enumerate(self.layers.items()):
            hooks = (c is not None and attn_metadata is not None and
                     c.has_connector_metadata())
            if hooks:
                c.wait_for_layer_load(name)
            for rid, st, a, b in runs:
                Model.fill(self.kv.layout_c, self.kv.base,
                           self.kv.table(st.blocks), st.hashes, i, a, b,
                           self.kv.head0)
            if hooks:
                c.save_kv_layer(name, layer.kv_cache, attn_metadata[name])

    def _kv_connector_output(self, so, ctx, forward, *args,
                             wait_for_save=True):
        """mixin.py:83-119: bind, start_load_kv, the forward, then
        wait_for_save, get_finished, load errors, stats, events, worker
        meta, clear. After PR 53333 (deferred_load_start) start_load_kv
        comes after the forward, before wait_for_save: no load of ours is
        synchronous."""
        c = self.connector
        if c is None:
            forward(*args)
            return None
        out = KVConnectorOutput()
        assert so.kv_connector_metadata is not None
        c.bind_connector_metadata(so.kv_connector_metadata)
        if not self.deferred_load_start:
            c.start_load_kv(ctx)
        try:
            self.in_forward = True
            forward(*args)
        finally:
            self.in_forward = False
            if self.deferred_load_start:
                c.start_load_kv(ctx)
            if wait_for_save:
                c.wait_for_save()
            out.finished_sending, out.finished_recving = c.get_finished(
                so.finished_req_ids)
            out.invalid_block_ids = c.get_block_ids_with_load_errors()
            out.kv_connector_stats = c.get_kv_connector_stats()
            out.kv_cache_events = c.get_kv_connector_kv_cache_events()
            out.kv_connector_worker_meta = c.build_connector_worker_meta()
            c.clear_connector_metadata()
        return out

    def _no_forward(self, so) -> ModelRunnerOutput:
        """mixin.py:37-55: no layer hooks, no wait_for_save,
        attn_metadata None."""
        ctx = ForwardContext(no_compile_layers=self.layers,
                             attn_metadata=None)
        forward_context._set(ctx)
        try:
            kvo = self._kv_connector_output(so, ctx, lambda: None,
                                            wait_for_save=False)
        finally:
            forward_context._set(None)
        if kvo is not None and kvo.is_empty():
            kvo = None  # EMPTY_MODEL_RUNNER_OUTPUT
        return ModelRunnerOutput(req_ids=[], sampled_token_ids={},
                                 kv_connector_output=kvo)


class KVOutputAggregator:
    """kv_connector/utils.py:50-170: an id is finished once every worker
    reported it, each exactly once."""

    def __init__(self, expected: int):
        self.expected = expected
        self.counts: Dict[str, int] = {}

    def aggregate(self, outputs: List[ModelRunnerOutput]) -> ModelRunnerOutput:
        first = outputs[0]
        kvos = [o.kv_connector_output for o in outputs]
        if all(k is None for k in kvos):
            return first
        sending, recving, invalid = set(), set(), set()
        for k in kvos:
            if k is None:
                continue
            invalid |= k.invalid_block_ids or set()
            for kind, ids, done in (("sending", k.finished_sending, sending),
                                    ("recving", k.finished_recving, recving)):
                for rid in ids or ():
                    # counted across steps: the workers may report an id
                    # in different ones
                    key = (kind, rid)
                    self.counts[key] = self.counts.get(key, 0) + 1
                    if self.counts[key] == self.expected:
                        done.add(rid)
                        del self.counts[key]
        base = next(k for k in kvos if k is not None)
        first.kv_connector_output = KVConnectorOutput(
            finished_sending=sending or None, finished_recving=recving or None,
            kv_connector_stats=base.kv_connector_stats,
            kv_cache_events=base.kv_cache_events,
            kv_connector_worker_meta=base.kv_connector_worker_meta,
            invalid_block_ids=invalid, expected_finished_count=self.expected)
        return first


# ---------------------------------------------------------------------
# The engine: EngineCore's start-up and step loop, and its clients
# ---------------------------------------------------------------------

class RequestOutput:
    """What a client gets: the tokens so far, and at the end the finish
    reason and the kv_transfer_params of request_finished."""

    def __init__(self, request_id, external_id, prompt_token_ids):
        self.request_id, self.external_id = request_id, external_id
        self.prompt_token_ids = prompt_token_ids
        self.token_ids: List[int] = []
        self.finished = False
        self.finish_reason: Optional[str] = None
        self.kv_transfer_params: Optional[dict] = None


class EngineDead(RuntimeError):
    """The engine stopped on an error (a connector broke an assertion):
    the error is the cause."""


class RequestHandle:
    def __init__(self, engine, out: RequestOutput):
        self.engine, self.output = engine, out
        self.deltas: "queue.Queue" = queue.Queue()

    @property
    def request_id(self) -> str:
        return self.output.request_id

    def stream(self, timeout: float = 60):
        """Yields lists of new token ids until finished."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError("request %s: no output in %.0f s"
                                   % (self.request_id, timeout))
            try:
                item = self.deltas.get(timeout=min(left, 0.1))
            except queue.Empty:
                if self.engine.error is not None:
                    raise EngineDead(str(self.engine.error)) \
                        from self.engine.error
                continue
            if isinstance(item, BaseException):
                raise EngineDead(str(item)) from item
            if item is None:
                return
            yield item

    def result(self, timeout: float = 60) -> RequestOutput:
        for _ in self.stream(timeout):
            pass
        return self.output


class MiniVllm:
    """One vLLM instance: EngineCore (scheduler + its connector) and one
    worker (its connector and KV caches) in this process.

    kv_transfer_config: a dict as --kv-transfer-config takes it, a
    KVTransferConfig, or None (no connector). role ("prefill", "decode",
    "both") fills kv_role when the config leaves it out, and is what
    /v1/pdx/info answers. async_scheduling: the next step is scheduled
    (build_connector_meta) before the previous one's update_from_output,
    as vLLM's batch queue does. deferred_load_start: vLLM after PR 53333
    (merged 2026-08): a step with no synchronous load (a connector's
    loads are asynchronous, as pdx's) calls start_load_kv after the
    forward, before wait_for_save. drops_stale_output: vLLM after PR
    50297 (merged 2026-07): when the connector requires_kv_delivery, a
    request preempted while a step that computes it is in flight loses
    that step's output and is computed again from its prompt, rather
    than finished with it. kv_cache_dtype: vLLM's --kv-cache-dtype, as
    the connector reads it (the synthetic model's KV stays bfloat16).
    preemptions_by_id: an older vLLM (before 0.20; base.py at 13f4ad0f)
    hands handle_preemptions the preempted requests' ids, not the step's
    metadata. The order inside a block of the caches (kv_cache_layout:
    NHD or HND) is vLLM's choice: attn_backend_layout, the layout the
    attention backend requires (FlashInfer on Blackwell: "HND"; None,
    FlashAttention's: none), else vllm_kv_cache_layout (the user's
    VLLM_KV_CACHE_LAYOUT), else the connector's
    get_required_kvcache_layout, else NHD.
    """

    def __init__(self, kv_transfer_config=None, role: str = "both",
                 model: str = "tiny", num_blocks: int = 1024,
                 kv_layout: str = "blocks_first",
                 max_num_batched_tokens: int = 8192,
                 max_num_seqs: int = 256, max_model_len: int = 8192,
                 enable_prefix_caching: bool = True,
                 async_scheduling: bool = False,
                 served_model_name: Optional[str] = None,
                 zero_step_sleep_s: float = 0.001, tp_size: int = 1,
                 deferred_load_start: bool = False,
                 drops_stale_output: bool = False,
                 kv_cache_dtype: str = "auto",
                 preemptions_by_id: bool = False,
                 attn_backend_layout: Optional[str] = None,
                 vllm_kv_cache_layout: Optional[str] = None):
        if role not in ROLES:
            raise ValueError("role: prefill, decode or both")
        self.role = role
        self.model = Model(model)
        ktc = kv_transfer_config
        if isinstance(ktc, dict):
            ktc = dict(ktc)
            ktc.setdefault("kv_role", ROLES[role])
            ktc = KVTransferConfig(**ktc)
        self.vllm_config = VllmConfig(
            model_config=ModelConfig(model=model,
                                     served_model_name=served_model_name,
                                     max_model_len=max_model_len,
                                     use_mla=kv_layout == "mla"),
            cache_config=CacheConfig(block_size=self.model.block_tokens,
                                     cache_dtype=kv_cache_dtype,
                                     enable_prefix_caching=enable_prefix_caching,
                                     num_gpu_blocks=num_blocks),
            parallel_config=ParallelConfig(tensor_parallel_size=tp_size),
            scheduler_config=SchedulerConfig(
                max_num_batched_tokens=max_num_batched_tokens,
                max_num_seqs=max_num_seqs, async_scheduling=async_scheduling),
            kv_transfer_config=ktc)
        self.served_model_name = served_model_name or model
        self.max_model_len = max_model_len
        self.zero_step_sleep_s = zero_step_sleep_s
        self.error: Optional[BaseException] = None
        self.steps = 0

        cls = None
        if ktc is not None and ktc.kv_connector:
            cls = connector_class(ktc)
            cls.requires_piecewise_for_cudagraph(
                ktc.kv_connector_extra_config)
        self.kv_cache_layout = kv_cache_layout(
            cls, self.vllm_config, attn_backend_layout, vllm_kv_cache_layout)
        # a worker per rank (gpu_worker.py), each built while
        # parallel_state reports its rank
        self.kvs = [KvCaches(self.model, num_blocks, kv_layout, tp_size, r,
                             self.kv_cache_layout)
                    for r in range(tp_size)]
        self.kv = self.kvs[0]
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[KVCacheTensor(self.kv.layer_bytes, [n])
                              for n in self.kv.tensors],
            kv_cache_groups=[KVCacheGroupSpec(list(self.kv.tensors))])
        # EngineCore.__init__: the workers first (their connector, then
        # the caches and register_kv_caches), then the scheduler, then the
        # handshake metadata (core.py:169-185)
        self.workers = []
        for r, kv in enumerate(self.kvs):
            parallel_state._set_tp(r, tp_size)
            try:
                c = cls(self.vllm_config, KVConnectorRole.WORKER,
                        self.kv_cache_config) if cls else None
                self.workers.append(Worker(
                    self.vllm_config, c, kv, self.model, rank=r,
                    deferred_load_start=deferred_load_start,
                    preemptions_by_id=preemptions_by_id))
                self.workers[-1].register()
            finally:
                parallel_state._set_tp(0, 1)
        self.worker = self.workers[0]
        self.worker_connector = self.worker.connector
        self.scheduler_connector = cls(self.vllm_config,
                                       KVConnectorRole.SCHEDULER,
                                       self.kv_cache_config) if cls else None
        self.scheduler = Scheduler(self.vllm_config, self.kv_cache_config,
                                   self.scheduler_connector,
                                   drops_stale_output)
        md = {}
        for w in self.workers:
            md.update(w.handshake_metadata() or {})
        if md:
            self.handshake_metadata = over_the_wire(md)
            self.scheduler_connector.set_xfer_handshake_metadata(
                self.handshake_metadata)
        else:
            self.handshake_metadata = None
        self.aggregator = KVOutputAggregator(
            (self.scheduler_connector.get_finished_count()
             if self.scheduler_connector else None) or
            self.vllm_config.parallel_config.world_size)
        self._inbox: "queue.Queue" = queue.Queue()
        self._handles: Dict[str, RequestHandle] = {}
        self._by_external: Dict[str, str] = {}
        self._pending = None  # async scheduling: the step in flight
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._closed = False

    # --- clients (any thread) ---
    def add_request(self, prompt_token_ids, max_tokens: int = 16,
                    kv_transfer_params: Optional[dict] = None,
                    request_id: Optional[str] = None) -> RequestHandle:
        """Queues a request; the engine admits it before its next step.
        request_id is the client's (external) id; the engine's own is
        it plus "-" and 8 hex digits (input_processor.py:215-232)."""
        ext = request_id or "cmpl-" + uuid.uuid4().hex
        rid = "%s-%s" % (ext, uuid.uuid4().hex[:8])
        extra = None if kv_transfer_params is None else \
            {"kv_transfer_params": kv_transfer_params}
        req = Request(rid, list(prompt_token_ids),
                      SamplingParams(max_tokens=max_tokens, extra_args=extra),
                      arrival_time=time.time(),
                      block_hasher=block_hasher(self.model.block_tokens))
        h = RequestHandle(self, RequestOutput(rid, ext, req.prompt_token_ids))
        self._inbox.put(("add", req, h))
        return h

    def abort(self, request_id: str) -> None:
        """Aborts by the engine's id or the client's."""
        self._inbox.put(("abort", request_id))

    def generate(self, prompt_token_ids, max_tokens: int = 16,
                 kv_transfer_params: Optional[dict] = None,
                 timeout: float = 60, **kw) -> RequestOutput:
        """add_request and wait: needs start()."""
        return self.add_request(prompt_token_ids, max_tokens,
                                kv_transfer_params, **kw).result(timeout)

    # --- the engine (one thread) ---
    def _drain_inbox(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item[0] == "add":
                _, req, h = item
                self._handles[req.request_id] = h
                self._by_external[h.output.external_id] = req.request_id
                self.scheduler.add_request(req)
            else:
                rid = self._by_external.get(item[1], item[1])
                req = self.scheduler.requests.get(rid)
                done = self.scheduler.finish_requests(
                    [rid], RequestStatus.FINISHED_ABORTED)
                if rid in done:
                    self._deliver(req, [], done[rid], "abort")

    def _deliver(self, req, toks, params, reason=None) -> None:
        h = self._handles.get(req.request_id) if req else None
        if h is None:
            return
        out = h.output
        out.token_ids.extend(toks)
        finished = req.is_finished()
        if toks:
            h.deltas.put(list(toks))
        if finished:
            out.finished = True
            out.finish_reason = reason or str(req.get_finished_reason())
            out.kv_transfer_params = params
            del self._handles[req.request_id]
            self._by_external.pop(out.external_id, None)
            h.deltas.put(None)

    def has_work(self) -> bool:
        return self.scheduler.has_requests() or self._pending is not None

    def step(self) -> int:
        """One engine step (core.py:428-560): admits queued requests and
        aborts, schedule() with build_connector_meta, the worker's
        execute_model, update_from_output. Returns the tokens it
        scheduled."""
        self._drain_inbox()
        so = self.scheduler.schedule()
        # each worker its own copy, as each process unpickles its own
        ros = [self.worker.execute_model(over_the_wire(so))]
        ros += [w.execute_model(over_the_wire(so), ros[0].sampled_token_ids)
                for w in self.workers[1:]]
        ro = self.aggregator.aggregate([over_the_wire(r) for r in ros])
        self.steps += 1
        done = [(so, ro)]
        if self.vllm_config.scheduler_config.async_scheduling:
            # step N's output is processed after step N + 1 is scheduled;
            # a step with no tokens has nothing in flight: both at once
            done = [self._pending] if self._pending else []
            self._pending = (so, ro)
            if so.total_num_scheduled_tokens == 0:
                done.append(self._pending)
                self._pending = None
        for so_done, ro_done in done:
            for req, toks, params in self.scheduler.update_from_output(
                    so_done, ro_done):
                self._deliver(req, toks, params)
        return so.total_num_scheduled_tokens

    def run_until_idle(self, timeout: float = 30) -> int:
        """Steps (in this thread) until no request is left; the steps."""
        end, n = time.monotonic() + timeout, 0
        self._drain_inbox()
        while self.has_work() or not self._inbox.empty():
            if time.monotonic() > end:
                raise TimeoutError("engine not idle after %.0f s" % timeout)
            if self.step() == 0:
                time.sleep(self.zero_step_sleep_s)
            n += 1
        return n

    def start(self) -> "MiniVllm":
        """Steps in a thread of its own while there is work."""
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="mini-vllm")
        self._thread.start()
        return self

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.has_work() and self._inbox.empty():
                    self._stop.wait(0.005)
                    continue
                if self.step() == 0:
                    # the no-forward path keeps stepping (a delayed free,
                    # a remote load): vLLM spins; a short nap here
                    self._stop.wait(self.zero_step_sleep_s)
        except BaseException as e:  # a broken assertion ends the engine
            self.error = e
            for h in list(self._handles.values()):
                h.deltas.put(e)
            raise

    def close(self) -> None:
        """Stops the engine thread; shuts both connectors down (worker,
        then scheduler, as vLLM does) and frees the KV pool."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        for c in [w.connector for w in self.workers] + \
                [self.scheduler_connector]:
            if c is not None:
                c.shutdown()
        for kv in self.kvs:
            kv.close()

    def __enter__(self):
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # --- for tests ---
    def check_kv(self, request_id: str, upto: int) -> int:
        """-1 when the first upto positions of a request the workers hold
        are the synthetic model's KV on every rank (its heads), else the
        first that is not on some rank."""
        bad = []
        for w in self.workers:
            st = w.states[request_id]
            Model.extend_hashes(st.hashes, st.tokens, upto)
            bad.append(Model.check(w.kv.layout_c, w.kv.base,
                                   w.kv.table(st.blocks), st.hashes, 0,
                                   upto, w.kv.head0))
        return min((b for b in bad if b >= 0), default=-1)

    def free_blocks(self) -> int:
        return self.scheduler.kv.block_pool.get_num_free_blocks()
