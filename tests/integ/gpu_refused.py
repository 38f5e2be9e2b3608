#!/usr/bin/python3
"""gpu_refused: what an agent says about GPU memory it cannot use, on a
machine without a GPU (or with a handle that opens nothing): a GPU region
is refused with a reason naming CUDA, "layer computed" events without GPU
regions are refused, and a GPU data path forced on host memory refuses
the handshake, so the transfer fails with that reason on both sides.
Engines written in Python from docs/protocol.md (pypeer.py).

    gpu_refused.py PATH-TO-pdx-agent

Exits 0 (pass), 1 (fail) or 77 (skip: pyzmq or msgpack missing).
"""
import os
import sys

from pypeer import LAYERS, Rig, check, exit_code, layout


def main():
    with Rig(sys.argv[1], "gpu", "PD", ("--data-path", "staged")) as rig:
        P, D = rig.engines
        # a cudaIpcMemHandle_t of zeros opens nothing anywhere
        P.send({"op": "register", "v": 1, "layout": layout(),
                "regions": [{"type": "cuda", "size": P.shm.size,
                             "ipc": bytes(64), "device": 0}]})
        reply = P.recv(10000)
        check(reply is not None and reply.get("op") == "error" and
              "cuda" in reply.get("reason", "").lower(),
              f"a GPU region that cannot be opened is refused, naming CUDA: {reply}")

        D.send({"op": "register", "v": 1, "layout": layout(),
                "regions": [{"type": "shm", "name": "/" + D.shm.name,
                             "size": D.shm.size}],
                "cuda_event_slots": 1, "cuda_events": [bytes(64)] * LAYERS})
        reply = D.recv(10000)
        check(reply is not None and reply.get("op") == "error" and
              "cuda_events" in reply.get("reason", ""),
              f"events without GPU regions are refused: {reply}")

        addrs = dict(zip("PD", rig.register()))
        xfer = os.urandom(16)
        D.send({"op": "recv", "xfer": xfer, "peer": addrs["P"], "blocks": [1, 2]})
        P.send({"op": "send", "xfer": xfer, "peer": addrs["D"], "blocks": [3, 4]})
        for layer in range(LAYERS):
            P.send({"op": "layer_done", "layer": layer, "xfers": [xfer]})
        for side, e in zip("PD", rig.engines):
            ev = e.event(xfer, 8000)
            check(ev is not None and ev["kind"] == "failed" and
                  "GPU memory" in ev["reason"],
                  f"{side}: a GPU path forced on host memory fails the transfer, saying why: {ev}")
        check(rig.agents_run(), "both agents still run")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
