#!/usr/bin/python3
"""peer_hostile: what anyone who reaches a pdx-agent's --listen port
without CURVE can send it, from a peer written in Python (docs/protocol.md
section 2, docs/security.md): the agent lives on and goes on serving.

* A hello whose UCX worker address is garbage (a header of an unknown
  version, or shorter than a header) is refused with hello_nack; UCX
  aborted the agent on it (an assertion in ucp_address_unpack).
* Pings from thousands of made-up addresses each made a peer with a
  ZeroMQ socket of its own, and none went: once ZeroMQ's 1023 sockets
  were taken, a new agent's hello was never answered, nothing logged,
  and the descriptors stayed taken. Now idle peers make room; a peer
  with a transfer in flight is kept, and the transfer ends well.
* Peers no transfer names and that never shook hands are forgotten
  after a silence bound (--peer-timeout-ms): each kept its socket, and
  ZeroMQ went on reconnecting to it every 100 ms for the agent's life
  (an agent of a pod replaced elsewhere, an address that never
  answered).

    peer_hostile.py PATH-TO-pdx-agent

Exits 0 (pass), 1 (fail) or 77 (skip: pyzmq or msgpack missing).
"""
import os
import random
import sys
import time

from pypeer import (BLOCK_BYTES, LAYERS, TENSORS, Rig, check, exit_code,
                    free_port, pack, unpack, zmq)
from late_messages import Peer

FLOOD = 1500  # made-up addresses: past ZeroMQ's 1023 sockets


def main():
    with Rig(sys.argv[1], "hostile", "AB",
             ["--peer-timeout-ms", "60000"]) as rig:
        EA, _ = rig.engines
        A, B = rig.register()
        F = rig.adopt(Peer(rig.ctx, f"tcp://127.0.0.1:{free_port()}"))
        F.to(B, {"op": "ping", "hold": []})
        hello = F.expect("hello", sender=B)
        check(hello is not None and "ucx" in hello, "B's hello, for F to show")
        if hello is None:
            return

        for what, ucx in (("of version 9", b"\x09" + hello["ucx"][1:]),
                          ("of 5 bytes", hello["ucx"][:5]),
                          ("empty", b"")):
            G = rig.adopt(Peer(rig.ctx, f"tcp://127.0.0.1:{free_port()}"))
            G.to(A, dict(hello, op="hello", ucx=ucx,
                         instance=random.getrandbits(63)))
            nack = G.expect("hello_nack", sender=A)
            check(nack is not None and "ucx endpoint" in nack.get("reason", ""),
                  f"a hello with a UCX address {what} is refused: {nack}")
            check(rig.agents_run(), f"A lives on after a UCX address {what}")
            if not rig.agents_run():
                return

        stranger_answers(rig, A, hello)

        # F shakes hands and has a transfer to A in flight
        F.hello = dict(hello, instance=random.getrandbits(63), done_ucx=False)
        F.to(A, dict(F.hello, op="hello"))
        check(F.expect("hello_ack", sender=A) is not None, "A answers F's hello")
        x = os.urandom(16)
        EA.send({"op": "recv", "xfer": x, "peer": F.addr, "blocks": [1, 2, 3]})
        check(F.expect("want", x) is not None, "A asks F for its transfer")

        flood = rig.ctx.socket(zmq.DEALER)
        flood.setsockopt(zmq.LINGER, 0)
        rig.adopt(flood)
        flood.connect(A)
        for i in range(FLOOD):
            flood.send(pack({"op": "ping", "from":
                             f"tcp://127.0.0.{2 + i // 50000}:{1 + i % 50000}"}))
        # one connection's messages are read in order: a ping in F's name
        # after them is answered once A has read them all
        flood.send(pack({"op": "ping", "from": F.addr}))
        check(F.expect("pong", sender=A, ms=30000) is not None,
              f"A reads {FLOOD} pings from made-up addresses")
        # (ZeroMQ's reaper closes a socket's descriptors a little later)
        for _ in range(30):
            fds = len(os.listdir(f"/proc/{rig.agents[0].pid}/fd"))
            if fds < 800:
                break
            time.sleep(0.1)
        check(fds < 800, f"A holds {fds} descriptors after them, fewer than 800")

        N = rig.adopt(Peer(rig.ctx, f"tcp://127.0.0.1:{free_port()}"))
        N.to(A, dict(hello, op="hello", instance=random.getrandbits(63)))
        check(N.expect("hello_ack", sender=A) is not None,
              "a new agent's hello is answered after the flood")

        F.to(A, {"op": "done", "xfer": x, "am_bytes": 0, "first_token": 7,
                 "bytes": LAYERS * TENSORS * 3 * BLOCK_BYTES})
        ev = EA.event(x)
        check(ev is not None and ev["kind"] == "received",
              f"F's transfer in flight through the flood is received: {ev}")
        check(rig.agents_run(), "the agents run")
        time.sleep(0.1)


def stranger_answers(rig, A, hello):
    """A hello whose "from" A cannot reach is answered hello_nack
    "unreachable" over its own connection (docs/protocol.md), but a
    stranger learns nothing from it of what listens where: a hello A did
    not take gets no such word, and without CURVE the word does not say
    what A's connects met. (A bare hello naming a port of this host got
    "nothing listens there" or "no agent of ours listens there" at 2 s:
    a port scanner, a reviewer's find.)"""
    closed = f"tcp://127.0.0.1:{free_port()}"
    for what, msg in (("a bare hello", {"op": "hello"}),
                      ("a hello A takes", dict(hello, op="hello",
                                               instance=random.getrandbits(63)))):
        s = rig.adopt(rig.ctx.socket(zmq.DEALER))
        s.setsockopt(zmq.LINGER, 0)
        s.connect(A)
        s.send(pack(dict(msg, **{"from": closed})))
        got = unpack(s.recv()) if s.poll(3500) else None
        if what == "a bare hello":
            check(got is None, f"{what} naming {closed} gets no word on its "
                  f"connection: {got}")
        else:
            reason = (got or {}).get("reason", "")
            check(got is not None and got.get("op") == "hello_nack" and
                  got.get("unreachable") is True and closed in reason and
                  "listens" not in reason,
                  f"{what} naming {closed}: hello_nack unreachable, not "
                  f"saying what listens there: {got}")


def fds_of(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def idle_peers_go():
    with Rig(sys.argv[1], "idle", "A",
             ["--peer-timeout-ms", "1000", "--heartbeat-ms", "200"]) as rig:
        EA, = rig.engines
        A = EA.register().get("peer")
        pid = rig.agents[0].pid
        time.sleep(0.3)
        before = fds_of(pid)
        flood = rig.adopt(rig.ctx.socket(zmq.DEALER))
        flood.setsockopt(zmq.LINGER, 0)
        flood.connect(A)
        for i in range(300):
            flood.send(pack({"op": "ping",
                             "from": f"tcp://127.0.0.9:{1 + i}"}))
        grew = 0
        for _ in range(30):
            grew = max(grew, fds_of(pid) - before)
            if grew >= 250:
                break
            time.sleep(0.05)
        check(grew >= 250, f"300 made-up peers took {grew} descriptors")
        for _ in range(50):  # 1 s of silence, then a beat
            if fds_of(pid) - before < 20:
                break
            time.sleep(0.1)
        left = fds_of(pid) - before
        check(left < 20, f"{left} descriptors still held 5 s after 300 "
              "made-up peers went silent")
        check(rig.agents_run(), "the agent runs")


if __name__ == "__main__":
    main()
    idle_peers_go()
    sys.exit(exit_code())
