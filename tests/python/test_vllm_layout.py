#!/usr/bin/python3
"""The KV cache layout PdxConnector asks of vLLM (its class's
get_required_kvcache_layout, which vLLM reads before any cache or
connector exists: mini_vllm.kv_cache_layout), driven in vLLM's order
with the agents the connectors start.

vLLM orders each block's tokens and heads by the attention backend:
FlashInfer on Blackwell requires HND, FlashAttention requires nothing
and takes what the connector asks, else NHD. A connector that asked
nothing left a prefill instance on the one and a decode instance on the
other with different layouts: the agents refused the pair ("order HND
!= NHD") and the decode side computed every prompt again; now they
convert, a row per head and token. PdxConnector asks HND, as vLLM's
NixlConnector does, so both sides hold HND and nothing is converted:
each decode rank's KV arrives byte for byte, in every cache shape and
between TP sizes, and nothing is computed again. MLA's latent asks
nothing.

    test_vllm_layout.py PATH-TO-pdx-agent
"""
import logging
import os
import sys
import unittest

import test_vllm_connector as tvc
from mini_vllm import MiniVllm
from pdx.vllm import PdxConnector
from pdx.vllm import layout as kv_layout
from test_vllm_connector import PROMPT, Warnings, config, decode_checked
from vllm.config import KVTransferConfig, ModelConfig, VllmConfig


def registered_order(eng):
    """The order PdxConnector reads from each rank's caches: "NHD"s and
    "HND"s."""
    return {("HND" if kv_layout.build(kv.tensors)[0].order else "NHD")
            for kv in eng.kvs}


class Required(unittest.TestCase):
    """What the class answers vLLM, as NixlConnector does."""

    def required(self, model_config):
        return PdxConnector.get_required_kvcache_layout(VllmConfig(
            model_config=model_config,
            kv_transfer_config=KVTransferConfig(kv_role="kv_both",
                                                **config())))

    def test_hnd_for_heads_none_for_mla(self):
        self.assertEqual(self.required(ModelConfig()), "HND")
        self.assertIsNone(self.required(ModelConfig(use_mla=True)))
        # vLLM may ask before it knows the model: nothing asked then
        self.assertIsNone(self.required(None))


class BackendsDiffer(unittest.TestCase):
    """A prefill instance whose attention backend requires HND
    (FlashInfer on Blackwell) and a decode instance on FlashAttention
    (NHD unless asked), vLLM's proxies' kv_transfer_params."""

    def pair(self, p_tp=1, d_tp=1, kv_layout="blocks_first"):
        P = MiniVllm(config(), role="prefill", tp_size=p_tp,
                     kv_layout=kv_layout, attn_backend_layout="HND").start()
        self.addCleanup(P.close)
        D = MiniVllm(config(), role="decode", tp_size=d_tp,
                     kv_layout=kv_layout)  # stepped by decode_checked
        self.addCleanup(D.close)
        C = MiniVllm(None, kv_layout=kv_layout).start()
        self.addCleanup(C.close)
        p = P.generate(PROMPT, 1, {"do_remote_decode": True})
        decode_checked(self, D, dict(p.kv_transfer_params),
                       C.generate(PROMPT, 8).token_ids)
        self.assertEqual((registered_order(P), registered_order(D)),
                         ({"HND"}, {"HND"}))

    def test_blocks_first(self):
        self.pair()

    def test_kv_first(self):
        self.pair(kv_layout="kv_first")

    def test_packed(self):
        self.pair(kv_layout="packed")

    def test_packed_kernel_blocks(self):
        self.pair(kv_layout="packed_kernel")

    def test_tp_2_to_1(self):
        """Each decode rank's heads from the prefill rank that holds
        them: in HND one piece a block and head run."""
        self.pair(2, 1)

    def test_tp_1_to_2(self):
        self.pair(1, 2)

    def test_packed_tp_2_to_2(self):
        self.pair(2, 2, "packed")

    def test_mla_asks_nothing(self):
        """MLA's backends have one order whatever is asked: the latent
        moves as before."""
        P = MiniVllm(config(), role="prefill", kv_layout="mla").start()
        self.addCleanup(P.close)
        D = MiniVllm(config(), role="decode", kv_layout="mla")
        self.addCleanup(D.close)
        C = MiniVllm(None, kv_layout="mla").start()
        self.addCleanup(C.close)
        self.assertEqual((P.kv_cache_layout, registered_order(D)),
                         ("NHD", {"NHD"}))
        p = P.generate(PROMPT, 1, {"do_remote_decode": True})
        decode_checked(self, D, dict(p.kv_transfer_params),
                       C.generate(PROMPT, 8).token_ids)


class UserLayoutWins(unittest.TestCase):
    """VLLM_KV_CACHE_LAYOUT comes before the connector in vLLM: a decode
    instance told NHD against an HND prefill one holds NHD. The agents
    convert the blocks on the way (the refusal "order HND != NHD" and a
    recompute before): the KV is received, and the text is right."""

    def test_the_other_order_is_converted(self):
        warnings = Warnings()
        logging.getLogger("pdx.vllm").addHandler(warnings)
        self.addCleanup(logging.getLogger("pdx.vllm").removeHandler,
                        warnings)
        P = MiniVllm(config(), role="prefill").start()
        self.addCleanup(P.close)
        D = MiniVllm(config(), role="decode",
                     vllm_kv_cache_layout="NHD").start()
        self.addCleanup(D.close)
        C = MiniVllm(None).start()
        self.addCleanup(C.close)
        self.assertEqual((P.kv_cache_layout, D.kv_cache_layout),
                         ("HND", "NHD"))
        p = P.generate(PROMPT, 1, {"do_remote_decode": True})
        out = D.generate(PROMPT, 8, dict(p.kv_transfer_params))
        self.assertEqual(out.token_ids, C.generate(PROMPT, 8).token_ids)
        st = D.worker_connector._worker.stats
        self.assertEqual((st["received"], st["failed"]), (1, 0))
        self.assertNotRegex(" ".join(warnings.lines), "order|differs")


if __name__ == "__main__":
    tvc.AGENT = sys.argv.pop(1)
    os.environ.setdefault("UCX_TLS", "sm,self")
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    unittest.main(verbosity=2)
