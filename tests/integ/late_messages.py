#!/usr/bin/python3
"""late_messages: duplicated, late and stray control messages on the peer
link of a real pdx-agent (A), sent by a peer written in Python (F) that
reads every answer A sends it (docs/protocol.md, sections 2 and
"Late messages").

F is a real handshaken peer of A: it gets a valid hello (a UCX worker
address, the layout, the regions) from a second real agent B by pinging
it ("a ping from an agent without a cached handshake ... the answerer
sends it a hello"), and presents that hello to A under its own address.
G does the same under a third address; H never shakes hands.

Checked: no crash (A exits 0 on SIGTERM at the end); the documented
`error` answers; no event reaches A's engine for a transfer it did not
announce, and no second event for one it did; transfers work afterwards
(one between F and A, and a real one between B and A, byte for byte); a
want naming an earlier instance of A (its `to_instance`) is refused,
nothing pushed, and the want again ("renewed") served; a renewed want for
a transfer A's engine did not announce is refused at once; an abort of a transfer A does not
know is answered `stopped` (nothing of it is being written); A's engine
that aborts a receive from F hears `failed` only once F said `stopped`
or `abort`.
F and G show B's hello without `done_ucx`, so A's `done` to them comes
on the peer link; once G's says `done_ucx`, it does not (it goes by UCX).

    late_messages.py PATH-TO-pdx-agent

Exits 0 (pass), 1 (fail) or 77 (skip: pyzmq or msgpack missing).
"""
import os
import random
import sys
import time

from pypeer import (BLOCKS, BLOCK_BYTES, LAYERS, TENSORS, Rig, check,
                    exit_code, free_port, pack, same_blocks, unpack, zmq)

LEASE_MS = 800


class Peer:
    """A peer written here: a ROUTER at its own address, a DEALER to each
    agent it talks to; every message is {"from": addr, ...}."""

    def __init__(self, ctx, addr):
        self.ctx, self.addr = ctx, addr
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(addr)
        self.dealers = {}
        self.kept = []
        self.hello = None  # what this peer shows in hello and hello_ack

    def to(self, agent, msg):
        if agent not in self.dealers:
            d = self.ctx.socket(zmq.DEALER)
            d.setsockopt(zmq.LINGER, 0)
            d.connect(agent)
            self.dealers[agent] = d
        self.dealers[agent].send(pack(dict(msg, **{"from": self.addr})))

    def expect(self, op, xfer=None, ms=3000, sender=None):
        """The next message with this op (and xfer) from sender, within
        ms; pings and pongs are answered or dropped, others kept."""
        for i, m in enumerate(self.kept):
            if m["op"] == op and (xfer is None or m.get("xfer") == xfer) and \
                    (sender is None or m["from"] == sender):
                return self.kept.pop(i)
        end = time.time() + ms / 1000
        while True:
            left = int((end - time.time()) * 1000)
            if left <= 0 or not self.router.poll(left):
                return None
            _, frame = self.router.recv_multipart()
            m = unpack(frame)
            if m["op"] == op and (xfer is None or m.get("xfer") == xfer) and \
                    (sender is None or m["from"] == sender):
                return m
            if m["op"] == "ping":
                self.to(m["from"], {"op": "pong"})
            elif m["op"] == "hello" and self.hello:
                # A marks a peer stale after a transfer with it timed out
                # (a lease, here) and greets it again: answer like an agent
                self.to(m["from"], dict(self.hello, op="hello_ack"))
            elif m["op"] != "pong":
                self.kept.append(m)

    def quiet(self, xfer, ms):
        """True when nothing about xfer arrives within ms."""
        end = time.time() + ms / 1000
        while time.time() < end:
            for m in self.kept:
                if m.get("xfer") == xfer:
                    return False
            self.expect("nothing", ms=50)
        return not any(m.get("xfer") == xfer for m in self.kept)

    def close(self):
        for d in self.dealers.values():
            d.close()
        self.router.close()


def xid():
    return os.urandom(16)


def main():
    # a long silence bound: F and G answer pings only while they read,
    # and no transfer here may end by silence
    with Rig(sys.argv[1], "late", "AB",
             ["--lease-ms", str(LEASE_MS), "--peer-timeout-ms", "60000"]) as rig:
        EA, EB = rig.engines
        A, B = rig.register()

        F, G, H = (rig.adopt(Peer(rig.ctx, f"tcp://127.0.0.1:{free_port()}"))
                   for _ in range(3))

        # B's hello, for F and G to show A
        F.to(B, {"op": "ping", "hold": []})
        hello = F.expect("hello", sender=B)
        check(hello is not None and "ucx" in hello,
              "a ping to an agent that does not know us brings its hello")
        # F and G read done off the peer link: no done_ucx (they have no
        # UCX worker of their own to take it)
        for P in (F, G):
            P.hello = dict(hello, instance=random.getrandbits(63),
                           done_ucx=False)
            P.to(A, dict(P.hello, op="hello"))
            ack = P.expect("hello_ack", sender=A)
            check(ack is not None and ack["from"] == A,
                  f"A answers {P.addr}'s hello with hello_ack")
        a_instance = ack["instance"]
        # An agent of protocol version 1 (all active messages on one id)
        # is refused, and told why.
        check(hello["v"] == 3, f"an agent's hello says protocol version 3: {hello['v']}")
        old = rig.adopt(Peer(rig.ctx, f"tcp://127.0.0.1:{free_port()}"))
        old.to(A, dict(hello, op="hello", v=1, instance=random.getrandbits(63)))
        nack = old.expect("hello_nack", sender=A)
        check(nack is not None and "protocol version 1 != 3" in nack.get("reason", ""),
              f"A refuses a hello of protocol version 1, saying why: {nack}")
        # a hello of this version missing a field: the nack names it
        bad = rig.adopt(Peer(rig.ctx, f"tcp://127.0.0.1:{free_port()}"))
        bad.to(A, {k: v for k, v in dict(hello, op="hello",
                   instance=random.getrandbits(63)).items() if k != "compat"})
        nack = bad.expect("hello_nack", sender=A)
        check(nack is not None and "compat missing" in nack.get("reason", ""),
              f"A refuses a hello without compat, naming it: {nack}")
        # A's own hello, for the receiver side of F's transfers
        P_blocks = [3, 4, 5]

        def recv_from_f(x, blocks=(10, 11, 12)):
            """A's engine announces a transfer from F; A asks F for it."""
            EA.send({"op": "recv", "xfer": x, "peer": F.addr, "blocks": list(blocks)})
            w = F.expect("want", x)
            check(w is not None and w["blocks"] == list(blocks),
                  f"A sends want to F for {x.hex()[:8]}")
            return w

        def done(P, x):
            P.to(A, {"op": "done", "xfer": x, "bytes": LAYERS * TENSORS * 3 * BLOCK_BYTES,
                     "am_bytes": 0, "first_token": 7})

        # 1. a transfer from F, then its "done" twice
        x1 = xid()
        recv_from_f(x1)
        done(F, x1)
        ev = EA.event(x1)
        check(ev is not None and ev["kind"] == "received" and ev["first_token"] == 7,
              f"done: A's engine gets received ({ev and ev['kind']})")
        done(F, x1)
        err = F.expect("error", x1)
        check(err is not None and err["reason"] == "unknown transfer",
              f"a duplicated done is answered error 'unknown transfer' ({err})")
        EA.pump(300)
        check(EA.n_events(x1) == 1, "no second event for a duplicated done")

        # 2. done for a transfer A's engine never announced
        x0 = xid()
        done(F, x0)
        err = F.expect("error", x0)
        check(err is not None and err["reason"] == "unknown transfer",
              "done for a transfer never announced: error 'unknown transfer'")
        EA.pump(300)
        check(EA.n_events(x0) == 0, "no event reaches A's engine for it")

        # 3. a stale done from another peer address, with and without a
        # handshake: refused, and the transfer (from F) goes on
        x2 = xid()
        recv_from_f(x2)
        done(G, x2)
        err = G.expect("error", x2)
        check(err is not None and err["reason"] == "unknown transfer",
              f"done from G for F's transfer: error to G ({err and err['reason']})")
        done(H, x2)
        err = H.expect("error", x2)
        check(err is not None and "no handshake" in err["reason"],
              f"done from H, no handshake: error to H ({err and err['reason']})")
        EA.pump(300)
        check(EA.n_events(x2) == 0, "no event for the others' done")
        done(F, x2)
        ev = EA.event(x2)
        check(ev is not None and ev["kind"] == "received",
              "F's own done then completes it")

        # 4. A sends to F; a want after the transfer completed
        x3 = xid()
        EA.send({"op": "send", "xfer": x3, "peer": F.addr, "blocks": P_blocks})
        for layer in range(LAYERS):
            EA.send({"op": "layer_done", "layer": layer, "xfers": [x3]})
        F.to(A, {"op": "want", "xfer": x3, "blocks": [20, 21, 22], "skip": 0,
                 "to_instance": a_instance})
        d = F.expect("done", x3)
        check(d is not None and d["bytes"] == LAYERS * TENSORS * 3 * BLOCK_BYTES,
              f"A pushes to F, its want naming A's instance, and sends done "
              f"({d and d['bytes']} bytes)")
        ev = EA.event(x3)
        check(ev is not None and ev["kind"] == "sent", "A's engine gets sent")
        F.to(A, {"op": "want", "xfer": x3, "blocks": [20, 21, 22], "skip": 0})
        err = F.expect("error", x3)
        check(err is not None and err["reason"].startswith("transfer ended here"),
              f"a want after the transfer completed: error ({err and err['reason']})")
        check(F.quiet(x3, 300), "and no second done")
        EA.pump(200)
        check(EA.n_events(x3) == 1, "no second event for it")

        # 4a. a want sent to an earlier instance of A (A restarted, or its
        # engine registered again, and A's hello with the new one crossed
        # the want): refused, saying to ask again; nothing is pushed for
        # it and A's engine's transfer goes on, served by the want that
        # follows naming A's instance ("renewed"); a stale want before the
        # announcement does not fail the announcement; a renewed want for
        # a transfer A's engine has not announced is refused at once, not
        # held for an announcement (it may be A's predecessor's)
        x3a = xid()
        EA.send({"op": "send", "xfer": x3a, "peer": F.addr, "blocks": P_blocks})
        for layer in range(LAYERS):
            EA.send({"op": "layer_done", "layer": layer, "xfers": [x3a]})
        F.to(A, {"op": "want", "xfer": x3a, "blocks": [20, 21, 22], "skip": 0,
                 "to_instance": a_instance ^ 1})
        err = F.expect("error", x3a)
        check(err is not None and "earlier instance" in err["reason"] and
              "want again" in err["reason"],
              f"a want to A's earlier instance: error ({err and err['reason']})")
        check(F.quiet(x3a, 150), "nothing is pushed for it, no done")
        check(EA.n_events(x3a) == 0, "and A's engine's transfer goes on")
        F.to(A, {"op": "want", "xfer": x3a, "blocks": [20, 21, 22], "skip": 0,
                 "to_instance": a_instance, "renewed": True})
        d = F.expect("done", x3a)
        ev = EA.event(x3a)
        check(d is not None and ev is not None and ev["kind"] == "sent",
              f"the want again, renewed, is served: done to F, sent ({ev})")
        x3c = xid()
        F.to(A, {"op": "want", "xfer": x3c, "blocks": [20, 21, 22], "skip": 0,
                 "to_instance": a_instance ^ 1})
        err = F.expect("error", x3c)
        EA.send({"op": "send", "xfer": x3c, "peer": F.addr, "blocks": P_blocks})
        for layer in range(LAYERS):
            EA.send({"op": "layer_done", "layer": layer, "xfers": [x3c]})
        EA.pump(150)
        check(err is not None and EA.n_events(x3c) == 0,
              "announced after such a want, it does not fail")
        F.to(A, {"op": "want", "xfer": x3c, "blocks": [20, 21, 22], "skip": 0,
                 "to_instance": a_instance, "renewed": True})
        ev = EA.event(x3c)
        check(F.expect("done", x3c) is not None and ev is not None and
              ev["kind"] == "sent", f"and the renewed want is served: {ev}")
        x3d = xid()
        t0 = time.time()
        F.to(A, {"op": "want", "xfer": x3d, "blocks": [20, 21, 22], "skip": 0,
                 "to_instance": a_instance, "renewed": True})
        err = F.expect("error", x3d)
        check(err is not None and "has not announced" in err["reason"] and
              time.time() - t0 < 2,
              f"a renewed want for a transfer A's engine has not announced: "
              f"error at once ({err and err['reason']})")

        # 4b. a peer whose hello says done_ucx: on the ipc lane A says
        # done by UCX, to the worker that hello names (B's, which knows
        # no such transfer and drops it), and not on the peer link
        G.hello = dict(hello, instance=random.getrandbits(63), done_ucx=True)
        G.to(A, dict(G.hello, op="hello"))
        check(G.expect("hello_ack", sender=A) is not None,
              "a hello with done_ucx is answered")
        x3b = xid()
        EA.send({"op": "send", "xfer": x3b, "peer": G.addr, "blocks": P_blocks})
        for layer in range(LAYERS):
            EA.send({"op": "layer_done", "layer": layer, "xfers": [x3b]})
        G.to(A, {"op": "want", "xfer": x3b, "blocks": [20, 21, 22], "skip": 0})
        ev = EA.event(x3b)
        check(ev is not None and ev["kind"] == "sent" and
              ev["bytes"] == LAYERS * TENSORS * 3 * BLOCK_BYTES,
              f"to a done_ucx peer: A's engine gets sent ({ev and ev['bytes']} bytes)")
        check(G.quiet(x3b, 300), "and no done on the peer link")

        # 5. a want after the lease expired
        x4 = xid()
        EA.send({"op": "send", "xfer": x4, "peer": F.addr, "blocks": P_blocks})
        for layer in range(LAYERS):
            EA.send({"op": "layer_done", "layer": layer, "xfers": [x4]})
        ev = EA.event(x4, LEASE_MS + 3000)
        check(ev is not None and ev["kind"] == "failed" and "lease expired" in ev["reason"],
              f"nobody asks: the lease expires ({ev and ev['reason']})")
        t0 = time.time()
        F.to(A, {"op": "want", "xfer": x4, "blocks": [20, 21, 22], "skip": 0})
        err = F.expect("error", x4)
        check(err is not None and "lease expired" in err["reason"] and
              time.time() - t0 < 1,
              f"a want after the lease: error at once ({err and err['reason']})")
        EA.pump(200)
        check(EA.n_events(x4) == 1, "no second event for it")

        # 6. abort for a transfer A never heard of: answered `stopped`
        # only (F's hello, B's, says `stops`: nothing of it is being
        # written), no event; when A's engine announces it later, it
        # fails at once
        x5 = xid()
        F.to(A, {"op": "abort", "xfer": x5, "reason": "gone"})
        check(F.expect("stopped", x5) is not None,
              "an abort for an unknown transfer is answered stopped")
        check(F.quiet(x5, 300), "and nothing else")
        EA.pump(100)
        check(EA.n_events(x5) == 0, "and reaches no engine")
        EA.send({"op": "recv", "xfer": x5, "peer": F.addr, "blocks": [30, 31]})
        ev = EA.event(x5, 1000)
        check(ev is not None and ev["kind"] == "failed" and
              "ended before this announcement of it" in ev["reason"],
              f"announced after it: fails at once ({ev and ev['reason']})")
        # again and again: the same reason, not one nested in the last
        for _ in range(2):
            EA.send({"op": "recv", "xfer": x5, "peer": F.addr, "blocks": [30, 31]})
        EA.pump(300)
        again = EA.events.get(x5, [])[1:]
        check(len(again) == 2 and ev is not None and
              all(e["reason"] == ev["reason"] for e in again),
              f"announced again: the first reason ({[e['reason'] for e in again]})")
        x5b = xid()
        H.to(A, {"op": "abort", "xfer": x5b, "reason": "who?"})
        check(H.expect("stopped", x5b) is not None,
              "an abort from a stranger is answered stopped (nothing of "
              "A's can land at a peer it has no handshake with)")
        check(H.quiet(x5b, 300), "and nothing else")
        # A send of A's engine for H, which aborts it before any
        # handshake (its engine refused the request at once): A's
        # engine hears failed now, its blocks free (they were held to
        # the lease; the abort was refused for want of a handshake)
        xs = xid()
        EA.send({"op": "send", "xfer": xs, "peer": H.addr, "blocks": [40, 41]})
        EA.pump(100)
        H.to(A, {"op": "abort", "xfer": xs, "reason": "refused at once"})
        check(H.expect("stopped", xs) is not None,
              "H's abort of A's send for it is answered stopped")
        ev = EA.event(xs, 1000)
        check(ev is not None and ev["kind"] == "failed" and
              "refused at once" in ev["reason"],
              f"and A's engine hears failed at once, H's reason: {ev}")

        # 6b. A's engine aborts a receive it asked F for: A tells F
        # `abort` and keeps its engine's event back until F's word (F's
        # hello says `stops`); F, the sender, answers `stopped`, or
        # `abort` (a sender that failed it says so once its operations
        # ended): the event comes then. A answers F's abort nothing.
        for word in ("stopped", "abort"):
            x = xid()
            recv_from_f(x)
            EA.send({"op": "abort", "xfer": x})
            check(F.expect("abort", x) is not None, f"A tells F abort ({word})")
            EA.pump(300)
            check(EA.n_events(x) == 0,
                  f"A's engine hears nothing before F's {word}")
            F.to(A, {"op": word, "xfer": x, "reason": "nothing more lands"})
            ev = EA.event(x, 1000)
            check(ev is not None and ev["kind"] == "failed",
                  f"F's {word} ends the wait: {ev and ev['reason']}")
            check(F.quiet(x, 300), f"F's {word} is not answered")

        # 7. hello again: with a new instance (F restarted) it fails what
        # began with the old one, once; repeated with the same instance
        # it is answered and changes nothing in flight
        x6 = xid()
        recv_from_f(x6)
        F.hello = dict(hello, instance=random.getrandbits(63),
                       done_ucx=False)
        F.to(A, dict(F.hello, op="hello"))
        check(F.expect("hello_ack", sender=A) is not None, "a new instance's hello is answered")
        # F may be the same agent, its engine registered again, still
        # writing: A tells it, and its engine hears failed at F's word
        check(F.expect("abort", x6) is not None,
              "A tells the new instance abort for the old one's transfer")
        EA.pump(200)
        check(EA.n_events(x6) == 0, "A's engine hears nothing before F's word")
        F.to(A, {"op": "stopped", "xfer": x6})
        ev = EA.event(x6, 2000)
        check(ev is not None and ev["kind"] == "failed" and "restarted" in ev["reason"],
              f"a new instance fails the transfer begun with the old one ({ev and ev['reason']})")
        x7 = xid()
        recv_from_f(x7)
        for _ in range(2):
            F.to(A, dict(F.hello, op="hello"))
            check(F.expect("hello_ack", sender=A) is not None,
                  "a repeated hello is answered with hello_ack")
        EA.pump(300)
        check(EA.n_events(x7) == 0 and EA.n_events(x6) == 1,
              "a repeated hello fails nothing, no second event")
        done(F, x7)
        ev = EA.event(x7)
        check(ev is not None and ev["kind"] == "received",
              "the transfer completes after the repeated hello")

        # 7b. a want that came before A's engine announced the transfer,
        # then A's engine registers again (a new instance, its hello to F):
        # the held want fails with it (F is told), and the transfer
        # announced after fails at once instead of being pushed to F
        x7b = xid()
        F.to(A, {"op": "want", "xfer": x7b, "blocks": [20, 21, 22], "skip": 0,
                 "to_instance": a_instance})
        time.sleep(0.2)
        again = EA.register()
        check(again is not None and again.get("op") == "registered",
              f"A's engine registers again: {again}")
        told = F.expect("error", x7b) or F.expect("abort", x7b)
        EA.send({"op": "send", "xfer": x7b, "peer": F.addr, "blocks": P_blocks})
        for layer in range(LAYERS):
            EA.send({"op": "layer_done", "layer": layer, "xfers": [x7b]})
        ev = EA.event(x7b)
        check(told is not None and ev is not None and ev["kind"] == "failed",
              f"a want held across a register again fails, F told "
              f"({told and told['op']}), the announcement after it too: {ev}")
        check(F.quiet(x7b, 300), "and nothing is pushed to F for it")

        # 8. a ping with holds A never heard of: pong, nothing else
        F.to(A, {"op": "ping", "hold": [xid(), xid()]})
        check(F.expect("pong", sender=A) is not None, "a ping with unknown holds gets pong")
        H.to(A, {"op": "ping", "hold": [xid()]})
        check(H.expect("pong", sender=A) is not None,
              "a ping from a stranger gets pong (and A's hello)")
        check(H.expect("hello", sender=A) is not None, "... and A's hello")

        # 9. afterwards: a transfer from F, and a real one from B, byte for byte
        x8 = xid()
        recv_from_f(x8)
        done(F, x8)
        ev = EA.event(x8)
        check(ev is not None and ev["kind"] == "received", "a transfer from F works after all that")
        src = random.sample(range(BLOCKS), 5)
        dst = random.sample(range(BLOCKS), 5)
        EB.shm.buf[:] = os.urandom(EB.shm.size)
        x9 = xid()
        EA.send({"op": "recv", "xfer": x9, "peer": B, "blocks": dst})
        EB.send({"op": "send", "xfer": x9, "peer": A, "blocks": src})
        for layer in range(LAYERS):
            EB.send({"op": "layer_done", "layer": layer, "xfers": [x9]})
        ea, eb = EA.event(x9), EB.event(x9)
        check(ea is not None and ea["kind"] == "received" and eb is not None and
              eb["kind"] == "sent", f"a real transfer B -> A works ({ea and ea['reason']})")
        check(same_blocks(EB.shm.buf, src, EA.shm.buf, dst), "every byte of it arrived")
        check(rig.agents_run(), "both agents still run")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
