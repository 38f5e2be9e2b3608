#!/usr/bin/python3
"""PdxConnector's worker side with its KV in GPU memory, no torch: device
memory from the CUDA runtime through ctypes, shaped as vLLM's
FlashAttention caches ((num_blocks, 2, block_size, heads, head_dim) per
layer, HND in memory: the order PdxConnector asks of vLLM). The prefill
side's four layer tensors are carved from one cudaMalloc at offsets (as
PyTorch's caching allocator hands them out); the decode side's are one
cudaMalloc each. The prefill worker announces an open send and says
each layer done (libpdx records the layer's event on the stream); the
decode worker receives; every block's bytes are compared. Exits 77
(skip) without a GPU.

    vllm_connector_gpu.py PATH-TO-pdx-agent PATH-TO-libcudart.so
"""
import ctypes
import os
import sys
import time
from types import SimpleNamespace

import cudart
from cudart import D2H, H2D

LAYERS, BLOCKS, BT, HEADS, DIM, ES = 4, 64, 16, 8, 128, 2
BLOCK = BT * HEADS * DIM * ES          # one of K or V of one block
TENSOR = BLOCKS * 2 * BLOCK            # one layer's cache



class DevTensor:
    """What register_kv_caches reads of a torch tensor."""

    def __init__(self, ptr):
        self.ptr, self.shape, self.device = ptr, (BLOCKS, 2, BT, HEADS, DIM), "cuda:0"

    def stride(self):  # HND: heads before tokens in memory
        return (2 * BT * HEADS * DIM, BT * HEADS * DIM, DIM, BT * DIM, 1)

    def element_size(self):
        return ES

    def data_ptr(self):
        return self.ptr


def main():
    agent, cudart_path = sys.argv[1], sys.argv[2]
    rt = cudart.open(cudart_path)
    malloc, copy = rt.malloc, rt.copy
    import pdx
    from pdx.vllm.meta import PdxMetadata, RecvMeta, SendMeta
    from pdx.vllm.worker import PdxWorker

    big = malloc(LAYERS * TENSOR + 4096)
    p_caches = {"model.layers.%d.self_attn.attn" % l:
                DevTensor(big + 4096 + l * TENSOR) for l in range(LAYERS)}
    d_caches = {"model.layers.%d.self_attn.attn" % l: DevTensor(malloc(TENSOR))
                for l in range(LAYERS)}
    pattern = os.urandom(LAYERS * TENSOR)
    buf = ctypes.create_string_buffer(pattern, len(pattern))
    copy(big + 4096, ctypes.addressof(buf), len(pattern), H2D)

    cfg = SimpleNamespace(kv_transfer_config=SimpleNamespace(
        kv_connector_extra_config={"agent_bin": agent,
                                   "xfer_timeout_ms": 10000}))
    P, D = PdxWorker(cfg, rank=0), PdxWorker(cfg, rank=0)
    failures = 0
    try:
        P.register_kv_caches(p_caches)
        D.register_kv_caches(d_caches)
        print("ok   both sides registered (the prefill side's tensors at "
              "offsets in one allocation)")
        src, dst = [3, 4, 5, 40], [10, 11, 12, 63]
        zero = ctypes.create_string_buffer(2 * BLOCK)
        for rnd in range(3):  # three passes: the event slots cycle
            # the blocks zeroed, so each pass's check sees its own bytes
            # (the pattern is the same every pass)
            for name in d_caches:
                for d in dst:
                    copy(d_caches[name].ptr + d * 2 * BLOCK,
                         ctypes.addressof(zero), 2 * BLOCK, H2D)
            x = pdx.XferId().hex
            D.start(PdxMetadata(recvs=[RecvMeta("r%d" % rnd, x,
                                                [P.peer_addr], dst, 0)]))
            P.start(PdxMetadata(sends=[SendMeta("r%d" % rnd, x, [], src)]))
            for name in p_caches:
                P.layer_saved(name)
            P.step_saved()
            end, got = time.monotonic() + 20, None
            while time.monotonic() < end and not got:
                got = D.finished(set())[1]
                time.sleep(0.01)
            sent = None
            while time.monotonic() < end and not sent:
                sent = P.finished({"r%d" % rnd})[0]
                time.sleep(0.01)
            ok = got == {"r%d" % rnd} and sent == {"r%d" % rnd} and \
                D.stats["failed"] == 0
            for l, name in enumerate(d_caches):
                for s, d in zip(src, dst):
                    out = ctypes.create_string_buffer(2 * BLOCK)
                    copy(ctypes.addressof(out),
                         d_caches[name].ptr + d * 2 * BLOCK, 2 * BLOCK, D2H)
                    want = pattern[l * TENSOR + s * 2 * BLOCK:
                                   l * TENSOR + (s + 1) * 2 * BLOCK]
                    ok = ok and out.raw == want
            print(("ok   " if ok else "FAIL ") +
                  "pass %d: every block of every layer arrived byte for "
                  "byte (%s)" % (rnd, dict(D.stats)))
            failures += not ok
    finally:
        P.close()
        D.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
