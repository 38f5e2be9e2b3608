#!/usr/bin/python3
"""pdx.sglang between instances of other tensor-parallel sizes, in SGLang's
order (mini_sglang.py), each rank a scheduler with its own pool and the
pdx-agent its manager starts: every decode rank asks the prefill
instance's bootstrap server for every prefill rank, names their agents in
its receive, and its agent takes exactly its heads from the ranks that
hold them (docs/protocol.md, "TP legs"). Checked byte by byte: each decode
rank's pages against its heads of the prefill ranks' pages put together;
MLA's latent, whole on every rank, against one prefill rank's. Also: the
aux rows and the first token arrive on every decode rank, and without
PDX_SGLANG_TOKEN (heads unknown) other TP sizes are refused saying so.

A prefill instance with DP attention (a scheduler, pool and agent per DP
rank, one bootstrap server): requests routed by their room (SGLang's
default for a prefill instance) are found by the decode side as room %
dp_size; routed in turn (round_robin), each sender registers its DP rank
and the decode side asks /query_dp_ranks; a request the router sent to
another DP rank than its room's fails saying so, unless
SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK is set or the sender
is told the request names its rank. Every transfer
byte-exact against the pages of the DP rank that computed it.

    test_sglang_tp.py PATH-TO-pdx-agent
"""
import os
import sys
import unittest

import torch

import pdx.sglang
from mini_sglang import (DataParallel, Decode, Pool, Prefill, Ranks, Req,
                         ServerArgs, run)
from pdx.sglang import KVPoll
from rig import free_port, wait_for

CLASSES = {"manager": pdx.sglang.PdxKVManager,
           "sender": pdx.sglang.PdxKVSender,
           "receiver": pdx.sglang.PdxKVReceiver,
           "bootstrap_server": pdx.sglang.PdxKVBootstrapServer}
HEADS, HEAD_DIM = 4, 16   # the model's KV heads (fp16)


class TensorParallel(unittest.TestCase):
    def instance(self, cls, tp, mla=False):
        sa = ServerArgs(free_port(), tp_size=tp)
        ranks = []
        for r in range(tp):
            pool = Pool(heads=HEADS // tp, head_dim=HEAD_DIM, mla=mla,
                        tp_rank=r, tp_size=tp)
            self.addCleanup(pool.close)
            ranks.append(cls(CLASSES, sa, pool))
            self.addCleanup(ranks[-1].close)
        return Ranks(ranks)

    def pair(self, p_tp, d_tp, mla=False):
        if mla:   # the model's token: one latent "head"
            token = os.environ["PDX_SGLANG_TOKEN"]
            self.addCleanup(os.environ.__setitem__, "PDX_SGLANG_TOKEN", token)
            os.environ["PDX_SGLANG_TOKEN"] = "1,%d,2" % HEAD_DIM
        P = self.instance(Prefill, p_tp, mla)
        D = self.instance(Decode, d_tp, mla)
        pairs = [(Req(17, 37, first_token=5, chunk=16), Req(17, 37)),
                 (Req(2**63 + 3, 9, first_token=6), Req(2**63 + 3, 9))]
        run(P, D, pairs, timeout=30)
        return P, D, pairs

    @staticmethod
    def pages(rank, req, t, l):
        """The request's pages of tensor t, layer l on that rank:
        [tokens, heads, head_dim]."""
        return torch.cat([rank.pool.page(t, l, p) for p in req.pages])

    def check(self, P, D, pairs):
        for p, d in pairs:
            for q in p.ranks + d.ranks:
                self.assertEqual(q.done, KVPoll.Success, q.error)
            for dq in d.ranks:
                self.assertEqual(dq.got_token, p.first_token)
                self.assertEqual(dq.got_aux, p.ranks[0].aux_sent)
            pool = P.ranks[0].pool
            for t in range(pool.tensors):
                for l in range(pool.layers):
                    # the model's heads: the prefill ranks' side by side
                    whole = torch.cat([self.pages(r, q, t, l) for r, q in
                                       zip(P.ranks, p.ranks)], dim=1) \
                        if not pool.mla else self.pages(P.ranks[0],
                                                        p.ranks[0], t, l)
                    for j, (r, q) in enumerate(zip(D.ranks, d.ranks)):
                        h = r.pool.heads
                        want = whole if pool.mla else \
                            whole[:, j * h:(j + 1) * h]
                        self.assertTrue(torch.equal(
                            self.pages(r, q, t, l), want),
                            "decode rank %d, tensor %d, layer %d" %
                            (j, t, l))

    def test_mha_2_to_1(self):
        self.check(*self.pair(2, 1))

    def test_mha_1_to_2(self):
        self.check(*self.pair(1, 2))

    def test_mha_2_to_4(self):
        self.check(*self.pair(2, 4))

    def test_mla_2_to_1(self):
        self.check(*self.pair(2, 1, mla=True))

    def test_heads_unknown(self):
        """Without PDX_SGLANG_TOKEN a rank's token is bytes alone: other
        TP sizes cannot be told apart head for head, and are refused."""
        token = os.environ.pop("PDX_SGLANG_TOKEN")
        self.addCleanup(os.environ.__setitem__, "PDX_SGLANG_TOKEN", token)
        P = self.instance(Prefill, 2)
        D = self.instance(Decode, 1)
        p, d = Req(3, 8), Req(3, 8)
        D.add(d, P.sa.disaggregation_bootstrap_port)
        P.add(p)
        for _ in range(3000):
            P.step()
            D.step()
            if d.ranks[0].done is not None:
                break
        self.assertEqual(d.ranks[0].done, KVPoll.Failed)
        self.assertIn("PDX_SGLANG_TOKEN", d.ranks[0].error)
        for q in p.ranks:   # SGLang aborts the request on the prefill side
            q.sender.abort()   # Failed at its agent's event
            self.assertTrue(wait_for(
                lambda: q.sender.poll() == KVPoll.Failed, 5))


class DataParallelAttention(unittest.TestCase):
    def start(self, method, dp=2):
        sa = ServerArgs(free_port(), tp_size=dp, dp_size=dp,
                        enable_dp_attention=True, load_balance_method=method)
        ranks = []
        for r in range(dp):   # attention TP 1: every head on each rank
            pool = Pool(heads=HEADS, head_dim=HEAD_DIM, tp_rank=r)
            self.addCleanup(pool.close)
            ranks.append(Prefill(CLASSES, sa, pool))
            self.addCleanup(ranks[-1].close)
        self.P = DataParallel(ranks, method)
        pool = Pool(heads=HEADS, head_dim=HEAD_DIM)
        self.addCleanup(pool.close)
        self.D = Decode(CLASSES, ServerArgs(free_port()), pool)
        self.addCleanup(self.D.close)

    def transfer(self, rooms, named=None):
        pairs = []
        for room in rooms:
            p, d = Req(room, 21, first_token=room % 1000), Req(room, 21)
            p.prefill_dp_rank = d.prefill_dp_rank = named
            pairs.append((p, d))
        run(self.P, self.D, pairs, timeout=30)
        return pairs

    def check(self, pairs):
        for p, d in pairs:
            self.assertEqual((p.done, d.done),
                             (KVPoll.Success, KVPoll.Success),
                             p.error + d.error)
            self.assertEqual(self.P.ranks[p.dp_rank].pool.page_bytes(
                p.pages), self.D.pool.page_bytes(d.pages))
            self.assertEqual(d.got_token, p.first_token)

    def test_routed_by_room(self):
        self.start("follow_bootstrap_room")
        pairs = self.transfer([40, 41, 42, 43])
        self.assertEqual([p.dp_rank for p, _ in pairs], [0, 1, 0, 1])
        self.check(pairs)

    def test_routed_in_turn_then_asked(self):
        """Even rooms in turn: half run where room % 2 would not find
        them."""
        self.start("round_robin")
        pairs = self.transfer([50, 52, 54, 56])
        self.assertEqual([p.dp_rank for p, _ in pairs], [0, 1, 0, 1])
        self.check(pairs)

    def test_router_named_another_rank(self):
        self.start("follow_bootstrap_room")
        p, d = Req(60, 8), Req(60, 8)
        p.prefill_dp_rank = d.prefill_dp_rank = 1   # room 60 says 0
        self.D.add(d, self.P.sa.disaggregation_bootstrap_port)
        self.P.add(p)
        self.assertEqual(p.sender.poll(), KVPoll.Failed)
        self.assertIn("follow_bootstrap_room conflict", p.sender.reason)
        d.receiver.abort()   # SGLang aborts the request on both sides
        os.environ["SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK"] = "1"
        self.addCleanup(os.environ.pop,
                        "SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK")
        self.check(self.transfer([62], named=1))

    def test_router_named_rank_told(self):
        """The sender told the request names its DP rank (a later
        SGLang's req_has_disagg_prefill_dp_rank): no conflict, as SGLang's
        own senders (it failed with "follow_bootstrap_room conflict")."""
        self.start("follow_bootstrap_room")
        p, d = Req(64, 21, first_token=7), Req(64, 21)
        p.prefill_dp_rank = d.prefill_dp_rank = 1   # room 64 says 0
        p.tells_dp_rank = True
        run(self.P, self.D, [(p, d)], timeout=30)
        self.assertEqual(p.dp_rank, 1)
        self.check([(p, d)])


if __name__ == "__main__":
    os.environ["PDX_SGLANG_AGENT_BIN"] = sys.argv.pop(1)
    os.environ["PDX_SGLANG_TOKEN"] = "%d,%d,2" % (HEADS, HEAD_DIM)
    os.environ.setdefault("PDX_SGLANG_XFER_TIMEOUT_MS", "5000")
    os.environ.setdefault("PDX_SGLANG_LIVENESS_MS", "1000")
    os.environ.setdefault("UCX_TLS", "sm,self")
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    unittest.main(verbosity=2)
