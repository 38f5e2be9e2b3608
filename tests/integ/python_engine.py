#!/usr/bin/python3
"""python_engine: two engines written in Python from docs/protocol.md alone
(pyzmq + msgpack, no pdx code: see pypeer.py), driving two real
pdx-agents: register, a layer-wise transfer checked byte for byte, a
pull, an abort, and a refused layout.

    python_engine.py PATH-TO-pdx-agent

Exits 0 (pass), 1 (fail) or 77 (skip: pyzmq or msgpack missing).
"""
import os
import random
import sys
import time

from pypeer import (BLOCKS, BLOCK_BYTES, LAYERS, TENSORS, Rig, block_at,
                    check, exit_code, layout, same_blocks)


def main():
    with Rig(sys.argv[1], "py", "PD") as rig:
        P, D = rig.engines
        addrs = dict(zip("PD", rig.register()))

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
        check(same_blocks(P.shm.buf, src, D.shm.buf, dst),
              "every byte of every block arrived")

        # a pull (docs/protocol.md, "Pull"): the decode agent reads the
        # blocks once every layer is computed
        P.shm.buf[:] = os.urandom(P.shm.size)
        xfer = os.urandom(16)
        D.send({"op": "recv", "xfer": xfer, "peer": addrs["P"], "blocks": dst,
                "pull": True})
        P.send({"op": "send", "xfer": xfer, "peer": addrs["D"], "blocks": src})
        D.shm.buf[:] = bytes(D.shm.size)
        for layer in [3, 1, 0]:
            P.send({"op": "layer_done", "layer": layer, "xfers": [xfer]})
        time.sleep(0.3)  # a push would have written those layers by now
        check(all(block_at(D.shm.buf, l, t, b) == bytes(BLOCK_BYTES)
                  for l in range(LAYERS) for t in range(TENSORS)
                  for b in dst),
              "a pull moves nothing while a layer is not computed")
        P.send({"op": "layer_done", "layer": 2, "xfers": [xfer]})
        got_d, got_p = D.event(xfer), P.event(xfer)
        check(got_d is not None and got_d["kind"] == "received" and
              got_d["bytes"] == want and got_p is not None and
              got_p["kind"] == "sent" and got_p["bytes"] == want,
              f"a pull: received and sent, {want} bytes: {got_d} {got_p}")
        check(same_blocks(P.shm.buf, src, D.shm.buf, dst),
              "every byte of every pulled block arrived")

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
        check(rig.agents_run(), "both agents still run")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
