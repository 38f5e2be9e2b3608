"""A prefill and a decode scheduler of SGLang reduced to what drives a
transfer backend, in SGLang's own call order (sgl-project/sglang: base/
conn.py, common/conn.py and utils.py at 0094505d, prefill.py at 000c2b94,
decode.py at 0035ca42; docs/sglang.md). The KV pool is SGLang's MHA pool
(a K and a V buffer per layer, token-major, page p at p * page bytes) or
its MLA pool (one buffer per layer), as torch CPU tensors in one POSIX
shared memory object; the aux rows are MetadataBuffers' first and last
(output_ids, bootstrap_room). Nothing here is SGLang's code.

    classes = {"manager": ..., "sender": ..., "receiver": ...,
               "bootstrap_server": ...}   # what get_kv_class hands out
    P = Prefill(classes, ServerArgs(port=...), Pool(...))
    D = Decode(classes, ServerArgs(port=...), Pool(...))
    run(P, D, [Req(room, prompt)], timeout=20)
"""
import time
from types import SimpleNamespace
from typing import List

import torch

import pdx
from pdx.sglang import KVArgs, KVPoll


def ServerArgs(port, **kw):
    """The fields SGLang's managers read of server_args."""
    return SimpleNamespace(host="127.0.0.1", disaggregation_bootstrap_port=port,
                           tp_size=1, dp_size=1, pp_size=1,
                           enable_dp_attention=False,
                           disaggregation_ib_device=None, **kw)


class Pool:
    """MHATokenToKVPool / MLATokenToKVPool's buffers: pages + 1 pages (page
    0 is SGLang's padding slot), each of page_size tokens."""

    def __init__(self, layers=4, pages=32, page_size=4, heads=2, head_dim=16,
                 dtype=torch.float16, mla=False):
        self.layers, self.pages, self.page_size = layers, pages, page_size
        self.mla = mla
        tokens = (pages + 1) * page_size
        row = (1 if mla else heads) * head_dim
        self.tensors = 1 if mla else 2
        isz = torch.tensor([], dtype=dtype).element_size()
        self.shm = pdx.SharedPool(self.tensors * layers * tokens * row * isz)
        flat = torch.frombuffer(self.shm.buf, dtype=dtype)
        bufs = flat.view(self.tensors, layers, tokens, 1 if mla else heads,
                         head_dim)
        self.buffers = [[bufs[t, l] for l in range(layers)]
                        for t in range(self.tensors)]
        self.free = list(range(1, pages + 1))

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

    def fill(self, pages, seed):
        """The forward's writes: these pages of every layer."""
        g = torch.Generator().manual_seed(seed)
        for t in range(self.tensors):
            for l in range(self.layers):
                for p in pages:
                    v = self.page(t, l, p)
                    v.copy_(torch.randn(v.shape, generator=g).to(v.dtype))

    def page_bytes(self, pages):
        return b"".join(self.page(t, l, p).numpy().tobytes()
                        for t in range(self.tensors)
                        for l in range(self.layers) for p in pages)

    def close(self):
        self.buffers = None
        self.shm.close()


class MetadataBuffers:
    """MetadataBuffers' first and last rows: output_ids (int32 x 16) and
    bootstrap_room (64-bit x 8; torch 1.13 has no uint64)."""

    def __init__(self, size=8):
        self.output_ids = torch.zeros((size, 16), dtype=torch.int32)
        self.bootstrap_room = torch.zeros((size, 8), dtype=torch.int64)
        self.free = list(range(size))

    def get_buf_infos(self):
        bufs = [self.output_ids, self.bootstrap_room]
        return ([b.data_ptr() for b in bufs], [Pool.nbytes(b) for b in bufs],
                [Pool.nbytes(b[0]) for b in bufs])


class Req:
    def __init__(self, room, prompt_len, first_token=4242, chunk=None):
        self.bootstrap_room = room
        self.bootstrap_host = "127.0.0.1"
        self.prompt_len = prompt_len
        self.first_token = first_token
        self.chunk = chunk            # chunked prefill: tokens per forward
        self.pages = []               # this side's pages of the prompt
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

    def __init__(self, classes, server_args, pool, bootstrap=True):
        self.cls, self.sa, self.pool = classes, server_args, pool
        self.meta = MetadataBuffers()
        # the bootstrap server lives in the prefill instance's own process
        self.server = classes["bootstrap_server"](
            server_args.host, server_args.disaggregation_bootstrap_port) \
            if bootstrap else None
        self.mgr = classes["manager"](_kv_args(pool, self.meta), "prefill",
                                      server_args, pool.mla)
        self.bootstrapping: List[Req] = []
        self.running: List[Req] = []
        self.inflight: List[Req] = []

    def add(self, req):
        """PrefillBootstrapQueue.add: a sender per request."""
        req.sender = self.cls["sender"](
            mgr=self.mgr, bootstrap_addr="%s:%d" % (
                req.bootstrap_host, self.sa.disaggregation_bootstrap_port),
            bootstrap_room=req.bootstrap_room, dest_tp_ranks=[0], pp_rank=0)
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
                self.meta.output_ids[req.meta][0] = req.first_token
                self.meta.bootstrap_room[req.meta][0] = signed64(req.bootstrap_room)
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
        """The model's writes of positions [a, b) (these pages): random
        bytes seeded by the room; mini_sglang_serve.py's model instead."""
        self.pool.fill(pages, (req.bootstrap_room * 1000 + a) % 2**62)

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
        self.mgr = classes["manager"](_kv_args(pool, self.meta), "decode",
                                      server_args, pool.mla)
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

    def step(self):
        # _resolve_pending_reqs
        for req in list(self.pending):
            if self.mgr.try_ensure_parallel_info(req.addr):
                self.pending.remove(req)
                req.receiver.init(0)
        # _update_handshake_waiters
        for req in list(self.queue):
            if req in self.pending:
                continue
            poll = req.receiver.poll()
            if poll == KVPoll.WaitingForInput:
                req.waiting = True
            elif poll == KVPoll.Failed:
                self.queue.remove(req)
                self._end(req, poll)
        # pop_preallocated
        for req in list(self.queue):
            if not req.waiting:
                continue
            self.queue.remove(req)
            req.pages = self.pool.alloc(num_pages(req.prompt_len,
                                                  self.pool.page_size))
            req.meta = self.meta.free.pop(0)
            req.receiver.send_metadata(req.pages, req.meta, [],
                                       decode_prefix_len=0)
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
        req.receiver.clear()

    def busy(self):
        return self.pending or self.queue or self.transfer

    def close(self):
        self.mgr.close()


def run(P, D, pairs, timeout=20.0, each=None):
    """Both event loops, turn about, until every request ended on both
    sides (pairs: (prefill Req, decode Req) of one room); each() after
    every turn (a test's abort, a kill)."""
    for p, d in pairs:
        P.add(p)
        D.add(d, P.sa.disaggregation_bootstrap_port)
    end = time.monotonic() + timeout
    while P.busy() or D.busy():
        if time.monotonic() > end:
            raise TimeoutError("not done in %.0f s: prefill %s, decode %s"
                               % (timeout, [r.sender.state for r in
                                            P.bootstrapping + P.running +
                                            P.inflight],
                                  [r.receiver.state for r in
                                   D.pending + D.queue + D.transfer]))
        P.step()
        D.step()
        if each is not None:
            each()
        time.sleep(0.002)
