#!/usr/bin/python3
"""pdx.sglang driven in SGLang's own order (mini_sglang.py): a prefill and
a decode scheduler in this process, each manager with the pdx-agent it
starts, the prefill instance's bootstrap server pdx's own. Every check of
KV is byte by byte: the decode side's pages against the prefill side's.

Covered: MHA transfers (chunked prefill with a partial last page, two
rooms at once, pages at other indices on each side), the first token and
the room landing in the decode side's aux rows, the transfer metric, and
a decode pool whose layout differs refused before any transfer with both
layouts in words.

    test_sglang_backend.py PATH-TO-pdx-agent
"""
import os
import sys
import unittest

import pdx.sglang
from mini_sglang import Decode, Pool, Prefill, Req, ServerArgs, run
from pdx.sglang import KVPoll
from rig import free_port

CLASSES = {"manager": pdx.sglang.PdxKVManager,
           "sender": pdx.sglang.PdxKVSender,
           "receiver": pdx.sglang.PdxKVReceiver,
           "bootstrap_server": pdx.sglang.PdxKVBootstrapServer}


class Backend(unittest.TestCase):
    def start(self, p_pool, d_pool):
        for pool in (p_pool, d_pool):
            self.addCleanup(pool.close)
        port = free_port()
        self.P = Prefill(CLASSES, ServerArgs(port), p_pool)
        self.addCleanup(self.P.close)
        self.D = Decode(CLASSES, ServerArgs(free_port()), d_pool)
        self.addCleanup(self.D.close)

    def test_mha_byte_exact(self):
        self.start(Pool(), Pool())
        self.D.pool.alloc(5)   # the decode side's pages are others
        pairs = [(Req(7, 37, first_token=11, chunk=16), Req(7, 37)),
                 (Req(2**63 + 9, 8, first_token=12), Req(2**63 + 9, 8))]
        run(self.P, self.D, pairs)
        for p, d in pairs:
            self.assertEqual(p.done, KVPoll.Success, p.error)
            self.assertEqual(d.done, KVPoll.Success, d.error)
            self.assertNotEqual(p.pages, d.pages)
            self.assertEqual(self.P.pool.page_bytes(p.pages),
                             self.D.pool.page_bytes(d.pages))
            self.assertEqual(d.got_token, p.first_token)
            self.assertEqual(d.got_room & (2**64 - 1), p.bootstrap_room)
        # 10 pages x 4 layers x K and V x 4 tokens x 2 heads x 16 x 2 bytes
        self.assertEqual(pairs[0][0].metric.transfer_total_bytes,
                         10 * 4 * 2 * 4 * 2 * 16 * 2)

    def test_layout_differs(self):
        self.start(Pool(), Pool(head_dim=8))
        p, d = Req(5, 12), Req(5, 12)
        self.P.add(p)
        self.D.add(d, self.P.sa.disaggregation_bootstrap_port)
        for _ in range(2000):
            self.P.step()
            self.D.step()
            if d.done is not None:
                break
        self.assertEqual(d.done, KVPoll.Failed)
        self.assertIn("layout differs (prefill vs decode): item_lens "
                      "[256, 256, 256, 256] != [128, 128, 128, 128]", d.error)
        self.assertIsNone(d.receiver.peer)   # refused before any recv
        p.sender.abort()   # SGLang aborts the request on the prefill side
        self.assertEqual(p.sender.poll(), KVPoll.Failed)


if __name__ == "__main__":
    os.environ["PDX_SGLANG_AGENT_BIN"] = sys.argv.pop(1)
    os.environ.setdefault("PDX_SGLANG_XFER_TIMEOUT_MS", "5000")
    os.environ.setdefault("PDX_SGLANG_AGENT_ARGS", "--lease-ms 3000")
    os.environ.setdefault("UCX_TLS", "sm,self")
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    unittest.main(verbosity=2)
