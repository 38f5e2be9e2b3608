#!/usr/bin/python3
"""The Python binding (python/pdx) against two real pdx-agents: a transfer
byte for byte, skip_tokens, the first token, an abort, hold, an id in
flight twice, refusals as pdx.Error with status and reason, events through
the pollable fd, an agent killed under a transfer (EAGENT at once), and
close() from one thread while another is in wait_event(None) or in
register() (that call fails at once, the process exits cleanly).

    test_engine.py PATH-TO-pdx-agent
"""
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import unittest

import pdx
from rig import (BLOCK_TOKENS, BLOCKS, DTYPE, HEAD_DIM, KV_HEADS, LAYERS,
                 POOL_BYTES, TENSORS, Agents, block_at, free_port, layout,
                 same_blocks, wait_for)

AGENT = None


class Pair(unittest.TestCase):
    """A prefill (P) and a decode (D) engine, each with its agent and a
    pool in shared memory; P's pool filled with a pattern."""

    agent_args = ()

    def setUp(self):
        self.ag = Agents(AGENT, "p", "d", args=self.agent_args)
        self.addCleanup(self.close_agents)
        self.pools = {n: pdx.SharedPool(POOL_BYTES) for n in "pd"}
        self.eng = {}
        for n in "pd":
            self.eng[n] = pdx.Engine(self.ag.engine(n), liveness_ms=500)
            self.addCleanup(self.eng[n].close)
            self.eng[n].register(layout(), [self.pools[n].region])
        buf = self.pools["p"].buf
        buf[:] = bytes((i * 7 + i // 251) & 0xff for i in range(POOL_BYTES))

    def close_agents(self):
        for e in self.eng.values():
            e.close()
        for p in self.pools.values():
            p.close()
        self.ag.close()
        self.assertEqual(self.ag.bad_exits, [])

    def event(self, side, xfer, timeout=10):
        """The one event of xfer on side, through the fd."""
        e, end = self.eng[side], time.monotonic() + timeout
        while time.monotonic() < end:
            for ev in e.poll(0.2):
                if ev.xfer == xfer:
                    return ev
        self.fail("no event for %s on %s in %ss" % (xfer, side, timeout))

    def push(self, xfer, src, dst, token=None, skip_tokens=0, pull=None,
             meta=None):
        P, D = self.eng["p"], self.eng["d"]
        D.recv(xfer, P.peer_addr, dst, skip_tokens=skip_tokens, pull=pull)
        P.send(xfer, D.peer_addr, src)
        if token is not None:
            P.token(xfer, token)
        if meta is not None:
            P.meta(xfer, meta)
        for layer in range(LAYERS):
            P.layer_done(layer, [xfer])


class Transfers(Pair):
    def test_transfer_is_byte_exact(self):
        x = pdx.XferId()
        src, dst = [3, 9, 10, 40], [5, 6, 20, 63]
        self.push(x, src, dst, token=1234, meta=b"aux \x00 rows")
        d, p = self.event("d", x), self.event("p", x)
        self.assertEqual((d.kind, p.kind), (pdx.RECEIVED, pdx.SENT))
        self.assertEqual(d.first_token, 1234)
        self.assertEqual(d.meta, b"aux \x00 rows")
        self.assertEqual(p.meta, b"")
        self.assertEqual(d.bytes, len(src) * LAYERS * 2 * 256)
        self.assertTrue(same_blocks(self.pools["p"].buf, src,
                                    self.pools["d"].buf, dst))
        self.assertGreaterEqual(d.t_last_ns, d.t_first_ns)

    def test_skip_tokens_leaves_held_blocks_alone(self):
        x = pdx.XferId()
        src, dst = [1, 2, 3], [7, 8, 9]
        self.push(x, src, dst, skip_tokens=2 * 4)  # two blocks of 4 tokens
        self.assertEqual(self.event("d", x).kind, pdx.RECEIVED)
        self.assertEqual(self.event("p", x).kind, pdx.SENT)
        dbuf = self.pools["d"].buf
        self.assertTrue(all(block_at(dbuf, l, t, b) == bytes(256)
                            for l in range(LAYERS) for t in range(2)
                            for b in (7, 8)), "skipped blocks written")
        self.assertTrue(same_blocks(self.pools["p"].buf, [3],
                                    dbuf, [9]))
        # every token held: nothing moves, the first token comes
        x = pdx.XferId()
        self.push(x, src, dst, token=5, skip_tokens=3 * 4)
        d = self.event("d", x)
        self.assertEqual((d.kind, d.bytes, d.first_token),
                         (pdx.RECEIVED, 0, 5))
        # past the blocks' tokens: the engine lost count; refused (it was
        # taken as all held, and nothing moved)
        x = pdx.XferId()
        self.push(x, src, dst, skip_tokens=3 * 4 + 1)
        d = self.event("d", x)
        self.assertEqual((d.kind, d.status), (pdx.FAILED, pdx.EINVAL))
        self.assertIn("skip_tokens 13: past its 3 blocks' 12 tokens",
                      d.reason)
        self.assertEqual(self.event("p", x).kind, pdx.FAILED)

    def test_pull_is_byte_exact(self):
        # the decode agent reads the blocks (docs/protocol.md, "Pull"),
        # the first held already; recv(pull=False) pushes
        for pull in (True, False):
            x = pdx.XferId()
            src, dst = [11, 12, 13, 50], [21, 22, 23, 60]
            self.push(x, src, dst, token=77, skip_tokens=4, pull=pull,
                      meta=bytes(range(256)) * 256)
            d, p = self.event("d", x), self.event("p", x)
            self.assertEqual((d.kind, p.kind), (pdx.RECEIVED, pdx.SENT),
                             "pull=%s: %s / %s" % (pull, d.reason, p.reason))
            self.assertEqual(d.first_token, 77)
            self.assertEqual(d.meta, bytes(range(256)) * 256)
            self.assertEqual(d.bytes, 3 * LAYERS * 2 * 256)
            self.assertEqual(p.bytes, d.bytes)
            self.assertTrue(same_blocks(self.pools["p"].buf, src[1:],
                                        self.pools["d"].buf, dst[1:]))

    def test_ids_from_hex_and_bytes(self):
        x = pdx.XferId()
        self.assertEqual(pdx.XferId(x.hex), x)
        self.assertEqual(pdx.XferId(bytes(x)), x)
        with self.assertRaises(ValueError):
            pdx.XferId("abc")
        self.push(x.hex, [0], [0])  # a hex string is an id too
        self.assertEqual(self.event("d", x).kind, pdx.RECEIVED)

    def test_hold_then_recv(self):
        x = pdx.XferId()
        P, D = self.eng["p"], self.eng["d"]
        D.hold(x, P.peer_addr)
        P.send(x, D.peer_addr, [4, 5])
        for layer in range(LAYERS):
            P.layer_done(layer, [x])
        time.sleep(0.2)
        D.recv(x, P.peer_addr, [30, 31])
        self.assertEqual(self.event("d", x).kind, pdx.RECEIVED)
        self.assertEqual(self.event("p", x).kind, pdx.SENT)

    def test_abort_reaches_the_other_side(self):
        x = pdx.XferId()
        P, D = self.eng["p"], self.eng["d"]
        D.recv(x, P.peer_addr, [1, 2])
        P.send(x, D.peer_addr, [1, 2])
        P.layer_done(0, [x])
        D.abort(x)
        d, p = self.event("d", x), self.event("p", x)
        self.assertEqual((d.kind, p.kind), (pdx.FAILED, pdx.FAILED))
        self.assertEqual(d.status, pdx.ECANCELED, d)
        self.assertEqual(p.status_name, "ECANCELED", p)
        self.assertTrue(p.reason, "a failure says why")


class Refusals(Pair):
    def test_an_id_in_flight_is_eexist(self):
        x = pdx.XferId()
        D = self.eng["d"]
        D.recv(x, self.eng["p"].peer_addr, [1])
        with self.assertRaises(pdx.Error) as cm:
            D.recv(x, self.eng["p"].peer_addr, [2])
        self.assertEqual((cm.exception.status, cm.exception.name),
                         (pdx.EEXIST, "EEXIST"))
        D.abort(x)
        self.assertEqual(self.event("d", x).kind, pdx.FAILED)

    def test_bad_arguments_raise_with_the_reason(self):
        D = self.eng["d"]
        with self.assertRaises(pdx.Error) as cm:
            D.recv(pdx.XferId(), self.eng["p"].peer_addr, [])
        self.assertEqual(cm.exception.status, pdx.EINVAL)
        self.assertIn("block", cm.exception.reason)
        with self.assertRaises(pdx.Error) as cm:
            self.eng["p"].meta(pdx.XferId(), bytes(pdx.META_MAX + 1))
        self.assertEqual(cm.exception.status, pdx.EINVAL)
        self.assertIn("at most 65536 bytes", cm.exception.reason)

    def test_bad_peer_fails_the_transfer_saying_why(self):
        x = pdx.XferId()
        self.eng["d"].recv(x, "not-an-address", [1])
        ev = self.event("d", x)
        self.assertEqual((ev.kind, ev.status), (pdx.FAILED, pdx.EINVAL), ev)
        self.assertIn("tcp://", ev.reason)
        # a str with no UTF-8 (a lone surrogate): named, as the others
        # (a bare UnicodeEncodeError before)
        with self.assertRaisesRegex(ValueError, "peer: want .* in UTF-8"):
            self.eng["d"].recv(pdx.XferId(), "tcp://h\udc80:1", [1])
        # port 0 (or a wildcard host) is no agent's: refused at once
        # (before: it waited out the hello's bound, 5 s, "no answer")
        for bad in ("tcp://127.0.0.1:0", "tcp://0.0.0.0:5555"):
            x = pdx.XferId()
            self.eng["d"].recv(x, bad, [1])
            ev = self.event("d", x, timeout=2)
            self.assertEqual((ev.kind, ev.status), (pdx.FAILED, pdx.EINVAL),
                             ev)
            self.assertIn(bad, ev.reason)
        # a name that does not resolve, a port where nothing listens:
        # at the hello's bound (5 s), what the connects met (before: "is
        # an agent listening there" whatever they met)
        met = {"tcp://no-such-host.invalid:5555": "no such host here",
               "tcp://127.0.0.1:%d" % free_port(): "nothing listens there"}
        for addr, what in met.items():
            x = pdx.XferId()
            self.eng["d"].recv(x, addr, [1])
            ev = self.event("d", x, timeout=10)
            self.assertEqual((ev.kind, ev.status), (pdx.FAILED, pdx.EPEER),
                             ev)
            self.assertIn("our connects there met: " + what, ev.reason)
        # a hold alike: its failure comes as its event (before: the
        # agent refused it in its log alone, and the engine heard
        # nothing)
        x = pdx.XferId()
        self.eng["d"].hold(x, "not-an-address")
        ev = self.event("d", x, timeout=3)
        self.assertEqual((ev.kind, ev.status), (pdx.FAILED, pdx.EINVAL), ev)
        self.assertIn("tcp://", ev.reason)
        # a refused second hold of one held, not announced: its failed
        # event, and the agent ends it too, telling the sender (before:
        # it kept holding the sender's KV until its own bound)
        x = pdx.XferId()
        P, D = self.eng["p"], self.eng["d"]
        D.hold(x, P.peer_addr)
        P.send(x, D.peer_addr, [1])
        time.sleep(0.2)
        D.hold(x, "not-an-address")
        ev = self.event("d", x, timeout=3)
        self.assertEqual((ev.kind, ev.status), (pdx.FAILED, pdx.EINVAL), ev)
        self.assertEqual(self.event("p", x, timeout=3).kind, pdx.FAILED)
        # a refused second hold of an announced transfer leaves it to
        # run (its one event is the transfer's own)
        x = pdx.XferId()
        P, D = self.eng["p"], self.eng["d"]
        D.recv(x, P.peer_addr, [1])
        D.hold(x, "not-an-address")
        P.send(x, D.peer_addr, [1])
        for layer in range(LAYERS):
            P.layer_done(layer, [x])
        self.assertEqual(self.event("d", x).kind, pdx.RECEIVED)

    def test_block_outside_the_pool_fails_the_transfer(self):
        x = pdx.XferId()
        D = self.eng["d"]
        D.recv(x, self.eng["p"].peer_addr, [BLOCKS + 5])
        ev = self.event("d", x)
        self.assertEqual((ev.kind, ev.status), (pdx.FAILED, pdx.ERANGE), ev)
        self.assertIn("block", ev.reason)

    def test_layout_outside_its_region_is_refused(self):
        with pdx.Engine(self.ag.engine("d")) as e, \
                pdx.SharedPool(POOL_BYTES // 2) as small:
            with self.assertRaises(pdx.Error) as cm:
                e.register(layout(), [small.region])
            # the status C's register gives (it was EINVAL here)
            self.assertEqual(cm.exception.status, pdx.ERANGE)
            self.assertIn("region", cm.exception.reason)
            print(cm.exception)

    def test_calls_before_register_raise_enotreg(self):
        # at once, saying so (before: EPEER, "not connected, or 100000
        # messages queued", as if the agent or a peer were at fault)
        with pdx.Engine(self.ag.engine("d")) as e:
            x = pdx.XferId()
            for call in (lambda: e.send(x, self.eng["p"].peer_addr, [1]),
                         lambda: e.recv(x, self.eng["p"].peer_addr, [1]),
                         lambda: e.hold(x, self.eng["p"].peer_addr),
                         lambda: e.layer_done(0, [x])):
                with self.assertRaises(pdx.Error) as cm:
                    call()
                self.assertEqual(cm.exception.status, pdx.ENOTREG)
                self.assertIn("pdx_engine_register first",
                              cm.exception.reason)

    def test_arguments_out_of_range_raise_before_libpdx(self):
        # ctypes cuts a Python int to its C type without a word (token -5
        # reached the decode side as 4294967291, blocks=2**32 as 0): each
        # is refused here, naming the parameter and what it may be
        P, D, x = self.eng["p"], self.eng["d"], pdx.XferId()
        engine = self.ag.engine("d")
        wide = layout()
        wide.blocks = 2 ** 32
        three = layout()
        three.tensors = 3
        three.bases = [list(b) + [b[0]] for b in three.bases]
        closed = pdx.SharedPool(4096)
        closed.close()
        cases = [
            ("token -5", ValueError, r"token: -5 outside 0\.\.4294967295",
             lambda: P.token(x, -5)),
            ("token -1", ValueError, r"token: -1 outside 0\.\.4294967295",
             lambda: P.token(x, -1)),
            ("skip_tokens -1", ValueError,
             r"skip_tokens: -1 outside 0\.\.4294967295",
             lambda: D.recv(x, P.peer_addr, [1], skip_tokens=-1)),
            ("wait_event past 2^31 ms", ValueError,
             r"timeout: 4294967\.3 s .*2147483\.647",
             lambda: D.wait_event(timeout=4294967.3)),
            ("timeout_ms 2**40", ValueError,
             r"timeout_ms: 1099511627776 outside 0\.\.2147483647",
             lambda: pdx.Engine(engine, timeout_ms=2 ** 40)),
            ("timeout_ms -5", ValueError, r"timeout_ms: -5 outside 0\.\.",
             lambda: pdx.Engine(engine, timeout_ms=-5)),
            ("liveness_ms -1", ValueError,
             r"liveness_ms: -1 outside 0\.\.2147483647",
             lambda: pdx.Engine(engine, liveness_ms=-1)),
            ("xfer_timeout_ms over an hour", ValueError,
             r"xfer_timeout_ms: 3600001 outside 0\.\.3600000",
             lambda: pdx.Engine(engine, xfer_timeout_ms=3600001)),
            ("layout blocks 2**32", ValueError,
             r"layout\.blocks: 4294967296 outside 1\.\.4294967295",
             lambda: D.register(wide, [self.pools["d"].region])),
            ("layout tensors 3", ValueError,
             r"layout\.tensors: 3 outside 1\.\.2",
             lambda: D.register(three, [self.pools["d"].region])),
            ("XferId(16)", TypeError, "transfer id .* not int",
             lambda: pdx.XferId(16)),
            ("Engine(None)", TypeError, "agent: .* not NoneType",
             lambda: pdx.Engine(None)),
            ("bytes peer", TypeError, "peer: .* not bytes",
             lambda: D.recv(pdx.XferId(), P.peer_addr.encode(), [1])),
            ("tcp:// engine address", ValueError,
             r"agent: the engine link is ipc://PATH.*tcp:// is an agent's "
             "peer address",
             lambda: pdx.Engine(self.ag.listen["d"])),
            ("blocks as a set", pdx.Error,
             "blocks: want block ids in token order .* not set",
             lambda: D.recv(pdx.XferId(), P.peer_addr, {1, 2})),
            ("blocks as bytes", pdx.Error, "not bytes",
             lambda: D.recv(pdx.XferId(), P.peer_addr, b"\x01\0\0\0")),
            ("layer_done of no transfer, named once", pdx.Error,
             r"^EINVAL: layer_done: needs 1 to 2\^32-1 transfers .*\(0 "
             r"transfers, layer 0\)$",
             lambda: P.layer_done(0, [])),
            ("SharedPool.buf after close", ValueError, "SharedPool is closed",
             lambda: closed.buf),
            ("SharedPool.address after close", ValueError,
             "SharedPool is closed", lambda: closed.address),
        ]
        for what, exc, msg, call in cases:
            with self.subTest(what):
                with self.assertRaisesRegex(exc, msg):
                    call()
        # nothing was announced or replaced: the edges of the ranges go
        x = pdx.XferId()
        self.push(x, [1], [2], token=2 ** 32 - 1, skip_tokens=0)
        d = self.event("d", x)
        self.assertEqual((d.kind, d.first_token), (pdx.RECEIVED, 2 ** 32 - 1))

    def test_closed_engine_raises(self):
        e = pdx.Engine(self.ag.engine("p"))
        e.close()
        e.close()  # twice is fine
        with self.assertRaises(pdx.Error):
            e.abort(pdx.XferId())


class KvDtype(Pair):
    """Engines naming their KV's element type (set_kv_dtype): agents
    refuse to pair different names, saying both, where the layout alone
    (2 bytes each) paired a bfloat16 engine with a float16 one; equal
    names, or one side naming none, pair as before."""

    def named(self, p, d):
        for n, dt in (("p", p), ("d", d)):
            self.eng[n].set_kv_dtype(dt)
            self.eng[n].register(layout(), [self.pools[n].region])

    def pushed(self, again=True):
        """A push right after named(): its events, d's and p's. Both
        engines registered again, so the receiver's want may cross the
        sender's new hello, which fails it on both sides (docs/protocol.md,
        "want"; it did 1 run in 5): then once more."""
        x = pdx.XferId()
        self.push(x, [1, 2], [3, 4])
        d, p = self.event("d", x), self.event("p", x)
        if again and d.kind == p.kind == pdx.FAILED and (
                "earlier instance" in p.reason + d.reason or
                "peer restarted" in p.reason + d.reason):
            return self.pushed(again=False)
        return d, p

    def test_different_names_are_refused(self):
        self.named("bfloat16", "float16")
        d, p = self.pushed()
        self.assertEqual((d.kind, p.kind), (pdx.FAILED, pdx.FAILED))
        why = d.reason + " | " + p.reason
        self.assertRegex(why, r"KV element types differ \(ours vs tcp://"
                         r"[^)]*\): (bfloat16 != float16|float16 != "
                         r"bfloat16)")

    def test_equal_names_or_one_unnamed_pair(self):
        for p, d in (("bfloat16", "bfloat16"), ("float8_e4m3fn", None)):
            with self.subTest(p=p, d=d):
                self.named(p, d)
                got_d, got_p = self.pushed()
                self.assertEqual(got_d.kind, pdx.RECEIVED)
                self.assertEqual(got_p.kind, pdx.SENT)

    def test_bad_names(self):
        P = self.eng["p"]
        with self.assertRaisesRegex(pdx.Error, "set_kv_dtype: want a name"):
            P.set_kv_dtype("bf 16")
        with self.assertRaisesRegex(ValueError, "name: want .* 1 to 31"):
            P.set_kv_dtype("f" * 32)


class LayerDoneBeforeSend(Pair):
    """layer_done before its transfer's send is not counted: the agent
    warns at once (it was a debug line), and the layer timeout's reason
    says why instead of only "no layer computed"."""
    agent_args = ("--layer-timeout-ms", "500")

    def test_is_said(self):
        x = pdx.XferId()
        P, D = self.eng["p"], self.eng["d"]
        for layer in range(LAYERS):
            P.layer_done(layer, [x])
        D.recv(x, P.peer_addr, [1, 2])
        P.send(x, D.peer_addr, [1, 2])
        p = self.event("p", x)
        self.assertEqual(p.kind, pdx.FAILED)
        self.assertIn("one before the send is not counted", p.reason)
        self.assertIn("layer_done for transfer %s, which its engine has "
                      "not announced" % x, self.ag.log("p"))
        self.assertEqual(self.event("d", x).kind, pdx.FAILED)


class HoldAcrossTpSizes(unittest.TestCase):
    """A decode engine of TP 1 holds a transfer with both ranks of a TP 2
    prefill instance (each sends its half of the heads) while its request
    queues past their --lease-ms: both sends wait for it; aborted, both
    hear it. Before, only the first sender named in a hold was pinged with
    it (the second's KV expired) or told of its abort (pdx.sglang and
    PdxConnector hold with every prefill rank)."""

    def start(self, lease_ms):
        """(prefill ranks, decode engine), a transfer held and sent."""
        ag = Agents(AGENT, "p0", "p1", "d", args=(
            "--lease-ms", str(lease_ms), "--heartbeat-ms", "200"))
        self.addCleanup(lambda: (ag.close(),
                                 self.assertEqual(ag.bad_exits, [])))

        def engine(name, heads, rank=None):
            bb = BLOCK_TOKENS * heads * HEAD_DIM * DTYPE
            pool = pdx.SharedPool(LAYERS * TENSORS * BLOCKS * bb)
            self.addCleanup(pool.close)
            e = pdx.Engine(ag.engine(name), liveness_ms=500)
            self.addCleanup(e.close)
            if rank is not None:
                e.set_tp(rank, 2)
            e.register(pdx.Layout(
                blocks=BLOCKS, block_tokens=BLOCK_TOKENS, kv_heads=heads,
                head_dim=HEAD_DIM, dtype_bytes=DTYPE,
                bases=[[(0, (TENSORS * l + t) * BLOCKS * bb)
                        for t in range(TENSORS)] for l in range(LAYERS)],
                block_stride=[bb] * LAYERS), [pool.region])
            return e
        P = [engine("p%d" % r, KV_HEADS // 2, r) for r in range(2)]
        D = engine("d", KV_HEADS)
        self.x = pdx.XferId()
        for p in P:
            D.hold(self.x, p.peer_addr)
        for p in P:
            p.send(self.x, None, [1, 2])   # open, as with vLLM's proxies
            for layer in range(LAYERS):
                p.layer_done(layer, [self.x])
        return P, D

    def ended(self, e, kind, within):
        ev = next((ev for _ in range(int(within / 0.2)) for ev in
                   e.poll(0.2) if ev.xfer == self.x), None)
        self.assertIsNotNone(ev, "no event in %s s" % within)
        self.assertEqual(ev.kind, kind, ev.reason)

    def test_every_sender_keeps_it(self):
        P, D = self.start(lease_ms=1000)
        time.sleep(2.5)   # queued: past the senders' leases
        D.recv(self.x, None, [5, 6], peers=[p.peer_addr for p in P])
        for e, kind in [(D, pdx.RECEIVED)] + [(p, pdx.SENT) for p in P]:
            self.ended(e, kind, 10)

    def test_every_sender_hears_its_abort(self):
        P, D = self.start(lease_ms=20000)
        time.sleep(0.5)
        D.abort(self.x)
        for p in P:   # at once, not at the 20 s lease
            self.ended(p, pdx.FAILED, 5)


class AgentGone(Pair):
    def test_killed_agent_fails_the_transfer_at_once(self):
        x = pdx.XferId()
        D = self.eng["d"]
        D.recv(x, self.eng["p"].peer_addr, [1, 2])
        t0 = time.monotonic()
        self.ag.kill("d")
        ev = self.event("d", x, timeout=5)
        self.assertLess(time.monotonic() - t0, 2.0)
        self.assertEqual((ev.kind, ev.status), (pdx.FAILED, pdx.EAGENT), ev)
        up, why = D.link_status()
        self.assertFalse(up)
        self.assertTrue(why)
        with self.assertRaises(pdx.Error):
            D.recv(pdx.XferId(), self.eng["p"].peer_addr, [3])
        # back: registered again by itself, transfers work again
        self.ag.start("d")
        self.assertTrue(wait_for(lambda: (D.events(), D.link_status()[0])[1],
                                 10), D.link_status())
        y = pdx.XferId()
        self.push(y, [6], [6])
        self.assertEqual(self.event("d", y).kind, pdx.RECEIVED)


# A child process: an engine on the agent at argv[1], a thread in
# wait_event(None) (argv[2] "wait") or in register() (argv[2] "register":
# the agent is stopped, so it waits for its answer, up to 10 s), and
# close() from the main thread once that thread waits in the kernel.
CLOSE_CHILD = r"""
import os, sys, threading, time
import pdx
from rig import POOL_BYTES, layout

addr, mode = sys.argv[1], sys.argv[2]
pool = pdx.SharedPool(POOL_BYTES)
e = pdx.Engine(addr, timeout_ms=10000)
if mode == "wait":
    e.register(layout(), [pool.region])
got = {}


def call():
    try:
        if mode == "wait":
            e.wait_event(None)
        else:
            e.register(layout(), [pool.region])
        got["no error"] = True
    except pdx.Error as x:
        got["t"], got["err"] = time.monotonic(), x


t = threading.Thread(target=call)
t.start()
# in the kernel, waiting: poll (x86_64 7, ppoll 271; aarch64 ppoll 73)
polls = {"x86_64": ("7", "271"), "aarch64": ("73",)}.get(sys.argv[3], ())
path = "/proc/self/task/%d/syscall" % t.native_id
end = time.monotonic() + 10
while polls and time.monotonic() < end:
    with open(path) as f:
        if f.read().split(" ")[0] in polls:
            break
    time.sleep(0.01)
else:
    time.sleep(0.5)
time.sleep(0.05)
t0 = time.monotonic()
e.close()
t.join(5)
assert not t.is_alive(), "the call still waits 5 s after close()"
assert "err" in got, got
took = got["t"] - t0
assert took < 1.0, "the call returned %.2f s after close()" % took
err = got["err"]
assert err.status == pdx.EINVAL and "closed" in str(err), err
try:
    e.wait_event(0)
    raise AssertionError("a call after close() ran")
except pdx.Error as x:
    assert "closed" in str(x), x
pool.close()
print("ok: %s failed %.3f s after close(): %s" % (mode, took, err))
"""


class CloseFromAnotherThread(unittest.TestCase):
    """pdx.Engine.close() (pdx_engine_free) while another thread is in a
    call that waits on the agent: that call fails at once with EINVAL
    and the engine is freed as it returns. Before, the engine was freed
    under the call: it failed on a closed socket ("poll agent socket:
    Socket operation on non-socket") and wrote into freed memory. Each
    case runs in a child, whose exit must be clean (freed memory is
    filled with a pattern there: MALLOC_PERTURB_)."""

    def setUp(self):
        self.ag = Agents(AGENT, "w")
        self.addCleanup(self.close_agent)

    def close_agent(self):
        self.ag.close()
        self.assertEqual(self.ag.bad_exits, [])

    def close_during(self, mode):
        env = dict(os.environ, MALLOC_PERTURB_="165")
        r = subprocess.run(
            [sys.executable, "-c", CLOSE_CHILD, self.ag.engine("w"), mode,
             platform.machine()],
            env=env, capture_output=True, text=True, timeout=60)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        self.assertIn("ok: " + mode, r.stdout, out)
        self.assertNotIn("non-socket", out)
        self.assertIn("freed as that call returns", r.stderr, out)

    def test_close_during_wait_event(self):
        self.close_during("wait")

    def test_close_during_register(self):
        agent = self.ag.procs["w"]
        agent.send_signal(signal.SIGSTOP)  # register waits for its answer
        try:
            self.close_during("register")
        finally:
            agent.send_signal(signal.SIGCONT)


class InterruptedWait(unittest.TestCase):
    """Ctrl-C (SIGINT) during wait_event() in the main thread raises
    KeyboardInterrupt at once, as Python's own waits do. libpdx's wait
    goes on through EINTR, and Python runs the handler only once the
    call returned: wait_event(None) was deaf to Ctrl-C for good."""

    def test_sigint_interrupts_wait_event(self):
        ag = Agents(AGENT, "w")
        self.addCleanup(ag.close)
        e = pdx.Engine(ag.engine("w"))
        self.addCleanup(e.close)
        kick = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        kick.start()
        self.addCleanup(kick.cancel)
        t0 = time.monotonic()
        with self.assertRaises(KeyboardInterrupt):
            e.wait_event(5)
        took = time.monotonic() - t0
        self.assertLess(took, 2, "KeyboardInterrupt %.2f s after wait_event "
                        "began (SIGINT at 0.3 s)" % took)
        self.assertIsNone(e.wait_event(0.25), "the engine still waits")


class CudaWithoutGpu(Pair):
    """The CUDA calls where CUDA cannot serve them (no driver here; on a
    GPU machine, memory that is not the device's): pdx.Error with the
    reason libpdx gave, and the engine goes on."""

    def test_cuda_region_of_host_memory_raises_saying_why(self):
        with self.assertRaises(pdx.Error) as cm:
            pdx.cuda_region(self.pools["p"].address, 4096)
        self.assertIn(cm.exception.status, (pdx.EIO, pdx.EINVAL))
        self.assertRegex(cm.exception.reason,
                         "no CUDA driver|cuInit|not memory CUDA knows")

    def test_stream_events_registration_raises_saying_why(self):
        fake = pdx.CudaRegion(bytes(64), POOL_BYTES)
        with self.assertRaises(pdx.Error) as cm:
            self.eng["p"].register(layout(), [fake], cuda_event_slots=2)
        self.assertTrue(cm.exception.reason.startswith("register with "))
        self.assertGreater(len(cm.exception.reason.split(": ", 1)[1]), 0)
        with self.assertRaises(pdx.Error) as cm:
            self.eng["p"].layer_done(0, [pdx.XferId()], stream=0)
        self.assertEqual(cm.exception.status, pdx.EINVAL)
        self.assertIn("not registered with pdx_engine_register_cuda_streams",
                      cm.exception.reason)
        # the registration the agent holds is the one before: it moves KV
        x = pdx.XferId()
        self.push(x, [1, 2], [3, 4])
        self.assertEqual(self.event("d", x).kind, pdx.RECEIVED)

    def test_streams_are_pointers_or_have_cuda_stream(self):
        class TorchLike:
            cuda_stream = 0
        with self.assertRaises(pdx.Error) as cm:
            self.eng["p"].layer_done(0, [pdx.XferId()], stream=TorchLike())
        self.assertIn("not registered", cm.exception.reason)


class Memory(unittest.TestCase):
    def test_region_of_finds_the_pool(self):
        with pdx.SharedPool(1 << 16) as pool:
            r, off = pdx.region_of(pool.address + 4096, 100)
            self.assertEqual((r, off), (pool.region, 4096))
            regions, refs = pdx.regions_for([(pool.address, 10),
                                             (pool.address + 64, 10)])
            self.assertEqual((regions, refs), ([pool.region],
                                               [(0, 0), (0, 64)]))
        with self.assertRaises(pdx.Error) as cm:
            pdx.region_of(id(self), 8)  # the Python heap
        self.assertIn("SharedPool", cm.exception.reason)


if __name__ == "__main__":
    AGENT = sys.argv.pop(1)
    unittest.main(verbosity=2)
