"""mini_vllm calls a KV connector in vLLM's order (VLLM_NOTES.md 3, 4, 7).

RecordingConnector, a KVConnectorBase_V1 loaded by module path like any
external connector, records every call and moves KV between two
MiniVllm instances of this process by copying blocks (NIXL's shape: the
prefill side's request_finished returns its block ids, the decode side
loads the tail it lacks). Checked: the call sequences of a prefill with
do_remote_decode, of a decode with do_remote_prefill (an async load,
then the second update_state_after_alloc and the one recomputed token),
the zero-token steps between, an abort while waiting for remote KV, the
decode side's text equal to a colocated run's, and that a connector
breaking vLLM's assertions fails.
"""
import sys
import unittest

import pdx
from mini_vllm import MiniVllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata)
from vllm.v1.request import RequestStatus

CALLS = []      # (tag, role, method, detail)
CACHES = {}     # engine_id -> the worker's registered kv caches
COPIED = set()  # prefill request ids whose blocks a decode side copied
HOLD = set()    # decode request ids whose load must not finish yet


class Meta(KVConnectorMetadata):
    def __init__(self, recv, send):
        self.recv, self.send = recv, send


class RecordingConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = self._kv_transfer_config
        self.tag = ktc.get_from_extra_config("tag", "?")
        self.engine_id = ktc.engine_id
        self.lie = ktc.get_from_extra_config("lie", None)
        self.recv, self.send = {}, set()      # scheduler side
        self.loaded, self.sending = set(), set()  # worker side
        self.seen_finished = set()

    def rec(self, method, detail=None):
        CALLS.append((self.tag, self.role.name, method, detail))

    # --- scheduler side ---
    def bind_gpu_block_pool(self, pool):
        self.rec("bind_gpu_block_pool")

    def on_new_request(self, request):
        self.rec("on_new_request", request.request_id)

    def set_xfer_handshake_metadata(self, metadata):
        self.rec("set_xfer_handshake_metadata", sorted(metadata))

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        p = request.kv_transfer_params or {}
        n = 0
        if p.get("do_remote_prefill"):
            n = request.num_prompt_tokens - num_computed_tokens
        self.rec("get_num_new_matched_tokens", (num_computed_tokens, n))
        return n, n > 0

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.rec("update_state_after_alloc", num_external_tokens)
        p = request.kv_transfer_params or {}
        if p.get("do_remote_prefill") and num_external_tokens > 0:
            self.recv[request.request_id] = (
                blocks.get_unhashed_block_ids(), p["remote_engine_id"],
                p["remote_block_ids"], p["remote_request_id"])
            p["do_remote_prefill"] = False

    def build_connector_meta(self, scheduler_output):
        self.rec("build_connector_meta",
                 scheduler_output.total_num_scheduled_tokens)
        meta = Meta(self.recv, self.send)
        self.recv, self.send = {}, set()
        return meta

    def request_finished(self, request, block_ids):
        self.rec("request_finished", request.status)
        p = request.kv_transfer_params or {}
        if not p.get("do_remote_decode") or \
                request.status != RequestStatus.FINISHED_LENGTH_CAPPED:
            return False, None
        self.send.add(request.request_id)
        return True, dict(do_remote_prefill=True, do_remote_decode=False,
                          remote_engine_id=self.engine_id,
                          remote_block_ids=list(block_ids),
                          remote_request_id=request.request_id)

    def update_connector_output(self, connector_output):
        self.rec("update_connector_output",
                 (connector_output.finished_sending,
                  connector_output.finished_recving))

    def take_events(self):
        self.rec("take_events")
        return ()

    # --- worker side ---
    def register_kv_caches(self, kv_caches):
        self.rec("register_kv_caches", sorted(kv_caches))
        CACHES[self.engine_id] = kv_caches

    def set_host_xfer_buffer_ops(self, copy_operation):
        self.rec("set_host_xfer_buffer_ops")

    def get_handshake_metadata(self):
        self.rec("get_handshake_metadata")
        return KVConnectorMetadata()  # any picklable object

    def handle_preemptions(self, kv_connector_metadata):
        self.rec("handle_preemptions")

    def bind_connector_metadata(self, connector_metadata):
        self.rec("bind_connector_metadata")
        super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self):
        self.rec("clear_connector_metadata")
        super().clear_connector_metadata()

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        self.rec("start_load_kv", forward_context.attn_metadata is not None)
        self.sending |= meta.send
        for rid, (local, eng, remote, remote_rid) in meta.recv.items():
            src, dst = CACHES[eng], CACHES[self.engine_id]
            tail = remote[len(remote) - len(local):]
            for name in dst:  # blocks-first: dim 0 is the block
                dst[name][local] = src[name][tail]
            COPIED.add(remote_rid)
            self.loaded.add(rid)

    def wait_for_layer_load(self, layer_name):
        self.rec("wait_for_layer_load", layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        self.rec("save_kv_layer", layer_name)

    def wait_for_save(self):
        self.rec("wait_for_save")

    def get_finished(self, finished_req_ids):
        self.rec("get_finished", set(finished_req_ids))
        self.seen_finished |= finished_req_ids
        sent = {r for r in self.sending
                if r in COPIED and (r in self.seen_finished or self.lie)}
        self.sending -= sent
        done = {r for r in self.loaded if r not in HOLD}
        self.loaded -= done
        if self.lie == "twice" and done:
            self.loaded |= done
        return sent or None, done or None

    def get_block_ids_with_load_errors(self):
        self.rec("get_block_ids_with_load_errors")
        return set()

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        """The extra config's "layout" (None: none)."""
        return vllm_config.kv_transfer_config.get_from_extra_config(
            "layout", None)

    def shutdown(self):
        self.rec("shutdown")


def config(tag, **extra):
    return {"kv_connector": "RecordingConnector",
            "kv_connector_module_path": "test_mini_vllm_order",
            "kv_connector_extra_config": dict(tag=tag, **extra)}


# A worker's calls in a step with a forward pass (mixin.py:83-119 and
# kv_transfer_utils.py around each layer) and in one without (37-55).
LAYERS = ["model.layers.%d.self_attn.attn" % i for i in range(4)]
FORWARD = (["handle_preemptions", "bind_connector_metadata",
            ("start_load_kv", True)] +
           [m for n in LAYERS for m in (("wait_for_layer_load", n),
                                        ("save_kv_layer", n))] +
           ["wait_for_save", "get_finished",
            "get_block_ids_with_load_errors", "clear_connector_metadata"])
NO_FORWARD = ["handle_preemptions", "bind_connector_metadata",
              ("start_load_kv", False), "get_finished",
              "get_block_ids_with_load_errors", "clear_connector_metadata"]


def calls(tag, detail_of=("start_load_kv", "wait_for_layer_load",
                          "save_kv_layer", "update_state_after_alloc",
                          "get_num_new_matched_tokens")):
    """The recorded calls of one engine, as method names (with the
    detail for the methods where it is the point), then cleared."""
    out = [(m, d) if m in detail_of else m
           for t, _, m, d in CALLS if t == tag]
    CALLS[:] = [c for c in CALLS if c[0] != tag]
    return out


class Order(unittest.TestCase):
    def setUp(self):
        CALLS.clear()
        COPIED.clear()
        HOLD.clear()
        self.engines = []

    def tearDown(self):
        for e in self.engines:
            e.close()

    def engine(self, role, tag, **kw):
        extra = kw.pop("extra", {})
        e = MiniVllm(config(tag, **extra), role=role, num_blocks=64, **kw)
        self.engines.append(e)
        return e

    def test_startup(self):
        self.engine("both", "s")
        # EngineCore: the worker's connector and its caches first, then
        # the scheduler's, then the handshake (core.py:169-185)
        self.assertEqual(calls("s"), [
            "register_kv_caches", "set_host_xfer_buffer_ops",
            "bind_gpu_block_pool", "get_handshake_metadata",
            "set_xfer_handshake_metadata"])

    def prefill(self, p, prompt):
        """Steps a do_remote_decode request on p through its one
        forward step; returns (handle, the calls of that step)."""
        calls("p")
        h = p.add_request(prompt, max_tokens=1,
                          kv_transfer_params={"do_remote_decode": True})
        p.step()
        return h, calls("p")

    def test_prefill_decode(self):
        p, d = self.engine("prefill", "p"), self.engine("decode", "d")
        prompt = p.model.encode("the quick brown fox jumps over it now")  # 8
        h, step1 = self.prefill(p, prompt)
        rid = h.request_id
        self.assertEqual(step1, [
            "on_new_request", ("get_num_new_matched_tokens", (0, 0)),
            ("update_state_after_alloc", 0), "build_connector_meta"] +
            FORWARD + ["request_finished", "update_connector_output",
                       "take_events"])
        out = h.output
        self.assertTrue(out.finished)
        self.assertEqual(out.finish_reason, "length")
        params = out.kv_transfer_params
        self.assertEqual(params["remote_request_id"], rid)
        self.assertEqual(len(params["remote_block_ids"]), 2)
        held = p.free_blocks()

        # the prefill side steps with no tokens while its blocks are held;
        # the finished id reaches get_finished one step later
        p.step()
        self.assertEqual(calls("p"), ["build_connector_meta"] + NO_FORWARD +
                         ["take_events"])
        self.assertEqual(p.free_blocks(), held)

        # the decode side: an async load, a zero-token step, promotion
        calls("d")
        hd = d.add_request(prompt, max_tokens=6,
                           kv_transfer_params=dict(params))
        d.step()
        self.assertEqual(calls("d"), [
            "on_new_request", ("get_num_new_matched_tokens", (0, 8)),
            ("update_state_after_alloc", 8), "build_connector_meta"] +
            NO_FORWARD + ["update_connector_output", "take_events"])
        d.step()  # promoted; a full hit recomputes one token
        self.assertEqual(calls("d"), [
            ("update_state_after_alloc", 0), "build_connector_meta"] +
            FORWARD + ["update_connector_output", "take_events"])
        self.assertEqual(hd.output.token_ids[:1], out.token_ids)
        d.run_until_idle()
        p.run_until_idle()  # sees the copy: finished_sending frees
        self.assertEqual(p.free_blocks(), 63)
        self.assertEqual(d.free_blocks(), 63)
        # the decode side's text is a colocated run's
        col = self.engine("both", "c")
        hc = col.add_request(prompt, max_tokens=6)
        col.run_until_idle()
        self.assertEqual(hd.output.token_ids, hc.output.token_ids)
        self.assertEqual(len(hd.output.token_ids), 6)

    def test_finished_sending_frees(self):
        p = self.engine("prefill", "p")
        h, _ = self.prefill(p, list(range(1, 10)))
        COPIED.add(h.request_id)  # as if a decode side read it
        p.step()
        fin = [d for t, _, m, d in CALLS if t == "p"
               and m == "update_connector_output"]
        self.assertEqual(fin, [({h.request_id}, None)])
        self.assertEqual(p.free_blocks(), 63)
        self.assertFalse(p.has_work())

    def test_abort_waiting_for_remote_kv(self):
        p, d = self.engine("prefill", "p"), self.engine("decode", "d")
        prompt = list(range(5, 17))
        h, _ = self.prefill(p, prompt)
        hd = d.add_request(prompt, max_tokens=4,
                           kv_transfer_params=dict(h.output.kv_transfer_params))
        HOLD.add(hd.request_id)  # its load does not finish
        d.step()
        d.step()
        calls("d")
        d.abort(hd.request_id)
        d.step()
        got = calls("d")
        self.assertEqual(got[0], "request_finished")
        self.assertEqual(hd.output.finish_reason, "abort")
        # the scheduler holds the blocks until the worker's finished_recving
        self.assertLess(d.free_blocks(), 63)
        self.assertTrue(d.has_work())
        HOLD.clear()
        d.run_until_idle()
        self.assertEqual(d.free_blocks(), 63)

    def test_async_scheduling_order(self):
        e = self.engine("both", "a", async_scheduling=True)
        calls("a")
        h = e.add_request(list(range(1, 9)), max_tokens=2)
        e.step()
        e.step()
        got = calls("a")
        # step 2's build_connector_meta precedes step 1's update
        i_meta2 = [i for i, m in enumerate(got)
                   if m == "build_connector_meta"][1]
        i_upd1 = got.index("take_events")
        self.assertLess(i_meta2, i_upd1)
        e.run_until_idle()
        self.assertEqual(len(h.output.token_ids), 2)

    def test_recving_twice_fails(self):
        p, d = self.engine("prefill", "p"), self.engine("decode", "z",
                                                        extra={"lie": "twice"})
        h, _ = self.prefill(p, list(range(1, 9)))
        d.add_request(list(range(1, 9)), max_tokens=3,
                      kv_transfer_params=dict(h.output.kv_transfer_params))
        d.step()
        with self.assertRaisesRegex(AssertionError, "reported twice"):
            d.step()

    def test_sending_before_request_finished_fails(self):
        p = self.engine("prefill", "y", extra={"lie": "early"})
        h = p.add_request(list(range(1, 9)), max_tokens=3,
                          kv_transfer_params={"do_remote_decode": True})
        p.step()
        p.worker_connector.sending.add(h.request_id)
        COPIED.add(h.request_id)
        with self.assertRaisesRegex(AssertionError,
                                    "before request_finished"):
            p.step()

    def test_engine_thread(self):
        e = self.engine("both", "t")
        with e:
            out = e.generate(list(range(1, 9)), max_tokens=3, timeout=30)
        self.assertEqual(len(out.token_ids), 3)
        self.assertEqual(out.finish_reason, "length")


class Layout(unittest.TestCase):
    """The order inside a block (vLLM's get_kv_cache_layout: the
    attention backend's requirement, the user's VLLM_KV_CACHE_LAYOUT, the
    connector's, NHD) is the order the caches are allocated in, as the
    GPU model runner allocates them (the stride order's shape, permuted
    back), and the one the synthetic model writes and reads."""

    def setUp(self):
        CALLS.clear()
        COPIED.clear()
        HOLD.clear()

    def engine(self, role="both", layout=None, **kw):
        e = MiniVllm(config("l", layout=layout), role=role, num_blocks=64,
                     **kw)
        self.addCleanup(e.close)
        return e

    def test_who_decides(self):
        for layout, backend, env, want in (
                (None, None, None, "NHD"), ("HND", None, None, "HND"),
                ("NHD", None, None, "NHD"), (None, "HND", None, "HND"),
                ("HND", "NHD", None, "NHD"), ("HND", None, "NHD", "NHD"),
                (None, None, "HND", "HND")):
            with self.subTest(connector=layout, backend=backend, env=env):
                e = self.engine(layout=layout, attn_backend_layout=backend,
                                vllm_kv_cache_layout=env)
                self.assertEqual(e.kv_cache_layout, want)
        with self.assertRaisesRegex(ValueError, "Unknown cache layout"):
            self.engine(layout="LBHNC")

    def test_caches_in_that_order(self):
        """tiny: 4 tokens a block, 2 KV heads of 16."""
        for kv_layout, strides in (
                ("blocks_first", (256, 128, 16, 64, 1)),
                ("kv_first", (64 * 128, 128, 16, 64, 1)),
                ("packed", (256, 128, 32, 1)),
                ("packed_kernel", (128, 64, 32, 1)),
                ("mla", (128, 32, 1))):
            with self.subTest(kv_layout=kv_layout):
                e = self.engine(layout="HND", kv_layout=kv_layout)
                t = e.kv.tensors[LAYERS[0]]
                self.assertEqual(t.stride(), strides)
                self.assertEqual(e.kv.layout.order, pdx.NHD
                                 if kv_layout == "mla" else pdx.HND)

    def test_hnd_blocks_copied_give_the_colocated_text(self):
        """An HND prefill instance's blocks copied to an HND decode one:
        the decode side reads the next tokens from them as an NHD
        colocated instance reads its own."""
        p = self.engine("prefill", "HND")
        d = self.engine("decode", "HND")
        prompt = list(range(1, 12))
        h = p.add_request(prompt, max_tokens=1,
                          kv_transfer_params={"do_remote_decode": True})
        p.step()
        hd = d.add_request(prompt, max_tokens=6, kv_transfer_params=dict(
            h.output.kv_transfer_params))
        d.run_until_idle()
        p.run_until_idle()
        col = self.engine()
        hc = col.add_request(prompt, max_tokens=6)
        col.run_until_idle()
        self.assertEqual(col.kv_cache_layout, "NHD")
        self.assertEqual(hd.output.token_ids, hc.output.token_ids)
        self.assertEqual(len(hd.output.token_ids), 6)


if __name__ == "__main__":
    sys.modules.setdefault("test_mini_vllm_order", sys.modules["__main__"])
    unittest.main(verbosity=2)
