"""A prefill and a decode scheduler of SGLang reduced to what drives a
transfer backend, in SGLang's own call order (sgl-project/sglang: base/
conn.py, common/conn.py and utils.py at 0094505d, prefill.py at 000c2b94,
decode.py at 0035ca42; docs/sglang.md). The KV pool is SGLang's MHA pool
(a K and a V buffer per layer, token-major, page p at p * page bytes) or
its MLA pool (one buffer per layer), as torch CPU tensors in one POSIX
shared memory object; the aux rows are MetadataBuffers' (output_ids,
cached_tokens, logprobs, speculative top-k and hidden states, and
bootstrap_room last). Nothing here is SGLang's code.

    classes = {"manager": ..., "sender": ..., "receiver": ...,
               "bootstrap_server": ...}   # what get_kv_class hands out
    P = Prefill(classes, ServerArgs(port=...), Pool(...))
    D = Decode(classes, ServerArgs(port=...), Pool(...))
    run(P, D, [Req(room, prompt)], timeout=20)

Prefill(..., layer_ms=X) computes layer by layer, X ms each, calling the
per-layer hook (SGLANG_DISAGG_LAYERWISE) on senders that have it.
side_by_side() times the transfer left after the last layer, sending
after the prefill and layer-wise; run as a script it prints that figure
(docs/sglang.md, "Measured"):

    mini_sglang.py --bench --agent PATH-TO-pdx-agent [--tokens N ...]
"""
import copy
import glob
import os
import shutil
import statistics
import tempfile
import time
from types import SimpleNamespace
from typing import List

import torch

import pdx
from pdx.sglang import KVArgs, KVPoll, bootstrap
from rig import free_port


def ServerArgs(port, **kw):
    """The fields SGLang's managers read of server_args."""
    args = dict(host="127.0.0.1", disaggregation_bootstrap_port=port,
                tp_size=1, dp_size=1, pp_size=1, enable_dp_attention=False,
                disaggregation_ib_device=None)
    args.update(kw)
    return SimpleNamespace(**args)


POOL_PREFIX = "mini-sglang-"  # no sweep of pdx-*'s takes it
_pools = 0


def pool_name():
    """This process's next pool's shared memory name: a test that kills a
    server with its process group (and so Python's resource tracker,
    which would unlink it) removes its pools by pid (remove_left)."""
    global _pools
    _pools += 1
    return "%s%d-%d" % (POOL_PREFIX, os.getpid(), _pools)


def remove_left(pid):
    """What process pid left when it was killed: its pools in /dev/shm,
    and the directory of the pdx-agent it started (its socket and log)."""
    prefix = "%s%d-" % (POOL_PREFIX, pid)
    for f in os.listdir("/dev/shm"):
        if f.startswith(prefix):
            os.unlink(os.path.join("/dev/shm", f))
    for d in glob.glob(os.path.join(tempfile.gettempdir(),
                                    "pdx-agent-%d-*" % pid)):
        shutil.rmtree(d, ignore_errors=True)


class Pool:
    """MHATokenToKVPool / MLATokenToKVPool's buffers: pages + 1 pages (page
    0 is SGLang's padding slot), each of page_size tokens. Rank tp_rank of
    an instance of tp_size ranks: heads of the model's heads * tp_size
    (MLA: the whole latent, as every rank)."""

    LAYERS = 4

    def __init__(self, layers=LAYERS, pages=32, page_size=4, heads=2,
                 head_dim=16, dtype=torch.float16, mla=False, tp_rank=0,
                 tp_size=1):
        self.layers, self.pages, self.page_size = layers, pages, page_size
        self.mla = mla
        self.heads = 1 if mla else heads
        self.tp_rank, self.tp_size = tp_rank, tp_size
        tokens = (pages + 1) * page_size
        row = (1 if mla else heads) * head_dim
        self.tensors = 1 if mla else 2
        isz = torch.tensor([], dtype=dtype).element_size()
        self.shm = pdx.SharedPool(self.tensors * layers * tokens * row * isz,
                                  name=pool_name())
        flat = torch.frombuffer(self.shm.buf, dtype=dtype)
        bufs = flat.view(self.tensors, layers, tokens, 1 if mla else heads,
                         head_dim)
        self.buffers = [[bufs[t, l] for l in range(layers)]
                        for t in range(self.tensors)]
        self.free = list(range(1, pages + 1))
        self.noise = None

    @staticmethod
    def nbytes(t):
        return t.numel() * t.element_size()   # torch 1.13: no .nbytes

    def get_contiguous_buf_infos(self):
        """All K buffers then all V buffers (MLA: the latent buffers):
        their addresses, bytes and one page's bytes."""
        bufs = [b for per_tensor in self.buffers for b in per_tensor]
        return ([b.data_ptr() for b in bufs], [self.nbytes(b) for b in bufs],
                [self.nbytes(b[0]) * self.page_size for b in bufs])

    def alloc(self, n):
        got, self.free = self.free[:n], self.free[n:]
        assert len(got) == n, "pool full"
        return got

    def page(self, t, l, p):
        ps = self.page_size
        return self.buffers[t][l][p * ps:(p + 1) * ps]

    def fill(self, pages, seed, layer=None):
        """The forward's writes: these pages of one layer (all layers
        without one). Cheap on big pools: one pool-wide block of noise,
        a window of it per seed, shifted per tensor and layer. The noise
        is the whole model's (every head), of which a rank keeps its
        heads: the ranks of an instance hold one model's KV."""
        if not pages:
            return
        if self.noise is None:
            g = torch.Generator().manual_seed(1)
            tokens, heads, dim = self.buffers[0][0].shape
            split = 1 if self.mla else self.tp_size   # MLA: all on each
            whole = torch.randn((tokens, heads * split, dim), generator=g)
            lo = self.tp_rank * heads if split > 1 else 0
            self.noise = whole[:, lo:lo + heads].contiguous().to(
                self.buffers[0][0].dtype)
        ps, n = self.page_size, len(pages)
        noise = self.noise.view(-1, ps, *self.noise.shape[1:])
        at = seed % (noise.shape[0] - n + 1)
        idx = torch.tensor(pages, dtype=torch.long)
        for t in range(self.tensors):
            for l in range(self.layers) if layer is None else (layer,):
                buf = self.buffers[t][l].view(noise.shape)
                buf.index_copy_(0, idx, noise[at:at + n] +
                                ((seed + 3 * t + l) % 64) / 8)

    def page_bytes(self, pages):
        return b"".join(self.page(t, l, p).numpy().tobytes()
                        for t in range(self.tensors)
                        for l in range(self.layers) for p in pages)

    def close(self):
        self.buffers = self.noise = None
        self.shm.close()


class MetadataBuffers:
    """MetadataBuffers' rows in get_buf_infos' order (utils.py): output_ids
    (int32 x 16), cached_tokens, the first token's logprob and its top
    logprobs, speculative decoding's top-k and hidden states, and
    bootstrap_room last (64-bit x 8; torch 1.13 has no uint64)."""

    def __init__(self, size=8, hidden_size=256, top_logprobs=128):
        z = torch.zeros
        self.output_ids = z((size, 16), dtype=torch.int32)
        self.cached_tokens = z((size, 16), dtype=torch.int32)
        self.output_token_logprobs_val = z((size, 16), dtype=torch.float32)
        self.output_token_logprobs_idx = z((size, 16), dtype=torch.int32)
        self.output_top_logprobs_val = z((size, top_logprobs),
                                         dtype=torch.float32)
        self.output_top_logprobs_idx = z((size, top_logprobs),
                                         dtype=torch.int32)
        self.output_topk_p = z((size, 16), dtype=torch.float32)
        self.output_topk_index = z((size, 16), dtype=torch.int64)
        self.output_hidden_states = z((size, hidden_size),
                                      dtype=torch.bfloat16)
        self.bootstrap_room = z((size, 8), dtype=torch.int64)
        self.free = list(range(size))

    def bufs(self):
        return [self.output_ids, self.cached_tokens,
                self.output_token_logprobs_val, self.output_token_logprobs_idx,
                self.output_top_logprobs_val, self.output_top_logprobs_idx,
                self.output_topk_p, self.output_topk_index,
                self.output_hidden_states, self.bootstrap_room]

    def get_buf_infos(self):
        bufs = self.bufs()
        return ([b.data_ptr() for b in bufs], [Pool.nbytes(b) for b in bufs],
                [Pool.nbytes(b[0]) for b in bufs])

    def set_buf(self, idx, req):
        """The last chunk's set_buf: the first token, and the rest of the
        row as a request with logprobs and speculative decoding has it
        (values of its room, so that each request's differ)."""
        g = torch.Generator().manual_seed(req.bootstrap_room % 2**62)
        for b in self.bufs()[1:-1]:
            row = b[idx]
            if row.dtype.is_floating_point:
                row.copy_(torch.rand(row.shape, generator=g))
            else:
                row.copy_(torch.randint(0, 2**31 - 1, row.shape, generator=g))
        self.output_ids[idx][0] = req.first_token
        self.bootstrap_room[idx][0] = signed64(req.bootstrap_room)

    def row_bytes(self, idx):
        """The row of every buffer but bootstrap_room, as bytes."""
        return b"".join(bytes(b[idx].contiguous().view(torch.uint8).numpy())
                        for b in self.bufs()[:-1])

    def zero(self, idx):
        for b in self.bufs():
            b[idx].zero_()


class Req:
    def __init__(self, room, prompt_len, first_token=4242, chunk=None):
        self.bootstrap_room = room
        self.bootstrap_host = "127.0.0.1"
        self.prompt_len = prompt_len
        self.first_token = first_token
        self.chunk = chunk            # chunked prefill: tokens per forward
        self.pages = []               # this side's pages of the prompt
        # decode: the pages of the prompt's first tokens that its radix
        # cache holds (SGLang's decode_prefix_len: whole pages), and the
        # prefix it says (that many pages' tokens unless set)
        self.prefix_pages = []
        self.prefix_len = None
        # the prefill DP rank the router named (disagg_prefill_dp_rank),
        # or None; the prefill side's DP controller notes where it went
        self.prefill_dp_rank = None
        self.dp_rank = None
        # a later SGLang's prefill.py tells the sender the request named
        # its prefill DP rank (req_has_disagg_prefill_dp_rank); 000c2b94's
        # does not
        self.tells_dp_rank = False
        # decode: PD retraction with rebootstrap (decode.py's
        # is_rebootstrap: its prefill is to be computed again)
        self.rebootstrap = False
        self.sender = self.receiver = None
        self.meta = -1
        self.done = None              # KVPoll.Success or Failed at the end
        self.error = ""


def _kv_args(pool, meta, rank=0):
    """_init_kv_manager of prefill.py / decode.py: KVArgs as they fill it."""
    a = KVArgs()
    a.engine_rank, a.pp_rank, a.system_dp_rank = rank, 0, 0
    a.kv_data_ptrs, a.kv_data_lens, a.kv_item_lens = \
        pool.get_contiguous_buf_infos()
    a.page_size = pool.page_size
    a.aux_data_ptrs, a.aux_data_lens, a.aux_item_lens = meta.get_buf_infos()
    a.state_types = []
    a.ib_device, a.gpu_id = None, 0
    return a


def signed64(v):
    """A uint64 in torch 1.13's int64 row."""
    return v - 2**64 if v >= 2**63 else v


def num_pages(tokens, page_size):
    return (tokens + page_size - 1) // page_size


class Prefill:
    """PrefillBootstrapQueue, the prefill event loop's forward and
    send_kv_chunk, and the inflight queue."""

    def __init__(self, classes, server_args, pool, bootstrap=True,
                 layer_ms=0.0):
        self.cls, self.sa, self.pool = classes, server_args, pool
        self.layer_ms = layer_ms   # modeled compute of one layer
        self.meta = MetadataBuffers()
        # the bootstrap server lives in the prefill instance's own process
        # (its rank 0's)
        self.server = classes["bootstrap_server"](
            server_args.host, server_args.disaggregation_bootstrap_port) \
            if bootstrap and pool.tp_rank == 0 else None
        self.mgr = classes["manager"](
            _kv_args(pool, self.meta, pool.tp_rank), "prefill", server_args,
            pool.mla)
        self.bootstrapping: List[Req] = []
        self.running: List[Req] = []
        self.inflight: List[Req] = []

    def add(self, req):
        """PrefillBootstrapQueue.add: a sender per request."""
        told = {"req_has_disagg_prefill_dp_rank":
                req.prefill_dp_rank is not None} if req.tells_dp_rank else {}
        req.sender = self.cls["sender"](
            mgr=self.mgr, bootstrap_addr="%s:%d" % (
                req.bootstrap_host, self.sa.disaggregation_bootstrap_port),
            bootstrap_room=req.bootstrap_room, dest_tp_ranks=[0], pp_rank=0,
            **told)
        self.bootstrapping.append(req)

    def step(self):
        # pop_bootstrapped
        for req in list(self.bootstrapping):
            poll = req.sender.poll()
            if poll == KVPoll.Bootstrapping:
                continue
            self.bootstrapping.remove(req)
            if poll == KVPoll.Failed:
                self._end(req, poll)
                continue
            req.meta = self.meta.free.pop(0)
            n = num_pages(req.prompt_len - req.sender.pop_decode_prefix_len(),
                          self.pool.page_size)
            req.sender.init(n, req.meta)
            req.pages = self.pool.alloc(n)
            req.sent_tokens = 0
            self.running.append(req)
        # a forward of one chunk per running request, then send_kv_chunk
        for req in list(self.running):
            end = req.prompt_len if req.chunk is None else \
                min(req.prompt_len, req.sent_tokens + req.chunk)
            last = end == req.prompt_len
            ps = self.pool.page_size
            if not last:
                end -= end % ps   # a partial page waits for the next chunk
            pages = req.pages[req.sent_tokens // ps:num_pages(end, ps)]
            self.forward(req, pages, req.sent_tokens, end)
            if last:
                self.meta.set_buf(req.meta, req)
                req.aux_sent = self.meta.row_bytes(req.meta)
                self.running.remove(req)
                self.inflight.append(req)
            if req.sender.should_send_kv_chunk(len(pages), last):
                req.sender.send(pages, [])
            req.sent_tokens = end
        # process_disagg_prefill_inflight_queue
        for req in list(self.inflight):
            poll = req.sender.poll()
            if poll in (KVPoll.Success, KVPoll.Failed):
                self.inflight.remove(req)
                self._end(req, poll)

    def forward(self, req, pages, a, b):
        """The model's forward of one chunk, positions [a, b) in these
        pages, layer by layer (layer_ms of compute each; random bytes
        seeded by the room; mini_sglang_serve.py's model instead), calling
        the per-layer hook of SGLang 15e67e26 (layerwise_hooks.py) on a
        sender that enables it, after the scheduler named the forward's
        pages (set_layerwise_indices)."""
        seed = (req.bootstrap_room * 1000 + a) % 2**62
        s = req.sender
        hook = getattr(s, "is_layerwise_enabled", False)
        if hook:
            s.set_layerwise_indices(pages, None)
            s.start_layerwise_send(self.pool.layers)
        for layer in range(self.pool.layers):
            if self.layer_ms:
                time.sleep(self.layer_ms / 1000)
            self.pool.fill(pages, seed, layer)
            if hook:
                s.save_kv_layer(layer)
        if hook:
            s.finalize_layerwise_send()
        req.t_computed_ns = time.monotonic_ns()

    def _end(self, req, poll):
        req.done = poll
        if poll == KVPoll.Failed:
            try:
                req.sender.failure_exception()
            except Exception as e:   # SGLang puts its text in the abort
                req.error = str(e)
        else:
            req.metric = req.sender.get_transfer_metric()
        req.sender.clear()
        if req.meta >= 0:
            self.meta.free.append(req.meta)

    def busy(self):
        return self.bootstrapping or self.running or self.inflight

    def close(self):
        self.mgr.close()
        if self.server is not None:
            self.server.close()


class Decode:
    """DecodePreallocQueue (add, _resolve_pending_reqs, _update_handshake_
    waiters, pop_preallocated) and the transfer queue with its metadata
    gate."""

    def __init__(self, classes, server_args, pool):
        self.cls, self.sa, self.pool = classes, server_args, pool
        self.meta = MetadataBuffers()
        self.mgr = classes["manager"](
            _kv_args(pool, self.meta, pool.tp_rank), "decode", server_args,
            pool.mla)
        self.pending: List[Req] = []
        self.queue: List[Req] = []
        self.transfer: List[Req] = []

    def add(self, req, port):
        req.addr = "%s:%d" % (req.bootstrap_host, port)
        req.receiver = self.cls["receiver"](
            mgr=self.mgr, bootstrap_addr=req.addr,
            bootstrap_room=req.bootstrap_room)
        req.waiting = False
        self.queue.append(req)
        info = self.mgr.prefill_info_table.get(req.addr)
        if info is not None and info.dp_size == 1:
            req.receiver.init(0)
        else:
            self.pending.append(req)

    def _prefill_dp_rank(self, req):
        """_resolve_prefill_dp_rank: the router's pick, else room %
        dp_size when the prefill instance routes by the room, else None
        (asked of its bootstrap server)."""
        info = self.mgr.prefill_info_table[req.addr]
        if req.prefill_dp_rank is not None:
            return req.prefill_dp_rank
        if info.dp_size == 1:
            return 0
        if info.follow_bootstrap_room:
            return req.bootstrap_room % info.dp_size
        return None

    def step(self):
        # _resolve_pending_reqs: known DP ranks first, then one query per
        # prefill instance for the rest (CommonKVReceiver.query_prefill_
        # dp_ranks, SGLang's own: its /query_dp_ranks)
        need = {}
        for req in list(self.pending):
            if not self.mgr.try_ensure_parallel_info(req.addr):
                continue
            dp = self._prefill_dp_rank(req)
            if dp is None:
                need.setdefault(req.addr, []).append(req)
                continue
            self.pending.remove(req)
            req.receiver.init(dp)
        for addr, reqs in need.items():
            got = bootstrap.query_dp_ranks(addr,
                                           [r.bootstrap_room for r in reqs])
            for req in reqs:
                dp = got.get(str(req.bootstrap_room))
                if dp is not None:
                    self.pending.remove(req)
                    req.receiver.init(int(dp))
        # _update_handshake_waiters: every receiver of the queue, those
        # still pending (no init yet) too; pop_preallocated drops a failed
        # one from both lists
        for req in list(self.queue):
            poll = req.receiver.poll()
            if poll == KVPoll.WaitingForInput:
                req.waiting = True
            elif poll == KVPoll.Failed:
                self.queue.remove(req)
                if req in self.pending:
                    self.pending.remove(req)
                self._end(req, poll)
        # pop_preallocated
        for req in list(self.queue):
            if not req.waiting:
                continue
            self.queue.remove(req)
            ps, held = self.pool.page_size, req.prefix_pages
            req.pages = held + self.pool.alloc(
                num_pages(req.prompt_len, ps) - len(held))
            req.meta = self.meta.free.pop(0)
            prefix = len(held) * ps if req.prefix_len is None else \
                req.prefix_len
            req.receiver.send_metadata(req.pages[len(held):], req.meta, [],
                                       decode_prefix_len=prefix)
            if req.rebootstrap:   # decode.py@0035ca42, after the metadata
                self.mgr.submit_prefill_recompute(
                    req.receiver, {"rid": "r%d" % req.bootstrap_room,
                                   "bootstrap_room": req.bootstrap_room})
            self.transfer.append(req)
        # the transfer queue: Success counts once the aux row holds the room
        for req in list(self.transfer):
            poll = req.receiver.poll()
            if poll == KVPoll.Success and \
                    self.meta.bootstrap_room[req.meta][0] == 0:
                poll = KVPoll.Transferring
            if poll in (KVPoll.Success, KVPoll.Failed):
                self.transfer.remove(req)
                self._end(req, poll)

    def _end(self, req, poll):
        req.done = poll
        if poll == KVPoll.Failed:
            try:
                req.receiver.failure_exception()
            except Exception as e:
                req.error = str(e)
        else:
            req.got_token = int(self.meta.output_ids[req.meta][0])
            req.got_room = int(self.meta.bootstrap_room[req.meta][0])
            req.got_aux = self.meta.row_bytes(req.meta)
            # when the decode rank's agent said "received" (its clock is
            # CLOCK_MONOTONIC, as time.monotonic_ns)
            req.t_received_ns = req.receiver.event.t_last_ns
        req.receiver.clear()

    def busy(self):
        return self.pending or self.queue or self.transfer

    def close(self):
        self.mgr.close()


class Ranks:
    """The tensor-parallel ranks of one instance (Prefill or Decode
    schedulers of pools of ranks 0..n-1), stepped together, as SGLang's
    ranks run the same requests: a request added becomes one Req per rank
    (req.ranks)."""

    def __init__(self, ranks):
        self.ranks = ranks
        self.sa = ranks[0].sa

    def add(self, req, *args):
        req.ranks = [copy.copy(req) for _ in self.ranks]
        for r, q in zip(self.ranks, req.ranks):
            r.add(q, *args)

    def step(self):
        for r in self.ranks:
            r.step()

    def busy(self):
        return any(r.busy() for r in self.ranks)

    def close(self):
        for r in self.ranks:
            r.close()


class DataParallel(Ranks):
    """A prefill instance with DP attention: a scheduler per DP rank (an
    attention group of one rank each here, pools of every head), one
    bootstrap server, stepped together as Ranks; the data-parallel
    controller gives each request to one of them: the rank the router
    named, else by its room (follow_bootstrap_room, what SGLang's prefill
    does unless told), else in turn (round_robin)."""

    def __init__(self, ranks, method):
        super().__init__(ranks)
        self.method, self.turn = method, 0

    def add(self, req):
        n = len(self.ranks)
        if req.prefill_dp_rank is not None:
            req.dp_rank = req.prefill_dp_rank
        elif self.method == "follow_bootstrap_room":
            req.dp_rank = req.bootstrap_room % n
        else:
            req.dp_rank, self.turn = self.turn % n, self.turn + 1
        self.ranks[req.dp_rank].add(req)


def run(P, D, pairs, timeout=20.0, each=None, decode_first=False):
    """Both event loops, turn about, until every request ended on both
    sides (pairs: (prefill Req, decode Req) of one room); each() after
    every turn (a test's abort, a kill). decode_first: the decode side
    has named its pages (send_metadata) before the prefill side gets the
    request, as when its pre-allocation beats the prefill's queue."""
    end = time.monotonic() + timeout

    def late():
        return TimeoutError("not done in %.0f s: prefill %s, decode %s"
                            % (timeout, [r.sender.state for r in
                                         P.bootstrapping + P.running +
                                         P.inflight],
                               [r.receiver.state for r in
                                D.pending + D.queue + D.transfer]))
    for p, d in pairs:
        D.add(d, P.sa.disaggregation_bootstrap_port)
    while decode_first and (D.pending or D.queue):
        if time.monotonic() > end:
            raise late()
        D.step()
        time.sleep(0.002)
    for p, d in pairs:
        P.add(p)
    while P.busy() or D.busy():
        if time.monotonic() > end:
            raise late()
        P.step()
        D.step()
        if each is not None:
            each()
        time.sleep(0.002)


class Layerwise:
    """SGLang's switch of the per-layer hook (SGLANG_DISAGG_LAYERWISE),
    on or off for the managers built inside the with."""

    def __init__(self, on):
        self.on = on

    def __enter__(self):
        self.was = os.environ.get("SGLANG_DISAGG_LAYERWISE")
        os.environ["SGLANG_DISAGG_LAYERWISE"] = "1" if self.on else "0"

    def __exit__(self, *exc):
        if self.was is None:
            del os.environ["SGLANG_DISAGG_LAYERWISE"]
        else:
            os.environ["SGLANG_DISAGG_LAYERWISE"] = self.was


def transfer_left(classes, pool_kw, tokens, layer_ms, layerwise, rooms,
                  chunk=None):
    """One request at a time through a prefill and a decode scheduler
    (pools Pool(**pool_kw), the agents their managers start), the
    per-layer hook on or off: for each room, the ms from the prefill's
    last layer computed to the decode agent's "received" (what the decode
    side's poll turns into Success), and the transfer's bytes. The first
    room warms the agents' connection and is not counted."""
    p_pool, d_pool = Pool(**pool_kw), Pool(**pool_kw)
    with Layerwise(layerwise):
        P = Prefill(classes, ServerArgs(free_port()), p_pool,
                    layer_ms=layer_ms)
        D = Decode(classes, ServerArgs(free_port()), d_pool)
    left, nbytes = [], 0
    try:
        for i, room in enumerate(rooms):
            p = Req(room, tokens, first_token=room % 30000, chunk=chunk)
            d = Req(room, tokens)
            run(P, D, [(p, d)], timeout=60, decode_first=True)
            if (p.done, d.done) != (KVPoll.Success, KVPoll.Success):
                raise RuntimeError("room %d: prefill %s, decode %s"
                                   % (room, p.error, d.error))
            if P.pool.page_bytes(p.pages) != D.pool.page_bytes(d.pages):
                raise RuntimeError("room %d: KV differs" % room)
            if i:
                left.append((d.t_received_ns - p.t_computed_ns) / 1e6)
            nbytes = p.metric.transfer_total_bytes
            P.pool.free += p.pages
            D.pool.free += d.pages
            D.meta.free.append(d.meta)   # the decode side is done with it
    finally:
        P.close()
        D.close()
        p_pool.close()
        d_pool.close()
    return left, nbytes


def side_by_side(classes, pool_kw, tokens, layer_ms, iters=3, chunk=None):
    """transfer_left sending after the prefill (a), then layer-wise (b):
    their medians; the bytes of one layer; (a)'s throughput (every layer
    ready at once, so the whole transfer is left) and from it one layer's
    transfer time, the bound (b) is held to."""
    rooms = list(range(1001, 1002 + iters))
    a, nbytes = transfer_left(classes, pool_kw, tokens, layer_ms, False,
                              rooms, chunk)
    b, _ = transfer_left(classes, pool_kw, tokens, layer_ms, True, rooms,
                         chunk)
    layers = pool_kw.get("layers", Pool.LAYERS)
    a_ms, b_ms = statistics.median(a), statistics.median(b)
    layer_bytes = nbytes / layers
    gbps = nbytes / a_ms / 1e6
    one_layer_ms = layer_bytes / gbps / 1e6
    return {"after_prefill_ms": a_ms, "layerwise_ms": b_ms,
            "after_prefill_all": a, "layerwise_all": b,
            "bytes": nbytes, "layer_bytes": layer_bytes, "gbps": gbps,
            "one_layer_ms": one_layer_ms,
            "ratio": b_ms / one_layer_ms}


def main():
    """--bench: the side-by-side figure of docs/sglang.md."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--bench", action="store_true", required=True)
    ap.add_argument("--agent", required=True, help="pdx-agent to start")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--layer-ms", type=float, default=20.0)
    ap.add_argument("--chunk", type=int, default=None)
    ap.add_argument("--iters", type=int, default=7)
    o = ap.parse_args()
    os.environ["PDX_SGLANG_AGENT_BIN"] = o.agent
    os.environ.setdefault("UCX_TLS", "sm,self")
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    from pdx.sglang import (PdxKVBootstrapServer, PdxKVManager,
                            PdxKVReceiver, PdxKVSender)
    classes = {"manager": PdxKVManager, "sender": PdxKVSender,
               "receiver": PdxKVReceiver,
               "bootstrap_server": PdxKVBootstrapServer}
    pool_kw = dict(layers=o.layers, pages=num_pages(o.tokens, o.page_size),
                   page_size=o.page_size, heads=o.kv_heads,
                   head_dim=o.head_dim)
    r = side_by_side(classes, pool_kw, o.tokens, o.layer_ms, o.iters,
                     o.chunk)
    print("%d layers x %.2f MB (%d tokens), %.1f ms compute per layer, "
          "median of %d" % (o.layers, r["layer_bytes"] / 1e6, o.tokens,
                            o.layer_ms, o.iters))
    print("throughput %.2f GB/s (after-prefill), one layer %.2f ms"
          % (r["gbps"], r["one_layer_ms"]))
    print("left after the last layer: after-prefill %.2f ms, layer-wise "
          "%.2f ms = %.2f x one layer"
          % (r["after_prefill_ms"], r["layerwise_ms"], r["ratio"]))
    print("all runs (ms): after-prefill %s, layer-wise %s"
          % (["%.2f" % x for x in r["after_prefill_all"]],
             ["%.2f" % x for x in r["layerwise_all"]]))


if __name__ == "__main__":
    main()
