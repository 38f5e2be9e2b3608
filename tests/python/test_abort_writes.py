#!/usr/bin/python3
"""A receiver's engine that aborts a transfer reuses its blocks as soon
as it hears `failed`: no byte the sender pushed may land in them after
that. The sender agent is stopped (SIGSTOP) while its pushes are under
way, the decode engine aborts, and only once the sender runs again and
says `stopped` does the decode engine hear `failed`; it then overwrites
its blocks, and they stay as it wrote them. On the put lane (UCX put,
operations in flight) and the ipc lane (copies in the sender's loop).
Before `stopped` the decode engine heard `failed` at once and most of its
pool was written afterwards. A sender frozen past --peer-timeout-ms is
given up on: the event comes then.

    test_abort_writes.py PATH-TO-pdx-agent
"""
import signal
import sys
import time
import unittest

import pdx
from rig import Agents, wait_for

AGENT = None
LAYERS, BLOCKS, BT, HEADS, HD, DT = 8, 128, 16, 8, 128, 2
BB = BT * HEADS * HD * DT  # 32 KiB a block
POOL = LAYERS * 2 * BLOCKS * BB  # 64 MiB
SENDER_FILL, REUSED = 0x11, 0xEE


def layout():
    return pdx.Layout(
        blocks=BLOCKS, block_tokens=BT, kv_heads=HEADS, head_dim=HD,
        dtype_bytes=DT,
        bases=[[(0, (2 * l + t) * BLOCKS * BB) for t in range(2)]
               for l in range(LAYERS)],
        block_stride=[BB] * LAYERS)


class AbortedWhileWritten(unittest.TestCase):
    def pair(self, path, peer_timeout_ms=5000):
        ag = Agents(AGENT, "p", "d",
                    args=["--data-path", path, "--peer-timeout-ms",
                          str(peer_timeout_ms)])
        self.addCleanup(ag.close)
        pools = {n: pdx.SharedPool(POOL) for n in "pd"}
        eng = {}
        for n in "pd":
            eng[n] = pdx.Engine(ag.engine(n), liveness_ms=20000)
            self.addCleanup(eng[n].close)
            eng[n].register(layout(), [pools[n].region])
        for p in pools.values():
            self.addCleanup(p.close)
        pools["p"].buf[:] = bytes([SENDER_FILL]) * POOL
        return ag, pools, eng

    def event(self, eng, xfer, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for ev in eng.poll(0.05):
                if ev.xfer == xfer:
                    return ev
        return None

    def abort_mid_push(self, path, peer_timeout_ms=5000, frozen_s=1.0):
        """The push begins, the sender is frozen, the receiver aborts, and
        its engine overwrites its blocks the moment it hears the event
        (the sender perhaps still frozen): (the decode event, seconds from
        the abort to it, the bytes that had landed at the freeze, the
        bytes written after the event, the sender's event)."""
        ag, pools, eng = self.pair(path, peer_timeout_ms)
        P, D = eng["p"], eng["d"]
        x = pdx.XferId()
        D.recv(x, P.peer_addr, list(range(BLOCKS)))
        P.send(x, D.peer_addr, list(range(BLOCKS)))
        for layer in range(LAYERS):
            P.layer_done(layer, [x])
        d = pools["d"].buf
        # the first bytes landed: the push is under way
        self.assertTrue(wait_for(lambda: d[0] == SENDER_FILL, 10, 0.0005),
                        "the push never began")
        ag.procs["p"].send_signal(signal.SIGSTOP)
        try:
            landed = POOL - bytes(d).count(0)
            t0 = time.monotonic()
            D.abort(x)
            ev = self.event(D, x, frozen_s)
            if ev is not None:  # reused at once, the sender still frozen
                d[:] = bytes([REUSED]) * POOL
        finally:
            ag.procs["p"].send_signal(signal.SIGCONT)
        if ev is None:
            ev = self.event(D, x, 10)
            self.assertIsNotNone(ev, "no event for the aborted transfer")
            d[:] = bytes([REUSED]) * POOL
        took = time.monotonic() - t0
        pe = self.event(P, x, 10)
        time.sleep(0.3)
        late = POOL - bytes(d).count(REUSED)
        return ev, took, landed, late, pe

    def check_nothing_lands_after_failed(self, path):
        ev, took, landed, late, pe = self.abort_mid_push(path)
        self.assertEqual(ev.kind, pdx.FAILED)
        self.assertEqual(ev.status, pdx.ECANCELED)
        self.assertIsNotNone(pe, "the sender's engine heard nothing")
        self.assertEqual(pe.kind, pdx.FAILED)
        self.assertEqual(late, 0, "%d bytes written after the decode "
                         "engine heard failed (%d had landed when the "
                         "sender was frozen; the event came %.3f s after "
                         "the abort)" % (late, landed, took))
        # the event waited for the frozen sender
        self.assertGreater(took, 0.9)

    def test_put_lane(self):
        self.check_nothing_lands_after_failed("put")

    def test_ipc_lane(self):
        self.check_nothing_lands_after_failed("ipc")

    def test_a_sender_frozen_for_good_is_given_up_on(self):
        # frozen past --peer-timeout-ms: declared gone, the event comes
        # (what it writes once it runs again is --kv-quarantine-ms's, as
        # for a frozen agent of one's own)
        ev, took, _, _, _ = self.abort_mid_push("put", peer_timeout_ms=1500,
                                                frozen_s=6)
        self.assertEqual(ev.kind, pdx.FAILED)
        self.assertLess(took, 5.5)
        self.assertGreater(took, 1.0)

if __name__ == "__main__":
    AGENT = sys.argv.pop(1)
    unittest.main(verbosity=2)
