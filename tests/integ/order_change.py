#!/usr/bin/python3
"""order_change: blocks converted between the two orders (docs/protocol.md,
"Converting the order"), and a prefill engine that registers again in
the other order while a decode agent's want is on its way.

P's engine registers HND, D's NHD, over the am lane (where the decode
side's idea of the conversion decides which data messages it takes): a
transfer arrives converted, byte for byte. Then D's agent is stopped
(SIGSTOP) while its engine posts the next receive, and P's engine
registers again, NHD now, and sends. D's want goes to P's old instance
(HND) and is refused as stale; D asks again of the new one. Before, D
kept the all-heads slice it chose against HND, P pushed whole blocks
(the orders now agree), D dropped every one, and the transfer timed out
on D while P said "sent" (so it did on 007f8dc, every run here: D's
agent, resumed, takes its engine's receive before P's new hello). Now
both decide again: it arrives unconverted, byte for byte.

    order_change.py PATH-TO-pdx-agent

Exits 0 (pass), 1 (fail) or 77 (skip: pyzmq or msgpack missing).
"""
import os
import random
import signal
import sys
import time

import pypeer
from pypeer import (BLOCK_BYTES, BLOCK_TOKENS, BLOCKS, DTYPE, HEAD_DIM,
                    KV_HEADS, LAYERS, TENSORS, Rig, check, exit_code, layout)

HEAD = HEAD_DIM * DTYPE


def failures():
    return pypeer.failures


def where(layer, tensor, block):
    """layout()'s: layer-major, K then V, one region."""
    return ((TENSORS * layer + tensor) * BLOCKS + block) * BLOCK_BYTES


def fill(P, D, convert):
    """4 random blocks of P's, every layer and tensor, filled at random,
    D's 4 zeroed: (src, dst, what D's must hold after: P's bytes, read
    from HND into NHD when convert)."""
    src, dst = random.sample(range(BLOCKS), 4), random.sample(range(BLOCKS), 4)
    want = {}
    for l in range(LAYERS):
        for t in range(TENSORS):
            for s, d in zip(src, dst):
                b = os.urandom(BLOCK_BYTES)
                P.shm.buf[where(l, t, s):where(l, t, s) + BLOCK_BYTES] = b
                D.shm.buf[where(l, t, d):where(l, t, d) + BLOCK_BYTES] = \
                    bytes(BLOCK_BYTES)
                # head h of token tok: at (h, tok) in HND, (tok, h) in NHD
                want[l, t, d] = b if not convert else b"".join(
                    b[(h * BLOCK_TOKENS + tok) * HEAD:][:HEAD]
                    for tok in range(BLOCK_TOKENS) for h in range(KV_HEADS))
    return src, dst, want


def send(P, x, aD, src):
    P.send({"op": "send", "xfer": x, "peer": aD, "blocks": src})
    for l in range(LAYERS):
        P.send({"op": "layer_done", "layer": l, "xfers": [x]})


def arrived(D, want):
    return all(bytes(D.shm.buf[where(l, t, d):where(l, t, d) + BLOCK_BYTES])
               == b for (l, t, d), b in want.items())


def outcome(D, P, x, what):
    ed, ep = D.event(x, 9000), P.event(x, 9000)
    check(ed is not None and ep is not None and
          (ed["kind"], ep["kind"]) == ("received", "sent"),
          f"{what}: received and sent: "
          f"{ed and (ed['kind'], ed.get('reason'))}, "
          f"{ep and (ep['kind'], ep.get('reason'))}")


def main():
    with Rig(sys.argv[1], "order", "PD",
             agent_args=("--data-path", "am")) as rig:
        P, D = rig.engines
        rp, rd = P.register(layout() | {"order": "HND"}), D.register()
        check(rp is not None and rd is not None and
              rp.get("op") == rd.get("op") == "registered",
              f"P registers HND, D NHD: {rp}, {rd}")
        if failures():
            return exit_code()
        aP, aD = rp["peer"], rd["peer"]
        src, dst, want = fill(P, D, True)
        x = os.urandom(16)
        D.send({"op": "recv", "xfer": x, "peer": aP, "blocks": dst})
        send(P, x, aD, src)
        outcome(D, P, x, "HND -> NHD over am")
        check(arrived(D, want), "... every block converted, byte for byte")

        # D's want goes to P's HND instance while P registers NHD
        src, dst, want = fill(P, D, False)
        x = os.urandom(16)
        d_agent = rig.agents[1]
        os.kill(d_agent.pid, signal.SIGSTOP)
        try:
            D.send({"op": "recv", "xfer": x, "peer": aP, "blocks": dst})
            time.sleep(0.2)
            r = P.register()
            check(r is not None and r.get("op") == "registered",
                  f"P registers again, NHD: {r}")
            send(P, x, aD, src)
            # P's agent takes the send before D's renewed want comes
            # (else it refuses that want, as for a transfer unknown)
            time.sleep(1.0)
        finally:
            os.kill(d_agent.pid, signal.SIGCONT)
        outcome(D, P, x, "NHD -> NHD, D's want first sent to P's HND "
                "instance")
        check(arrived(D, want), "... every block as it was, byte for byte")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
