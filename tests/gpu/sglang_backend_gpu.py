#!/usr/bin/python3
"""pdx.sglang with SGLang's KV pool in GPU memory, no torch: device memory
from the CUDA runtime through ctypes, laid out as SGLang's MHA pool (a K
buffer per layer, then a V buffer per layer, page p of a buffer at p *
item_len; get_contiguous_buf_infos). The prefill side's buffers are
carved from one cudaMalloc (as SGLang's pool allocates them), the decode
side's are one cudaMalloc each; the aux rows (output_ids, bootstrap_room)
stay in host memory, as SGLang's MetadataBuffers are. In SGLang's order
(prefill.py / decode.py): bootstrap server, both managers, receiver init
and send_metadata, sender init and send of every page (each layer done
on the current stream: libpdx records the layer's event, no
synchronize), both polled to Success; every page of every buffer is
compared byte for byte, and the first token and the room land in the
decode side's aux rows. Three rooms, so the event slots cycle. Exits 77
(skip) without a GPU.

    sglang_backend_gpu.py PATH-TO-pdx-agent PATH-TO-libcudart.so
"""
import ctypes
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import cudart
from cudart import D2H, H2D

LAYERS, PAGES, PAGE, HEADS, DIM, ES = 4, 64, 16, 8, 128, 2
ITEM = PAGE * HEADS * DIM * ES   # one page of one buffer
BUF = PAGES * ITEM               # one layer's K (or V) buffer
ROWS = 8                         # aux rows



def free_port():
    """A free loopback port below the kernel's ephemeral range
    (scripts/free-ports says why)."""
    return int(subprocess.check_output([sys.executable, os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
        "free-ports")]))


def main():
    agent, cudart_path = sys.argv[1], sys.argv[2]
    rt = cudart.open(cudart_path)
    malloc, copy = rt.malloc, rt.copy
    os.environ.update(PDX_SGLANG_AGENT_BIN=agent,
                      PDX_SGLANG_TOKEN="%d,%d,%d" % (HEADS, DIM, ES),
                      PDX_SGLANG_XFER_TIMEOUT_MS="10000")
    import pdx.sglang
    from pdx.sglang import KVArgs, KVPoll

    def kv_args(bufs, aux):
        a = KVArgs()
        a.kv_data_ptrs, a.kv_data_lens = bufs, [BUF] * len(bufs)
        a.kv_item_lens, a.page_size = [ITEM] * len(bufs), PAGE
        a.aux_data_ptrs = [ctypes.addressof(b) for b in aux]
        a.aux_data_lens = [ctypes.sizeof(b) for b in aux]
        a.aux_item_lens = [ctypes.sizeof(b) // ROWS for b in aux]
        return a

    def aux_rows():   # output_ids (int32 x 16), bootstrap_room (uint64)
        return [(ctypes.c_int32 * (16 * ROWS))(),
                (ctypes.c_uint64 * ROWS)()]

    big = malloc(2 * LAYERS * BUF + 4096)
    p_bufs = [big + 4096 + i * BUF for i in range(2 * LAYERS)]
    d_bufs = [malloc(BUF) for _ in range(2 * LAYERS)]
    pattern = os.urandom(2 * LAYERS * BUF)
    host = ctypes.create_string_buffer(pattern, len(pattern))
    copy(p_bufs[0], ctypes.addressof(host), len(pattern), H2D)
    p_aux, d_aux = aux_rows(), aux_rows()
    port = free_port()
    sa = SimpleNamespace(host="127.0.0.1", disaggregation_bootstrap_port=port,
                         tp_size=1, dp_size=1, pp_size=1,
                         enable_dp_attention=False)
    server = pdx.sglang.PdxKVBootstrapServer("127.0.0.1", port)
    P = pdx.sglang.PdxKVManager(kv_args(p_bufs, p_aux), "prefill", sa)
    D = pdx.sglang.PdxKVManager(kv_args(d_bufs, d_aux), "decode", sa)
    addr = "127.0.0.1:%d" % port
    failures = 0
    try:
        ok = P.cuda and D.cuda
        print(("ok   " if ok else "FAIL ") + "both managers registered "
              "their pools as GPU memory (CUDA IPC regions)")
        failures += not ok
        src, dst = [3, 4, 5, 40], [10, 11, 12, 63]
        zero = ctypes.create_string_buffer(ITEM)
        for rnd in range(3):
            # the pages zeroed, so each room's check sees its own bytes
            # (the pattern is the same every room)
            for b in range(2 * LAYERS):
                for d in dst:
                    copy(d_bufs[b] + d * ITEM, ctypes.addressof(zero), ITEM,
                         H2D)
            room, row = 1000 + rnd, rnd
            recv = pdx.sglang.PdxKVReceiver(D, addr, room)
            send = pdx.sglang.PdxKVSender(P, addr, room)
            end = time.monotonic() + 20
            while not D.try_ensure_parallel_info(addr):
                assert time.monotonic() < end, "bootstrap server not ready"
                time.sleep(0.01)
            recv.init(0)
            while recv.poll() == KVPoll.Bootstrapping:
                assert time.monotonic() < end, "receiver not bootstrapped"
                time.sleep(0.01)
            recv.send_metadata(dst, row)
            p_aux[0][16 * row] = 500 + rnd   # the first token, set_buf
            send.init(len(src), row)
            send.send(src)
            states = None
            while time.monotonic() < end:
                states = (send.poll(), recv.poll())
                if all(s in (KVPoll.Success, KVPoll.Failed) for s in states):
                    break
                time.sleep(0.01)
            ok = states == (KVPoll.Success, KVPoll.Success)
            for b in range(2 * LAYERS):
                for s, d in zip(src, dst):
                    out = ctypes.create_string_buffer(ITEM)
                    copy(ctypes.addressof(out), d_bufs[b] + d * ITEM, ITEM,
                         D2H)
                    want = pattern[b * BUF + s * ITEM:b * BUF + (s + 1) * ITEM]
                    ok = ok and out.raw == want
            ok = ok and d_aux[0][16 * row] == 500 + rnd and \
                d_aux[1][row] == room
            print(("ok   " if ok else "FAIL ") +
                  "room %d: every page of every layer arrived byte for byte,"
                  " the first token and the room in the aux rows (%s%s)"
                  % (room, states, "" if ok else ": " + send.reason +
                     recv.reason))
            failures += not ok
            send.clear()
            recv.clear()
    finally:
        P.close()
        D.close()
        server.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
