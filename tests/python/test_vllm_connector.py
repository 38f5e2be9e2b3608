#!/usr/bin/python3
"""pdx.vllm.PdxConnector driven in vLLM's own order (mini_vllm.py: the
scheduler and the V1 worker of vLLM 52a31cc around pdx-engine's synthetic
model), prefill and decode instances in this process, each connector with
the pdx-agent it starts itself. Every check of KV is by the decode side's
tokens: the synthetic model reads the next token back from every KV slot,
so a block that is missing or wrong changes the text; each is compared
with a colocated instance's.

Covered: a transfer (FlashAttention's blocks-first tensors, the older
K/V-first ones, MLA), vLLM's proxies' kv_transfer_params (the prefill side
told nothing but do_remote_decode), pdx-proxy's (both sides named), a
partial prefix hit on the decode side (only the tail moves), a prefill
request preempted after its send was announced (async scheduling), an abort on
the decode side before its load (the prefill side frees at once), a
transfer that failed (the sender's lease ran out; the decode side's agent
killed; layouts that differ) ending in load errors and a recompute with the
same text. The agent a worker starts ends with the worker, also one killed
with SIGKILL; an agent_listen_host it cannot listen on is named.

    test_vllm_connector.py PATH-TO-pdx-agent PATH-TO-pdx-engine
"""
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request
from types import SimpleNamespace

import pdx
from mini_vllm import MiniVllm
from rig import Agents, start_server, wait_for

AGENT = ENGINE = None
PROMPT = list(range(100, 137))   # 37 tokens: 10 blocks of 4, the last partial
PREFIX = PROMPT[:16]             # 4 whole blocks


def config(**extra):
    x = {"agent_bin": AGENT, "xfer_timeout_ms": 5000,
         "agent_args": ["--lease-ms", "3000"]}
    x.update(extra)
    return {"kv_connector": "PdxConnector",
            "kv_connector_module_path": "pdx.vllm",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": x}


class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


class Instances(unittest.TestCase):
    """A prefill, a decode and a colocated instance with kv_layout."""
    kv_layout = "blocks_first"
    cfg_p = cfg_d = None

    def setUp(self):
        self.warnings = Warnings()
        logging.getLogger("pdx.vllm").addHandler(self.warnings)
        self.addCleanup(logging.getLogger("pdx.vllm").removeHandler,
                        self.warnings)
        self.P = self.start(MiniVllm(self.cfg_p or config(), role="prefill",
                                     kv_layout=self.kv_layout))
        self.D = self.start(MiniVllm(self.cfg_d or config(), role="decode",
                                     kv_layout=self.kv_layout))
        self.C = self.start(MiniVllm(None, kv_layout=self.kv_layout))
        self.free_p, self.free_d = self.P.free_blocks(), self.D.free_blocks()

    def start(self, eng):
        self.addCleanup(eng.close)
        return eng.start()

    def worker(self, eng):
        return eng.worker_connector._worker

    def prefill(self, prompt=PROMPT, params=None):
        out = self.P.generate(prompt, 1, params or {"do_remote_decode": True,
                                                    "do_remote_prefill": False,
                                                    "remote_engine_id": None,
                                                    "remote_block_ids": None,
                                                    "remote_host": None,
                                                    "remote_port": None})
        self.assertEqual(out.finish_reason, "length")
        return out

    def colocated(self, prompt=PROMPT, n=8):
        return self.C.generate(prompt, n).token_ids

    def all_freed(self, timeout=10):
        ok = wait_for(lambda: self.P.free_blocks() == self.free_p and
                      self.D.free_blocks() == self.free_d, timeout)
        self.assertTrue(ok, "blocks held: prefill %d of %d free, decode %d "
                        "of %d" % (self.P.free_blocks(), self.free_p,
                                   self.D.free_blocks(), self.free_d))


class Transfer(Instances):
    def test_vllm_proxy_params_move_the_kv(self):
        p = self.prefill().kv_transfer_params
        self.assertEqual((p["do_remote_prefill"], p["do_remote_decode"]),
                         (True, False))
        self.assertEqual(p["remote_agent"], self.worker(self.P).peer_addr)
        self.assertEqual(len(p["xfer_id"]), 32)
        out = self.D.generate(PROMPT, 8, dict(p))
        self.assertEqual(out.token_ids, self.colocated())
        self.assertEqual(self.worker(self.D).stats["received"], 1)
        self.assertEqual(self.worker(self.D).stats["failed"], 0)
        self.all_freed()
        self.assertEqual(self.worker(self.P).stats["sent"], 1)

    def test_both_sides_named_up_front(self):
        """pdx-proxy's concurrent flow: the id and each other's agent."""
        x = pdx.XferId().hex
        pa, da = self.worker(self.P).peer_addr, self.worker(self.D).peer_addr
        h = self.D.add_request(PROMPT, 8, {"do_remote_prefill": True,
                                           "xfer_id": x, "remote_agent": pa})
        self.prefill(params={"do_remote_decode": True, "xfer_id": x,
                             "remote_agent": da})
        self.assertEqual(h.result(30).token_ids, self.colocated())
        self.all_freed()

    def test_partial_prefix_hit_moves_only_the_tail(self):
        self.D.generate(PREFIX, 1)       # the decode side caches 4 blocks
        p = self.prefill().kv_transfer_params
        out = self.D.generate(PROMPT, 8, dict(p))
        self.assertEqual(out.token_ids, self.colocated())
        st, m = self.worker(self.D).stats, self.P.model
        # the caches' blocks: kernel blocks of half a block when split
        bt = m.block_tokens // (2 if self.kv_layout == "packed_kernel"
                                else 1)
        block = m.layers * 2 * bt * m.kv_heads * m.head_dim * \
            m.dtype_bytes               # one block, every layer, K and V
        n = -(-(len(PROMPT) - len(PREFIX)) // bt)
        self.assertEqual((st["received"], st["bytes_received"]),
                         (1, n * block),
                         "only the %d blocks after the hit" % n)
        self.all_freed()


class TransferKvFirst(Instances):
    kv_layout = "kv_first"
    test_moves = Transfer.test_vllm_proxy_params_move_the_kv


class TransferMla(Instances):
    kv_layout = "mla"
    test_moves = Transfer.test_vllm_proxy_params_move_the_kv


class NewerVllmOrder(unittest.TestCase):
    """vLLM after PR 53333 calls start_load_kv after the forward when no
    load of the step is synchronous (never one of ours): the layers are
    still pushed as the forward computes them, not all at its end."""

    def test_layers_pushed_during_the_forward(self):
        P = MiniVllm(config(), role="prefill", deferred_load_start=True)
        self.addCleanup(P.close)
        D = MiniVllm(config(), role="decode", deferred_load_start=True)
        self.addCleanup(D.close)
        C = MiniVllm(None)
        self.addCleanup(C.close)
        for e in (P, D, C):
            e.start()
        eng, calls = P.worker_connector._worker.eng, []
        done = eng.layer_done

        def spy(layer, xfers, *a, **k):
            calls.append((layer, P.worker.in_forward))
            return done(layer, xfers, *a, **k)
        eng.layer_done = spy
        p = P.generate(PROMPT, 1, {"do_remote_decode": True})
        self.assertEqual(sorted(c[0] for c in calls),
                         list(range(P.model.layers)))
        self.assertTrue(all(c[1] for c in calls),
                        "layers marked done after the forward: %s" % calls)
        out = D.generate(PROMPT, 8, p.kv_transfer_params)
        self.assertEqual(out.token_ids, C.generate(PROMPT, 8).token_ids)
        self.assertEqual(D.worker_connector._worker.stats["received"], 1)


class TransferPacked(Instances):
    """vLLM after PR 44455: K and V packed in one tensor per layer."""
    kv_layout = "packed"
    test_moves = Transfer.test_vllm_proxy_params_move_the_kv


class TransferPackedKernel(Instances):
    """The packed caches as vLLM hands them when the attention backend
    cannot run the block size: kernel blocks of half a block, the
    scheduler's ids counting whole ones (the blocks sent were others, and
    the text wrong without a word)."""
    kv_layout = "packed_kernel"
    test_moves = Transfer.test_vllm_proxy_params_move_the_kv
    test_prefix_hit = Transfer.test_partial_prefix_hit_moves_only_the_tail

    def test_failed_load_names_the_schedulers_blocks(self):
        """A receive that fails (a transfer the prefill side never had)
        reports the scheduler's block ids, not the kernel blocks'; vLLM
        computes those blocks again, and the text is the colocated one."""
        p = dict(self.prefill().kv_transfer_params,
                 xfer_id=pdx.XferId().hex)
        out = self.D.generate(PROMPT, 8, p)
        self.assertEqual(out.token_ids, self.colocated())
        self.assertEqual(self.worker(self.D).stats["failed"], 1)


class Failures(Instances):
    def test_abort_before_the_load_frees_the_prefill_side(self):
        p = self.prefill().kv_transfer_params
        held = self.P.free_blocks()
        self.assertLess(held, self.free_p, "the prefill side holds the KV")
        h = self.D.add_request(PROMPT, 8, dict(p))
        self.D.abort(h.request_id)
        h.result(10)
        t0 = time.monotonic()
        self.all_freed(timeout=2.5)  # well before the 3 s lease
        self.assertLess(time.monotonic() - t0, 2.5)

    def test_prefill_aborted_before_its_send_ends_the_decode_wait(self):
        """Both sides named (pdx-proxy's concurrent flow): the decode side
        asks first; the prefill request leaves before its send: the
        decode side hears at once, not at its transfer's bound (5 s)."""
        x = pdx.XferId().hex
        pa, da = self.worker(self.P).peer_addr, self.worker(self.D).peer_addr
        h = self.D.add_request(PROMPT, 8, {"do_remote_prefill": True,
                                           "xfer_id": x, "remote_agent": pa})
        self.assertTrue(wait_for(lambda: self.D.free_blocks() < self.free_d,
                                 5), "the decode side allocates and asks")
        t0 = time.monotonic()
        hp = self.P.add_request(PROMPT, 1, {"do_remote_decode": True,
                                            "xfer_id": x, "remote_agent": da})
        self.P.abort(hp.request_id)
        self.assertEqual(hp.result(10).finish_reason, "abort")
        self.assertEqual(h.result(10).token_ids, self.colocated())
        self.assertLess(time.monotonic() - t0, 2.5)
        self.assertEqual(self.worker(self.D).stats["failed"], 1)
        self.all_freed()

    def test_expired_lease_is_a_load_error_then_a_recompute(self):
        p = self.prefill().kv_transfer_params
        self.all_freed(timeout=8)    # the lease (3 s) ends: sender frees
        out = self.D.generate(PROMPT, 8, dict(p))
        self.assertEqual(out.token_ids, self.colocated())
        self.assertEqual(self.worker(self.D).stats["failed"], 1)
        self.assertTrue(any("failed" in w for w in self.warnings.lines),
                        self.warnings.lines)
        self.all_freed()

    def test_an_id_in_flight_is_not_taken_twice(self):
        """Two prefill requests with one xfer_id (a client may put it in
        the body): the second answered it too, and its decode side read
        the first's KV: wrong text, no error. It now runs without a
        transfer (no kv_transfer_params: its decode side prefills)."""
        x = pdx.XferId().hex
        other = [t + 1 for t in PROMPT]
        ha = self.P.add_request(PROMPT, 1, {"do_remote_decode": True,
                                            "xfer_id": x})
        hb = self.P.add_request(other, 1, {"do_remote_decode": True,
                                           "xfer_id": x})
        pa, pb = ha.result(10).kv_transfer_params, \
            hb.result(10).kv_transfer_params
        self.assertEqual(pa["xfer_id"], x)
        self.assertIsNone(pb)
        self.assertTrue(any("another request's" in w
                            for w in self.warnings.lines),
                        self.warnings.lines)
        # the first finished, its send waiting for the decode side: the
        # id is still taken (the old guard looked at unfinished requests)
        late = self.P.generate(other, 1, {"do_remote_decode": True,
                                          "xfer_id": x})
        self.assertIsNone(late.kv_transfer_params)
        out = self.D.generate(PROMPT, 8, dict(pa))
        self.assertEqual(out.token_ids, self.colocated())
        self.all_freed()
        # sent: the id is free again (and spent at the agents)
        again = self.P.generate(other, 1, {"do_remote_decode": True,
                                           "xfer_id": pdx.XferId().hex})
        self.assertIsNotNone(again.kv_transfer_params)

    def test_a_killed_agent_is_started_again(self):
        """The prefill side's agent (started by the connector) killed: the
        worker starts it again at its addresses, the engine registers
        again by itself, and transfers work again. Before, every send
        failed, and decode sides were named the dead agent, for as long
        as the worker lived."""
        w = self.worker(self.P)
        addr = w.peer_addr
        w.agent.proc.kill()
        w.agent.proc.wait()
        self.prefill()  # its send fails; the step restarts the agent
        self.assertTrue(any("starting it again" in m
                            for m in self.warnings.lines),
                        self.warnings.lines)

        def linked():  # a step: the worker reads its link (registers)
            self.P.generate([1, 2, 3], 1)
            return w.eng.link_status()[0]
        self.assertTrue(wait_for(linked, 10), w.eng.link_status())
        p = self.prefill().kv_transfer_params
        self.assertEqual(p["remote_agent"], addr)
        out = self.D.generate(PROMPT, 8, dict(p))
        self.assertEqual(out.token_ids, self.colocated())
        self.assertEqual(self.worker(self.D).stats["received"], 1)
        self.all_freed()

    def test_killed_agent_is_a_load_error_then_a_recompute(self):
        p = self.prefill().kv_transfer_params
        self.worker(self.D).agent.proc.kill()
        self.worker(self.D).agent.proc.wait()
        out = self.D.generate(PROMPT, 8, dict(p))
        self.assertEqual(out.token_ids, self.colocated())
        self.assertEqual(self.worker(self.D).stats["failed"], 1)


class AgentDiesMidForward(Instances):
    """The prefill agent dies between two layers of the forward that
    announced a send: the send fails (libpdx's EAGENT), not vLLM's step:
    raised out of save_kv_layer, the error ended EngineCore."""
    def setUp(self):
        self.cfg_p = config(liveness_ms=300)
        super().setUp()

    def test_the_send_fails_not_the_step(self):
        w = self.worker(self.P)
        saved = w.layer_saved

        def layer_saved(name):
            if w._step_sends and w._step_layers:  # after layer 0
                w.agent.proc.kill()
                w.agent.proc.wait()
                time.sleep(0.6)  # past liveness_ms: the link is down
            saved(name)
        w.layer_saved = layer_saved
        out = self.P.generate(PROMPT, 1, {"do_remote_decode": True})
        self.assertEqual(out.finish_reason, "length")
        self.assertTrue(wait_for(lambda: w.stats["failed"] == 1, 5),
                        w.stats)
        self.assertTrue(any("they fail" in m for m in self.warnings.lines),
                        self.warnings.lines)
        self.all_freed()


class Preemption(unittest.TestCase):
    """Async scheduling (vLLM's batch queue) can preempt a prefill request
    while the step that computed its last chunk, and announced its send,
    is in flight: its blocks go to another request in the next step, and
    the request stops with the token that step sampled (vLLM's
    stopped_preempted_reqs). The send is aborted before that next
    forward, and the request ends without kv_transfer_params: the decode
    side prefills itself and gives the colocated text; the agent never
    sends blocks another request has written."""

    def preempt_a(self, **older_or_newer):
        """A preempted as the class says: (P, D, C, a) with A and B
        finished, P stepped here by hand. 13 usable blocks: B takes 3,
        A's 37 tokens the other 10; B's next token needs a 14th, and A,
        the last running, is preempted. B's tokens after it land in A's
        freed blocks, the last (whose one token the decode side computes
        again) and the one before."""
        P = MiniVllm(config(), role="prefill", num_blocks=14,
                     async_scheduling=True, **older_or_newer)
        self.addCleanup(P.close)
        D = MiniVllm(config(), role="decode").start()
        self.addCleanup(D.close)
        C = MiniVllm(None).start()
        self.addCleanup(C.close)
        self.free = P.free_blocks()
        victims = []
        preempt = P.scheduler._preempt
        P.scheduler._preempt = lambda r: (victims.append(r.request_id),
                                          preempt(r))[1]
        b = P.add_request(list(range(200, 212)), 8)
        P.step()
        a = P.add_request(PROMPT, 1, {"do_remote_decode": True,
                                      "do_remote_prefill": False})
        for _ in range(40):   # until A ends (its free may be delayed)
            P.step()
            if a.output.finished and b.output.finished:
                break
        self.assertEqual(victims, [a.output.request_id])
        self.assertEqual(a.output.finish_reason, "length")
        self.assertEqual(len(b.output.token_ids), 8)
        self.assertEqual(P.worker_connector._worker.stats["failed"], 1,
                         "the send aborted")
        return P, D, C, a

    def test_preempted_after_its_send_ends_without_a_transfer(self):
        P, D, C, a = self.preempt_a()
        self.assertIsNone(a.output.kv_transfer_params)
        out = D.generate(PROMPT, 8, a.output.kv_transfer_params)
        self.assertEqual(out.token_ids, C.generate(PROMPT, 8).token_ids)
        P.run_until_idle()
        self.assertEqual(P.free_blocks(), self.free)

    def test_older_vllm_hands_preemptions_by_id(self):
        """vLLM before 0.20 (base.py at 13f4ad0f) passes the preempted
        requests' ids to handle_preemptions: the send is aborted all the
        same, before the next forward (the worker failed on a set without
        .preempted, which ends vLLM's EngineCore)."""
        P, D, C, a = self.preempt_a(preemptions_by_id=True)
        self.assertIsNone(a.output.kv_transfer_params)
        P.run_until_idle()
        self.assertEqual(P.free_blocks(), self.free)

    def test_computed_again_after_preemption_sends_again(self):
        """vLLM after PR 50297: the connector requires KV delivery, so
        the preempted request loses that step's token and is computed
        again once B is done. Its send, aborted as above, goes again
        under a new xfer_id, and the decode side loads the prompt's KV
        rather than computing it (before: no kv_transfer_params, the
        prefill computed twice and the decode side a third time)."""
        P, D, C, a = self.preempt_a(drops_stale_output=True)
        self.assertEqual(len(a.output.token_ids), 1, "the stale token kept")
        kv = a.output.kv_transfer_params
        self.assertIsNotNone(kv, "no transfer after the request was "
                             "computed again")
        out = D.generate(PROMPT, 8, kv)
        self.assertEqual(out.token_ids, C.generate(PROMPT, 8).token_ids)
        self.assertEqual(D.worker_connector._worker.stats["received"], 1,
                         "the decode side computed the prompt itself")
        P.run_until_idle()
        self.assertEqual(P.worker_connector._worker.stats["sent"], 1)
        self.assertEqual(P.free_blocks(), self.free)


def decode_checked(test, D, params, want):
    """PROMPT's decode on D (stepped here) with params: once its first
    token is out every rank holds the prompt's KV of its heads byte for
    byte; then the text is want and each rank received once."""
    h = D.add_request(PROMPT, 8, params)
    rid, end = h.output.request_id, time.monotonic() + 20
    while len(D.worker.states.get(rid, SimpleNamespace(tokens=()))
              .tokens) <= len(PROMPT):
        test.assertLess(time.monotonic(), end, "no token after the load")
        if D.step() == 0:
            time.sleep(0.002)
    test.assertEqual(D.check_kv(rid, len(PROMPT)), -1,
                     "a decode rank's KV differs")
    D.run_until_idle()
    test.assertEqual(h.output.token_ids, want)
    for w in D.workers:
        st = w.connector._worker.stats
        test.assertEqual((st["received"], st["failed"]), (1, 0))


class TensorParallel(unittest.TestCase):
    """Instances of tensor-parallel size 2 (a worker per rank, each with
    its share of the KV heads and the agent it starts), and of other
    sizes on the two sides (the agents take each decode rank's heads from
    the prefill ranks that hold them), driven by vLLM's proxies'
    kv_transfer_params: the prefill side answers every rank's agent, each
    decode rank holds the prompt's KV of its heads byte for byte, the
    text is a colocated TP 1 instance's, and every block is freed."""

    def pair(self, p_tp, d_tp, kv_layout="blocks_first"):
        P = MiniVllm(config(), role="prefill", tp_size=p_tp,
                     kv_layout=kv_layout).start()
        self.addCleanup(P.close)
        D = MiniVllm(config(), role="decode", tp_size=d_tp,
                     kv_layout=kv_layout)  # stepped here
        self.addCleanup(D.close)
        C = MiniVllm(None, kv_layout=kv_layout).start()
        self.addCleanup(C.close)
        free_p, free_d = P.free_blocks(), D.free_blocks()
        p = P.generate(PROMPT, 1, {"do_remote_decode": True}).kv_transfer_params
        self.assertEqual(p.get("remote_agents", [p["remote_agent"]]),
                         [w.connector._worker.peer_addr for w in P.workers])
        decode_checked(self, D, dict(p), C.generate(PROMPT, 8).token_ids)
        self.assertTrue(wait_for(lambda: P.free_blocks() == free_p, 10),
                        "the prefill side holds blocks")
        self.assertEqual(D.free_blocks(), free_d)

    def test_2_to_2(self):
        self.pair(2, 2)

    def test_1_to_2(self):
        self.pair(1, 2)

    def test_2_to_1(self):
        self.pair(2, 1)

    def test_mla_2_to_1(self):
        """MLA: the latent whole on every rank, taken from one."""
        self.pair(2, 1, "mla")

    def test_packed_2_to_2(self):
        """Packed K and V: each rank's heads from its peer rank."""
        self.pair(2, 2, "packed")


class TensorParallelEngine(unittest.TestCase):
    """PdxConnector at TP 2 and a pdx-engine instance of TP 2 (a process
    and an agent per rank, rank 0 serving HTTP) move KV to each other,
    both ways, with vLLM's proxies' kv_transfer_params: they name the
    same transfer id on every rank and each rank's agent. The decode side
    checks what it received (pdx-engine probes every block, the
    connector's ranks are checked byte for byte) and gives the text a
    colocated instance gives. pdx-engine's blocks are NHD: the
    connector's instances are told so (VLLM_KV_CACHE_LAYOUT), before
    its own HND."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="pdx-vtp-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.procs = []
        self.addCleanup(self.stop)

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            self.assertEqual(p.wait(20), 0)

    def engine(self, name, *args):
        """A pdx-engine --model tiny; rank 0's (or a lone engine's) URL."""
        cmd = [ENGINE, "--model", "tiny", "--time-scale", "0", *args]
        with open(os.path.join(self.tmp, name + ".log"), "w") as log:
            if "--tp-rank" in args:
                self.procs.append(subprocess.Popen(
                    cmd, stdout=subprocess.DEVNULL, stderr=log))
                return None
            p, url = start_server(cmd + ["--port", "0"], log)
        self.procs.append(p)
        return url

    def tp_engine(self, role):
        ag = Agents(AGENT, "r0", "r1")
        self.addCleanup(ag.close)
        tp = ["--role", role, "--tp-size", "2",
              "--tp-leader", "ipc://%s/%s.tp" % (self.tmp, role)]
        url = self.engine(role, *tp, "--agent", ag.engine("r0"))
        self.engine(role + "1", *tp, "--tp-rank", "1", "--agent",
                    ag.engine("r1"))
        self.assertTrue(wait_for(lambda: self.status(url + "/health") ==
                                 200, 10), "the TP engine is not ready")
        return url

    @staticmethod
    def status(url):
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None

    @staticmethod
    def complete(url, n, kv=None):
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": n}
        if kv is not None:
            body["kv_transfer_params"] = kv
        req = urllib.request.Request(url + "/v1/completions",
                                     json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def test_connector_prefill_to_engine_decode(self):
        P = MiniVllm(config(), role="prefill", tp_size=2,
                     vllm_kv_cache_layout="NHD").start()
        self.addCleanup(P.close)
        d_url = self.tp_engine("decode")
        colocated = self.engine("colocated")
        p = P.generate(PROMPT, 1, {"do_remote_decode": True}).kv_transfer_params
        self.assertEqual(p["remote_tp_size"], 2)
        got = self.complete(d_url, 8, p)["choices"][0]["text"]
        self.assertEqual(got, self.complete(colocated, 8)["choices"][0]["text"])
        self.assertTrue(wait_for(lambda: all(
            w.connector._worker.stats["sent"] == 1 for w in P.workers), 10),
            [dict(w.connector._worker.stats) for w in P.workers])

    def test_engine_prefill_to_connector_decode(self):
        p_url = self.tp_engine("prefill")
        D = MiniVllm(config(), role="decode", tp_size=2,
                     vllm_kv_cache_layout="NHD")  # stepped here
        self.addCleanup(D.close)
        C = MiniVllm(None).start()
        self.addCleanup(C.close)
        kv = self.complete(p_url, 1, {"do_remote_decode": True})[
            "kv_transfer_params"]
        self.assertEqual(len(kv["remote_agents"]), 2)
        decode_checked(self, D, kv, C.generate(PROMPT, 8).token_ids)


class LayoutMismatch(Instances):
    """A prefill instance with MLA tensors, a decode one with K and V."""
    p_kw, d_kw = {"kv_layout": "mla"}, {}
    said = "tensors"   # in the decode side's warning

    def setUp(self):
        self.warnings = Warnings()
        logging.getLogger("pdx.vllm").addHandler(self.warnings)
        self.addCleanup(logging.getLogger("pdx.vllm").removeHandler,
                        self.warnings)
        self.P = self.start(MiniVllm(config(), role="prefill", **self.p_kw))
        self.D = self.start(MiniVllm(config(), role="decode", **self.d_kw))
        self.C = self.start(MiniVllm(None))
        self.free_p, self.free_d = self.P.free_blocks(), self.D.free_blocks()

    def test_refused_saying_why_then_recomputed(self):
        p = self.prefill().kv_transfer_params
        out = self.D.generate(PROMPT, 8, dict(p))
        self.assertEqual(out.token_ids, self.colocated())
        self.assertEqual(self.worker(self.D).stats["failed"], 1)
        self.assertRegex(" ".join(self.warnings.lines), self.said)


class KvDtypeMismatch(LayoutMismatch):
    """A prefill instance whose --kv-cache-dtype is fp8_e5m2, a decode
    one at fp8_e4m3: the same bytes (1 each), which the layout alone
    paired, and each side would have read the other's KV as its own."""
    p_kw, d_kw = {"kv_cache_dtype": "fp8_e5m2"}, {"kv_cache_dtype": "fp8"}
    said = ("KV element types differ .*(float8_e5m2 != float8_e4m3fn|"
            "float8_e4m3fn != float8_e5m2)")


def running(pid):
    """pid runs (a zombie does not: where PID 1 does not reap it, the
    agent killed stays one)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


class AgentLife(unittest.TestCase):
    """The agent a worker starts (pdx.vllm.agent.AgentProcess, pdx.sglang's
    too) ends with it however the worker ends, and a listen host it
    cannot use is an error that names the setting."""

    def test_agent_dies_with_its_killed_worker(self):
        """A worker killed with SIGKILL (atexit does not run) left its
        agent running under PID 1, holding its port and the KV pool."""
        worker = subprocess.Popen(
            [sys.executable, "-c",
             "import sys, time\n"
             "from pdx.vllm.agent import AgentProcess\n"
             "a = AgentProcess(sys.argv[1])\n"
             "print(a.proc.pid, a.dir, flush=True)\n"
             "time.sleep(60)\n", AGENT],
            stdout=subprocess.PIPE, text=True)
        self.addCleanup(worker.stdout.close)
        self.addCleanup(worker.wait)
        self.addCleanup(worker.kill)
        pid, tmp = worker.stdout.readline().split()
        pid = int(pid)
        self.addCleanup(shutil.rmtree, tmp, True)
        worker.kill()
        worker.wait()
        gone = wait_for(lambda: not running(pid), 5)
        if not gone:
            os.kill(pid, signal.SIGKILL)
        self.assertTrue(gone, "pdx-agent %d outlived its worker" % pid)

    def test_a_host_it_cannot_listen_on_names_the_setting(self):
        """It was a bare OSError [Errno 99], and left a directory behind."""
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp, True)
        self.addCleanup(setattr, tempfile, "tempdir", tempfile.tempdir)
        tempfile.tempdir = tmp  # the worker's mkdtemp, seen alone here
        from pdx.vllm.worker import PdxWorker
        cfg = SimpleNamespace(kv_transfer_config=SimpleNamespace(
            kv_connector_extra_config=config(agent_listen_host="192.0.2.1")[
                "kv_connector_extra_config"]))
        with self.assertRaises(RuntimeError) as cm:
            PdxWorker(cfg, rank=0)
        self.assertIn("agent_listen_host", str(cm.exception))
        self.assertIn("192.0.2.1", str(cm.exception))
        self.assertEqual(os.listdir(tmp), [])

    def test_settings_misspelt_or_not_ints_are_said(self):
        """A key PdxConnector does not know is named in a warning (it was
        ignored without a word); a timeout that is no integer names its
        key before any agent starts (int() named only the value)."""
        from pdx.vllm.worker import PdxWorker

        def cfg(**extra):
            return SimpleNamespace(kv_transfer_config=SimpleNamespace(
                kv_connector_extra_config=extra))
        for v in ("5s", 2.5, None, True, float("inf"), -1):
            with self.subTest(v=v):
                with self.assertRaisesRegex(
                        ValueError, "kv_connector_extra_config "
                        "xfer_timeout_ms: want an integer"):
                    PdxWorker(cfg(agent="ipc:///nonexistent/x",
                                  xfer_timeout_ms=v), rank=0)
        with self.assertLogs("pdx.vllm", "WARNING") as logs:
            w = PdxWorker(cfg(agent="ipc:///nonexistent/x",
                              livenes_ms=500), rank=0)
        w.close()
        self.assertIn("'livenes_ms': not a key of PdxConnector's",
                      "\n".join(logs.output))

    def test_agent_args_as_one_string(self):
        """agent_args given as one string is split as a shell would (its
        letters were passed one by one: "unexpected argument -"); a
        list of anything else is refused naming the key."""
        from pdx.vllm.worker import PdxWorker

        def worker(args):
            cfg = SimpleNamespace(
                kv_transfer_config=SimpleNamespace(
                    kv_connector_extra_config=config(agent_args=args)[
                        "kv_connector_extra_config"]),
                parallel_config=SimpleNamespace(tensor_parallel_size=1))
            return PdxWorker(cfg, rank=0)
        w = worker("--lease-ms 3000 --heartbeat-ms 500")
        try:
            self.assertIsNone(w.agent.proc.poll(), w.agent.log_tail())
        finally:
            w.close()
        with self.assertRaises(ValueError) as cm:
            worker(["--lease-ms", 3000])
        self.assertIn("agent_args", str(cm.exception))


class Params(unittest.TestCase):
    def test_a_flag_that_is_no_bool_is_said(self):
        """\"do_remote_prefill\": \"true\" (a string) ran without a transfer
        and without a word; now the scheduler's warning names it."""
        from pdx.vllm import params
        for read, key in ((params.read_recv, "do_remote_prefill"),
                          (params.read_send, "do_remote_decode")):
            with self.assertRaisesRegex(ValueError, "kv_transfer_params.%s: "
                                        "want true or false, not 'true'"
                                        % key):
                read({key: "true", "xfer_id": "0" * 32,
                      "remote_agent": "tcp://127.0.0.1:1"})
            self.assertIsNone(read({key: False}))
            self.assertIsNone(read({}))

    def test_kernel_ids(self):
        """Scheduler blocks of 32 tokens as kernel blocks of 16: a 40-token
        prompt fills 3 (not the 4 of its 2 blocks: a peer with blocks of
        16 expects 3), and whole blocks without a token count."""
        from pdx.vllm.worker import kernel_ids
        self.assertEqual(kernel_ids([5, 9], 2, 40, 16), [10, 11, 18])
        self.assertEqual(kernel_ids([5, 9], 2, 0, 16), [10, 11, 18, 19])
        self.assertEqual(kernel_ids([5, 9], 2, 64, 16), [10, 11, 18, 19])
        self.assertEqual(kernel_ids([5, 9], 1, 40, 32), [5, 9])

    def test_kv_dtype_names(self):
        from pdx.vllm.worker import kv_dtype_name
        import torch
        t = {"l0": torch.zeros(2, dtype=torch.float16)}
        self.assertEqual(kv_dtype_name("auto", t), "float16")
        self.assertEqual(kv_dtype_name("fp8", t), "float8_e4m3fn")
        self.assertEqual(kv_dtype_name("fp8_e4m3", t), "float8_e4m3fn")
        self.assertEqual(kv_dtype_name("fp8_e5m2", t), "float8_e5m2")
        self.assertIsNone(kv_dtype_name("auto", {}))


class FakeCudaTensor:
    """What register_kv_caches reads of a tensor, claiming to be on a GPU
    (this machine has none)."""
    def __init__(self, ptr):
        self.shape, self.device, self.ptr = (64, 2, 4, 2, 16), "cuda:0", ptr

    def stride(self):
        return (256, 128, 32, 16, 1)

    def element_size(self):
        return 2

    def data_ptr(self):
        return self.ptr


class LayoutRules(unittest.TestCase):
    """What register_kv_caches refuses, saying why."""

    def test_refusals(self):
        import torch
        from pdx.vllm import layout
        with self.assertRaises(ValueError) as cm:
            layout.build({"model.layers.0.attn": torch.zeros(3, 4)})
        self.assertIn("shape (3, 4)", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            layout.build({"attn": torch.zeros(64, 2, 4, 2, 16)})
        self.assertIn("no layer number", str(cm.exception))
        with self.assertRaises(pdx.Error) as cm:
            layout.build({"model.layers.0.attn": torch.zeros(64, 2, 4, 2, 16)})
        self.assertIn("SharedPool", cm.exception.reason)
        with pdx.SharedPool(64 * 2 * 256) as pool:
            host = torch.frombuffer(pool.buf, dtype=torch.bfloat16).view(
                64, 2, 4, 2, 16)
            with self.assertRaises(ValueError) as cm:
                layout.build({"model.layers.0.attn": host,
                              "model.layers.1.attn": FakeCudaTensor(1 << 40)})
            self.assertIn("cpu and cuda", str(cm.exception))
            del host
        # packed K and V (vLLM after PR 44455), tokens or heads outermost
        # in memory by the strides; any other order is refused
        with pdx.SharedPool(64 * 2 * 4 * 32 * 2) as pool:
            flat = torch.frombuffer(pool.buf, dtype=torch.bfloat16)
            nhd = flat.view(64, 4, 2, 32).permute(0, 2, 1, 3)
            hnd = flat.view(64, 2, 4, 32)
            for t, order in ((nhd, pdx.NHD), (hnd, pdx.HND)):
                lay, _, _, _ = layout.build({"model.layers.0.attn": t})
                self.assertEqual((lay.tensors, lay.kv_heads, lay.head_dim,
                                  lay.block_tokens, lay.order),
                                 (1, 2, 32, 4, order))
                self.assertEqual(lay.block_stride, [4 * 2 * 32 * 2])
            with self.assertRaises(ValueError) as cm:
                layout.build({"model.layers.0.attn":
                              flat.view(64, 32, 4, 2).permute(0, 3, 2, 1)})
            self.assertIn("packed block", str(cm.exception))
            # MLA's latent given 4-D (one head) by a later vLLM: NHD
            # whatever the head's stride (LBHNC's made it HND, which MLA
            # peers of the other orders refused); one head of MHA keeps
            # the order of its strides (its peers at other TP sizes hold
            # more heads, in that order)
            for t in (flat.view(64, 4, 1, 64).permute(0, 2, 1, 3),
                      flat.view(64, 1, 4, 64)):
                lay, _, _, _ = layout.build({"model.layers.0.attn": t},
                                            mla=True)
                self.assertEqual((lay.kv_heads, lay.order), (1, pdx.NHD))
            lay, _, _, _ = layout.build(
                {"model.layers.0.attn": flat.view(64, 1, 4, 64)})
            self.assertEqual((lay.kv_heads, lay.order), (1, pdx.HND))
            del flat, nhd, hnd, t
        # GPU tensors go to libpdx's CUDA side: without a GPU it says so
        with self.assertRaises(pdx.Error) as cm:
            layout.build({"model.layers.0.attn": FakeCudaTensor(1 << 40)})
        self.assertIn("cuda", cm.exception.reason.lower())


if __name__ == "__main__":
    AGENT, ENGINE = sys.argv.pop(1), sys.argv.pop(1)
    os.environ.setdefault("UCX_TLS", "sm,self")
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    unittest.main(verbosity=2)
