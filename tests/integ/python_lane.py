#!/usr/bin/python3
"""python_lane: the engine link's direct lane (docs/protocol.md, "The
direct lane") taken by engines written in Python from the docs alone
(pypeer.py), against real pdx-agents: a transfer whose messages and events
all go on the lanes, checked byte for byte; a connection with the wrong
token closed; a register sent again keeping its lane; a lane the engine
closes, after which the link goes by ZeroMQ again; and no lane offered
under --engine-direct off.

    python_lane.py PATH-TO-pdx-agent

Exits 0 (pass), 1 (fail) or 77 (skip: pyzmq or msgpack missing).
"""
import os
import random
import socket
import sys
import time

from pypeer import (BLOCKS, BLOCK_BYTES, LAYERS, TENSORS, Rig, check,
                    exit_code, pack, same_blocks)


def transfer(P, D, addrs, what):
    """One layer-wise transfer of 5 scattered blocks, checked."""
    src = random.sample(range(BLOCKS), 5)
    dst = random.sample(range(BLOCKS), 5)
    P.shm.buf[:] = os.urandom(P.shm.size)
    xfer = os.urandom(16)
    D.send({"op": "recv", "xfer": xfer, "peer": addrs["P"], "blocks": dst})
    P.send({"op": "send", "xfer": xfer, "peer": addrs["D"], "blocks": src})
    for layer in range(LAYERS):
        P.send({"op": "layer_done", "layer": layer, "xfers": [xfer]})
    got_d, got_p = D.event(xfer), P.event(xfer)
    want = LAYERS * TENSORS * len(src) * BLOCK_BYTES
    check(got_d is not None and got_d["kind"] == "received" and
          got_d["bytes"] == want and got_p is not None and
          got_p["kind"] == "sent", f"{what}: received and sent: {got_d} {got_p}")
    check(same_blocks(P.shm.buf, src, D.shm.buf, dst),
          f"{what}: every byte of every block arrived")


def main():
    agent = sys.argv[1]
    with Rig(agent, "lane", "PD") as rig:
        addrs, answers = {}, {}
        P, D = rig.engines
        for side, e in zip("PD", rig.engines):
            answers[side] = e.register()
            addrs[side] = answers[side]["peer"]
        check(all("direct" in a and len(a["direct_token"]) == 16
                  for a in answers.values()),
              f"each registered answer offers a lane: {answers}")

        # a stranger with a wrong token: closed, and the offer still good
        stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stranger.connect("\0" + answers["P"]["direct"])
        hello = pack({"op": "direct", "token": bytes(16)})
        stranger.sendall(len(hello).to_bytes(4, "big") + hello)
        stranger.settimeout(3)
        try:
            closed = stranger.recv(1) == b""
        except OSError:
            closed = False
        stranger.close()
        check(closed, "a connection with the wrong token is closed")

        for side, e in zip("PD", rig.engines):
            check(e.take_lane(answers[side]) is not None,
                  f"{side} engine takes its lane")
        transfer(P, D, addrs, "on the lanes")
        check(not P.sock.poll(200) and not D.sock.poll(0),
              "nothing more came on ZeroMQ once the lanes were taken")

        again = P.register()
        check(again is not None and again.get("op") == "registered" and
              "direct" not in again,
              f"a register sent again on the lane is answered there, no "
              f"new offer: {again}")
        transfer(P, D, addrs, "after registering again on the lane")

        # the engine closes its lane: the agent sends on ZeroMQ again
        P.lane.close()
        P.lane, P.lane_in = None, b""
        time.sleep(0.3)  # the agent sees the lane end
        transfer(P, D, addrs, "after the prefill engine closed its lane")
        check(rig.agents_run(), "both agents still run")

    with Rig(agent, "nolane", "P", agent_args=["--engine-direct", "off"]) as rig:
        answer = rig.engines[0].register()
        check(answer is not None and answer.get("op") == "registered" and
              "direct" not in answer,
              f"--engine-direct off: no lane offered: {answer}")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
