#!/usr/bin/python3
"""python_lane: the engine link's direct lane (docs/protocol.md, "The
direct lane") taken by engines written in Python from the docs alone
(pypeer.py), against real pdx-agents: a transfer whose messages and events
all go on the lanes, checked byte for byte; a connection with the wrong
token, a hello over its bound, or another user's (with the right token)
closed; a marker sent again on the lane ignored; a register sent again
keeping its lane; a lane the engine closes while its agent is stopped,
what it sent there read before what it sent on ZeroMQ after; an engine
displaced while its lane is full hearing so on ZeroMQ after the lane's
end; and no lane offered under --engine-direct off.

    python_lane.py PATH-TO-pdx-agent

Exits 0 (pass), 1 (fail) or 77 (skip: pyzmq or msgpack missing).
"""
import os
import random
import signal
import socket
import sys
import threading
import time

from pypeer import (BLOCKS, BLOCK_BYTES, LAYERS, TENSORS, Engine, Rig,
                    check, exit_code, pack, same_blocks)


def transfer(P, D, addrs, what, crossing_ok=False):
    """One layer-wise transfer of 5 scattered blocks, checked. crossing_ok:
    right after P registered again, D's agent may send its want before
    P's new hello reaches it, or P's engine may announce it after D's
    agent, meeting that hello, aborted it; such a transfer fails on both
    sides (docs/protocol.md, "want"), as a loaded machine showed, and
    then one more is tried."""
    src = random.sample(range(BLOCKS), 5)
    dst = random.sample(range(BLOCKS), 5)
    P.shm.buf[:] = os.urandom(P.shm.size)
    xfer = os.urandom(16)
    D.send({"op": "recv", "xfer": xfer, "peer": addrs["P"], "blocks": dst})
    P.send({"op": "send", "xfer": xfer, "peer": addrs["D"], "blocks": src})
    for layer in range(LAYERS):
        P.send({"op": "layer_done", "layer": layer, "xfers": [xfer]})
    got_d, got_p = D.event(xfer), P.event(xfer)
    if crossing_ok and got_p is not None and got_d is not None and \
            got_p["kind"] == got_d["kind"] == "failed" and \
            ("earlier instance" in got_p["reason"] or
             "peer restarted" in got_d["reason"]):
        print(f"{what}: the want crossed the new hello; once more")
        return transfer(P, D, addrs, what)
    want = LAYERS * TENSORS * len(src) * BLOCK_BYTES
    check(got_d is not None and got_d["kind"] == "received" and
          got_d["bytes"] == want and got_p is not None and
          got_p["kind"] == "sent", f"{what}: received and sent: {got_d} {got_p}")
    check(same_blocks(P.shm.buf, src, D.shm.buf, dst),
          f"{what}: every byte of every block arrived")


def closed_soon(conn, what):
    """conn is closed by the agent within 3 s."""
    conn.settimeout(3)
    try:
        closed = conn.recv(1) == b""
    except ConnectionResetError:  # closed with what we sent unread
        closed = True
    except OSError:
        closed = False
    conn.close()
    check(closed, what)


def as_nobody(name, token):
    """A connection to the lane from user nobody with the right token:
    whether the agent closed it (run in a child that drops to nobody)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        ok = b"0"
        try:
            os.setgid(65534)
            os.setuid(65534)
        except OSError:
            os._exit(0)  # "0": not run as nobody, not a pass
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            c.connect("\0" + name)
            hello = pack({"op": "direct", "token": token})
            c.sendall(len(hello).to_bytes(4, "big") + hello)
            c.settimeout(3)
            ok = b"1" if c.recv(1) == b"" else b"0"
        except TimeoutError:
            ok = b"0"  # kept open: not closed
        except (ConnectionResetError, BrokenPipeError):
            ok = b"1"
        os.write(w, ok)
        os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    return got == b"1"


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
        closed_soon(stranger, "a connection with the wrong token is closed")
        big = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        big.connect("\0" + answers["P"]["direct"])
        big.sendall((64 << 20).to_bytes(4, "big") + bytes(4096))
        closed_soon(big, "a connection whose first frame is over a hello's "
                    "bound is closed at once (nothing piles up)")
        if os.geteuid() == 0:
            check(as_nobody(answers["P"]["direct"], answers["P"]["direct_token"]),
                  "another user's connection is closed, even with the token")

        for side, e in zip("PD", rig.engines):
            check(e.take_lane(answers[side]) is not None,
                  f"{side} engine takes its lane")
        transfer(P, D, addrs, "on the lanes")
        check(not P.sock.poll(200) and not D.sock.poll(0),
              "nothing more came on ZeroMQ once the lanes were taken")

        P.send({"op": "direct"})  # a marker again, on the lane
        P.send({"op": "ping", "seq": 7})
        pong = P.recv(3000)
        check(rig.agents_run() and pong == {"op": "pong", "seq": 7},
              f"a marker sent again on the lane is ignored: {pong}")

        again = P.register()
        check(again is not None and again.get("op") == "registered" and
              "direct" not in again,
              f"a register sent again on the lane is answered there, no "
              f"new offer: {again}")
        transfer(P, D, addrs, "after registering again on the lane",
                 crossing_ok=True)

        # the engine announces on its lane and closes it while its agent
        # is stopped, then goes on on ZeroMQ: the agent reads the lane's
        # frames first, then ZeroMQ's
        src = random.sample(range(BLOCKS), 4)
        dst = random.sample(range(BLOCKS), 4)
        P.shm.buf[:] = os.urandom(P.shm.size)
        xfer = os.urandom(16)
        D.send({"op": "recv", "xfer": xfer, "peer": addrs["P"], "blocks": dst})
        os.kill(rig.agents[0].pid, signal.SIGSTOP)

        def announce():
            # more than the agent reads of a lane in one turn first (as
            # one write, in a thread: the stopped agent reads nothing), so
            # that the ZeroMQ messages below tend to come while the lane
            # still holds the send
            body = pack({"op": "layer_done", "layer": 0, "xfers": [bytes(16)]})
            P.lane.sendall((len(body).to_bytes(4, "big") + body) * 5500)
            P.send({"op": "send", "xfer": xfer, "peer": addrs["D"], "blocks": src})
            P.lane_drop()
            for layer in range(LAYERS):
                P.send({"op": "layer_done", "layer": layer, "xfers": [xfer]})

        P.lane.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        t = threading.Thread(target=announce)
        t.start()
        time.sleep(0.3)
        os.kill(rig.agents[0].pid, signal.SIGCONT)
        t.join()
        got_d, got_p = D.event(xfer), P.event(xfer)
        check(got_d is not None and got_d["kind"] == "received" and
              got_p is not None and got_p["kind"] == "sent" and
              same_blocks(P.shm.buf, src, D.shm.buf, dst),
              f"a send on the lane, the lane closed, its layers on ZeroMQ: "
              f"read in that order, moved byte for byte: {got_d} {got_p}")
        transfer(P, D, addrs, "after the prefill engine closed its lane")
        check(rig.agents_run(), "both agents still run")

    with Rig(agent, "leave", "P") as rig:
        # leaving a lane as the docs say: shut our side, read it to its
        # end: every answer the agent owed comes
        P = rig.engines[0]
        P.take_lane(P.register())
        for seq in range(20000):
            P.send({"op": "ping", "seq": seq})
        P.lane.shutdown(socket.SHUT_WR)
        pongs, end = 0, time.time() + 20
        while P.lane is not None and time.time() < end:
            m = P.recv(500)
            pongs += m is not None and m.get("op") == "pong"
        check(pongs == 20000 and P.lane is None,
              f"an engine that leaves its lane as the docs say gets every "
              f"answer first: {pongs} of 20000 pongs")
        P.send({"op": "ping", "seq": -1})
        check(P.recv(3000) == {"op": "pong", "seq": -1},
              "and goes on on ZeroMQ")

    with Rig(agent, "displace", "P") as rig:
        P = rig.engines[0]
        P.take_lane(P.register())
        for seq in range(20000):  # pongs P does not read: the lane fills
            P.send({"op": "ping", "seq": seq})
        time.sleep(0.3)
        Q = rig.adopt(Engine(rig.ctx, f"pdx-displace-{os.getpid()}-Q",
                             f"ipc://{rig.tmp}/P.engine"))
        answer = Q.register()
        check(answer is not None and answer.get("op") == "registered",
              f"a second engine registers with the agent: {answer}")
        seen, end = None, time.time() + 10
        while seen is None and time.time() < end:
            m = P.recv(500)
            if m is not None and m.get("op") == "displaced":
                seen = m
        check(seen is not None and P.lane is None,
              "the first engine, its lane full, reads the lane to its end "
              f"and then hears on ZeroMQ it was displaced: {seen}")

    with Rig(agent, "nolane", "P", agent_args=["--engine-direct", "off"]) as rig:
        answer = rig.engines[0].register()
        check(answer is not None and answer.get("op") == "registered" and
              "direct" not in answer,
              f"--engine-direct off: no lane offered: {answer}")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
