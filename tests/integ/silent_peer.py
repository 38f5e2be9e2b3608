#!/usr/bin/python3
"""silent_peer: over TCP (the put lane), one of two pdx-agents, A (the
sender) or B (the receiver), is stopped (SIGSTOP) past the other's
--peer-timeout-ms while a transfer between them waits: the other finds
it silent, fails that transfer and cuts its UCX endpoint to it
(docs/protocol.md, "Endpoints and their numbers"). Resumed, the stopped
one takes the other's new hello. The next transfers, pushed and pulled,
arrive byte-exact. Likewise with no transfer, stopped twice the bound:
the other drops the handshake and then forgets the stopped one, its
worker address with it, so its next hello says no number: the stopped
one's answer says its own, lower, and a second hello tells it the new
one (a reviewer's find: the next transfer timed out).

UCX 1.13 pairs two workers' endpoints by number (each side's k-th made
to the other with the other's k-th). The side that cut made its next
one numbered one higher; the stopped side kept its own, paired with the
closed one: B stopped, its first pull after read nothing and timed out
("timed out after 5000 ms reading the sender's blocks"), until B found
its endpoint stuck and made another. A hello now says the number of the
sender's endpoint, and the one behind makes its own anew at that
number.

    silent_peer.py PATH-TO-pdx-agent

Exits 0 (pass), 1 (fail) or 77 (skip: pyzmq or msgpack missing).
"""
import os
import random
import signal
import sys
import time

from pypeer import BLOCKS, LAYERS, Rig, check, exit_code, same_blocks

ARGS = ("--data-path", "put", "--heartbeat-ms", "200",
        "--peer-timeout-ms", "1000")


def transfer(A, B, peers, pull, wait_ms=8000):
    """One transfer of 3 random blocks from A to B: its events."""
    src = random.sample(range(BLOCKS), 3)
    dst = random.sample(range(BLOCKS), 3)
    A.shm.buf[:] = os.urandom(A.shm.size)
    x = os.urandom(16)
    B.send({"op": "recv", "xfer": x, "peer": peers["A"], "blocks": dst,
            "pull": pull})
    A.send({"op": "send", "xfer": x, "peer": peers["B"], "blocks": src})
    for layer in range(LAYERS):
        A.send({"op": "layer_done", "layer": layer, "xfers": [x]})
    ev = B.event(x, wait_ms)
    exact = same_blocks(A.shm.buf, src, B.shm.buf, dst)
    return ev, A.event(x, 3000), exact


def stalled(rig, peers, side):
    """A transfer announced on both sides, its layers not computed yet,
    while `side`'s agent is stopped past the other's silence bound: the
    other fails it. Both engines hear of it."""
    A, B = rig.engines
    x = os.urandom(16)
    B.send({"op": "recv", "xfer": x, "peer": peers["A"], "blocks": [2]})
    A.send({"op": "send", "xfer": x, "peer": peers["B"], "blocks": [6]})
    time.sleep(0.3)  # the want is taken: heartbeats go both ways
    pid = rig.agents["AB".index(side)].pid
    other = B if side == "A" else A
    os.kill(pid, signal.SIGSTOP)
    try:
        # until the other finds it silent (the bound, 1 s) and fails the
        # transfer: its engine hears (at most 5 s)
        other.event(x, 5000)
    finally:
        os.kill(pid, signal.SIGCONT)
    for layer in range(LAYERS):
        A.send({"op": "layer_done", "layer": layer, "xfers": [x]})
    eb, ea = B.event(x, 5000), A.event(x, 5000)
    check(eb is not None and eb.get("kind") == "failed" and
          ea is not None and ea.get("kind") == "failed",
          f"{side} stopped: the transfer it stalled fails on both sides: "
          f"{eb and eb.get('reason')} / {ea and ea.get('reason')}")


def idle(rig, side):
    """No transfer in flight: `side`'s agent stopped past twice the
    other's silence bound. The other drops the handshake (cuts its UCX
    endpoint) and then forgets the peer, its worker address with it: its
    next hello says no "ucx_ep", and the stopped side learns the new
    number only from a hello sent after the other heard its answer."""
    pid = rig.agents["AB".index(side)].pid
    time.sleep(0.5)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(2.2)
    finally:
        os.kill(pid, signal.SIGCONT)
    time.sleep(0.3)


def case(agent, side, pull, idle_stop, after):
    """One rig: a first transfer, `side` stopped (idle_stop: idle until
    forgotten, else while a transfer waits), then `after` transfers, each
    byte-exact, pushed or pulled."""
    with Rig(agent, "silent", "AB", agent_args=ARGS, tls="tcp,self") as rig:
        peers = dict(zip("AB", rig.register()))
        A, B = rig.engines
        what = (f"{side} stopped{' idle (forgotten)' if idle_stop else ''}, "
                f"then {'pulled' if pull else 'pushed'}")
        ev, _, exact = transfer(A, B, peers, pull)
        check(ev is not None and ev.get("kind") == "received" and exact,
              f"{what}: a first transfer: {ev}")
        if idle_stop:
            idle(rig, side)
        else:
            stalled(rig, peers, side)
        for i in range(after):
            t0 = time.monotonic()
            ev, ea, exact = transfer(A, B, peers, pull)
            check(ev is not None and ev.get("kind") == "received" and
                  ea is not None and ea.get("kind") == "sent" and exact,
                  f"{what}: transfer {i} after arrives byte-exact "
                  f"({time.monotonic() - t0:.2f} s): "
                  f"{ev and ev.get('kind')} {ev and ev.get('reason')}"
                  f" / {ea and ea.get('kind')}")


def main():
    for idle_stop, after in ((True, 1), (False, 3)):
        for side in "BA":
            for pull in (True, False):
                case(sys.argv[1], side, pull, idle_stop, after)
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
