#!/usr/bin/python3
"""python_engine: two engines written in Python from docs/protocol.md alone
(pyzmq + msgpack, no pdx code), driving two real pdx-agents: register, a
layer-wise transfer checked byte for byte, an abort, and a refused layout.

    python_engine.py PATH-TO-pdx-agent

Exits 0 (pass), 1 (fail) or 77 (skip: pyzmq or msgpack missing).
"""
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

try:
    import msgpack
    import zmq
    from multiprocessing import shared_memory
except ImportError as e:
    print(f"# skip: {e}")
    sys.exit(77)

LAYERS, TENSORS, BLOCKS = 4, 2, 64
BLOCK_TOKENS, KV_HEADS, HEAD_DIM, DTYPE = 4, 2, 16, 2
BLOCK_BYTES = BLOCK_TOKENS * KV_HEADS * HEAD_DIM * DTYPE
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failures += 0 if ok else 1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def layout(head_dim=HEAD_DIM):
    """Layer-major: K then V of each layer, one region."""
    bb = BLOCK_TOKENS * KV_HEADS * head_dim * DTYPE
    return {
        "layers": LAYERS, "tensors": TENSORS, "blocks": BLOCKS,
        "block_tokens": BLOCK_TOKENS, "kv_heads": KV_HEADS,
        "head_dim": head_dim, "dtype_bytes": DTYPE, "order": "NHD",
        "bases": [[[0, (TENSORS * l + t) * BLOCKS * bb] for t in range(TENSORS)]
                  for l in range(LAYERS)],
        "strides": [bb] * LAYERS,
    }


def block_at(buf, layer, tensor, block):
    off = (TENSORS * layer + tensor) * BLOCKS * BLOCK_BYTES + block * BLOCK_BYTES
    return buf[off:off + BLOCK_BYTES]


class Engine:
    """One engine: a KV pool in POSIX shared memory and a DEALER to its agent."""

    def __init__(self, ctx, name, agent_addr):
        self.shm = shared_memory.SharedMemory(
            create=True, size=LAYERS * TENSORS * BLOCKS * BLOCK_BYTES, name=name)
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(agent_addr)

    def send(self, msg):
        self.sock.send(msgpack.packb(msg, use_bin_type=True))

    def recv(self, timeout_ms):
        if not self.sock.poll(timeout_ms):
            return None
        return msgpack.unpackb(self.sock.recv(), raw=False)

    def register(self, lay):
        deadline = time.time() + 10
        while time.time() < deadline:
            self.send({"op": "register", "v": 1, "layout": lay,
                       "regions": [{"type": "shm", "name": "/" + self.shm.name,
                                    "size": self.shm.size}]})
            reply = self.recv(1000)
            if reply is not None:
                return reply
        return None

    def event(self, xfer, timeout_ms=5000):
        deadline = time.time() + timeout_ms / 1000
        while time.time() < deadline:
            ev = self.recv(100)
            if ev and ev.get("op") == "event" and ev.get("xfer") == xfer:
                return ev
        return None

    def close(self):
        self.sock.close()
        self.shm.close()
        self.shm.unlink()


def main():
    agent_bin = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="pdx-py-")
    env = dict(os.environ, UCX_TLS="sm,self", UCX_WARN_UNUSED_ENV_VARS="n")
    agents, engines = [], []
    ctx = zmq.Context()
    try:
        addrs = {}
        for side in "PD":
            eng = f"ipc://{tmp}/{side}.engine"
            agents.append(subprocess.Popen(
                [agent_bin, "--engine", eng, "--listen",
                 f"tcp://127.0.0.1:{free_port()}", "--xfer-timeout-ms", "5000"],
                env=env, stdout=subprocess.DEVNULL))
            engines.append(Engine(ctx, f"pdx-py-{os.getpid()}-{side}", eng))
        P, D = engines
        for side, e in zip("PD", engines):
            reply = e.register(layout())
            check(reply is not None and reply.get("op") == "registered",
                  f"{side} engine registers: {reply}")
            addrs[side] = reply["peer"]

        # a layer-wise transfer of 6 scattered blocks, layers out of order
        src = random.sample(range(BLOCKS), 6)
        dst = random.sample(range(BLOCKS), 6)
        P.shm.buf[:] = os.urandom(P.shm.size)
        xfer = os.urandom(16)
        D.send({"op": "recv", "xfer": xfer, "peer": addrs["P"], "blocks": dst})
        P.send({"op": "send", "xfer": xfer, "peer": addrs["D"], "blocks": src})
        for layer in [2, 0, 3, 1]:
            P.send({"op": "layer_done", "layer": layer, "xfers": [xfer]})
        got_d, got_p = D.event(xfer), P.event(xfer)
        want = LAYERS * TENSORS * len(src) * BLOCK_BYTES
        check(got_d is not None and got_d["kind"] == "received" and
              got_d["bytes"] == want and got_d["status"] == 0,
              f"decode engine: received, {want} bytes: {got_d}")
        check(got_p is not None and got_p["kind"] == "sent",
              f"prefill engine: sent: {got_p}")
        same = all(bytes(block_at(P.shm.buf, l, t, s)) ==
                   bytes(block_at(D.shm.buf, l, t, d))
                   for l in range(LAYERS) for t in range(TENSORS)
                   for s, d in zip(src, dst))
        check(same, "every byte of every block arrived")

        # abort from the decode engine reaches the prefill side
        xfer = os.urandom(16)
        D.send({"op": "recv", "xfer": xfer, "peer": addrs["P"], "blocks": dst})
        P.send({"op": "send", "xfer": xfer, "peer": addrs["D"], "blocks": src})
        D.send({"op": "abort", "xfer": xfer})
        got_d, got_p = D.event(xfer), P.event(xfer)
        check(got_d is not None and got_d["kind"] == "failed" and
              "abort" in got_d["reason"], f"aborter gets failed: {got_d}")
        check(got_p is not None and got_p["kind"] == "failed",
              f"the other side gets failed: {got_p}")

        # malformed input gets an error, not a crash
        P.sock.send(b"\xc1 not msgpack")
        reply = P.recv(2000)
        check(reply is not None and reply.get("op") == "error",
              f"malformed message answered with error: {reply}")
        reply = D.register(layout() | {"blocks": BLOCKS * 100})
        check(reply is not None and reply.get("op") == "error" and
              reply["status"] < 0, f"a layout past the region is refused: {reply}")
        check(all(a.poll() is None for a in agents), "both agents still run")
    finally:
        for e in engines:
            e.close()
        for a in agents:
            a.terminate()
        for a in agents:
            try:
                rc = a.wait(10)
            except subprocess.TimeoutExpired:
                a.kill()
                rc = a.wait()
            check(rc == 0, f"agent exits cleanly ({rc})")
        ctx.term()
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
