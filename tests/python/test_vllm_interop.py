#!/usr/bin/python3
"""PdxConnector and pdx-engine moving KV to each other, over real HTTP
and real processes, as a deployment would run them: mini_vllm_serve
(vLLM's call order around PdxConnector, which starts its own pdx-agent;
FlashAttention's blocks-first tensors and asynchronous scheduling,
vLLM's defaults, HND as PdxConnector asks, the agents converting from
and to pdx-engine's NHD) and pdx-engine (with its pdx-agent), one the
prefill side and the other the decode side, both ways:

    Python prefill -> pdx-engine decode    pdx-engine prefill -> Python decode

each behind pdx-proxy's concurrent flow (both sides named up front, the
KV pushed while the prompt is computed), its sequential flow (P, then D
with P's answer) and vLLM's own toy_proxy_server.py, unchanged (the
prefill side told nothing but do_remote_decode; read from
../shared/peers/vllm/, skipped when it or FastAPI is missing), for
/v1/completions and /v1/chat/completions, streamed and not, one at a
time and eight at once.

Every answer must be the text a colocated pdx-engine --model tiny gives
for the same body: the synthetic model reads each next token back from
the KV, so a block that did not arrive, or arrived wrong, changes it.
Every prompt is new to both sides (but for a chat's first block, the
template's: a decode side's prefix hit, only the rest moves), and neither
decode side may recompute: pdx-proxy's on_failure is "fail" and the
Python decode side's kv_load_failure_policy too. After each proxy's
requests the decode side counts one transfer received per request, the
prefill side one sent, none failed (PdxConnector's worker stats through
mini_vllm_serve's /metrics, the agent's pdx_agent_transfers_total for
pdx-engine), and no KV block is held on either side.

    test_vllm_interop.py PDX_ENGINE PDX_AGENT PDX_PROXY
"""
import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
import urllib.request

from rig import Agents, free_port, start_server, wait_for
from test_mini_vllm_http import post, text_of

HERE = os.path.dirname(os.path.abspath(__file__))
TOY = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared",
                                    "peers", "vllm", "toy_proxy_server.py"))
TOY_RUN = os.path.join(HERE, "..", "e2e", "toy_proxy_run.py")
ENGINE = AGENT = PROXY = None
SETTLE_S = 15
SERIAL = itertools.count(1)


def scrape(url):
    """/metrics as {(name, frozenset(labels)): value}."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, val = line.rpartition(" ")
        name, _, labels = key.partition("{")
        pairs = frozenset(tuple(kv.split("=", 1)) for kv in
                          labels.rstrip("}").replace('"', "").split(",")
                          if kv)
        out[(name, pairs)] = float(val)
    return out


def total(url, name, **labels):
    """The sum of NAME's samples that carry these labels."""
    want = set(labels.items())
    return sum(v for (n, ls), v in scrape(url).items()
               if n == name and want <= ls)


class Side:
    """One side's counters: transfers ended (outcome sent, received,
    failed) and KV blocks in use, through a /metrics."""

    def __init__(self, name, url, counters, transfers, outcome):
        self.name, self.url, self.counters = name, url, counters
        self.transfers, self.outcome = transfers, outcome

    def count(self, outcome):
        return int(total(self.counters, self.transfers,
                         **{self.outcome: outcome}))

    def blocks_used(self):
        return int(total(self.url, "pdx_engine_kv_blocks_used"))


class Interop(unittest.TestCase):
    """Everything runs once for the class; each test drives one pair of
    engines through one proxy."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="pdx-interop-")
        cls.procs = []
        cls.agents = Agents(AGENT, "ep", "ed",
                            args=["--metrics", "127.0.0.1:0",
                                  "--lease-ms", "3000"])
        try:
            cls.start_all()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def run_bg(cls, name, cmd):
        with open(os.path.join(cls.tmp, name + ".log"), "w") as log:
            p, url = start_server(cmd, log)
        cls.procs.append((name, p))
        return url

    @classmethod
    def agent_metrics(cls, name):
        found = []

        def seen():
            for line in cls.agents.log(name).splitlines():
                if "metrics on http://" in line:
                    found.append(line.split("metrics on ")[1]
                                 .rsplit("/metrics", 1)[0])
            return found
        if not wait_for(seen, 10):
            raise RuntimeError("agent %s: no metrics address" % name)
        return found[-1]

    @classmethod
    def start_all(cls):
        eng = [ENGINE, "--port", "0", "--model", "tiny", "--time-scale", "0"]
        cls.C = cls.run_bg("colocated", eng)
        cls.EP = cls.run_bg("engine_prefill", eng + [
            "--role", "prefill", "--agent", cls.agents.engine("ep")])
        cls.ED = cls.run_bg("engine_decode", eng + [
            "--role", "decode", "--agent", cls.agents.engine("ed")])
        ktc = {"kv_connector": "PdxConnector",
               "kv_connector_module_path": "pdx.vllm",
               "kv_load_failure_policy": "fail",
               "kv_connector_extra_config": {
                   "agent_bin": AGENT, "xfer_timeout_ms": 5000,
                   "agent_args": ["--lease-ms", "3000"]}}
        # HND, as PdxConnector asks; pdx-engine's blocks are NHD, and
        # the agents convert them on the way
        serve = [sys.executable, os.path.join(HERE, "mini_vllm_serve.py"),
                 "--port", "0", "--kv-transfer-config", json.dumps(ktc),
                 "--async-scheduling"]  # vLLM's default
        cls.MP = cls.run_bg("python_prefill", serve + ["--role", "prefill"])
        cls.MD = cls.run_bg("python_decode", serve + ["--role", "decode"])
        ma, md = cls.agent_metrics("ep"), cls.agent_metrics("ed")
        agent = ("pdx_agent_transfers_total", "outcome")
        python = ("pdx_vllm_transfers_total", "outcome")
        cls.pairs = {
            "python_to_engine": (Side("python prefill", cls.MP, cls.MP,
                                      *python),
                                 Side("pdx-engine decode", cls.ED, md,
                                      *agent)),
            "engine_to_python": (Side("pdx-engine prefill", cls.EP, ma,
                                      *agent),
                                 Side("python decode", cls.MD, cls.MD,
                                      *python)),
        }
        cls.proxies = {}
        for pair, (p, d) in cls.pairs.items():
            hp = lambda s: s.url.replace("http://", "")  # noqa: E731
            for flow in ("concurrent", "sequential"):
                cls.proxies[pair, flow] = cls.run_bg(
                    "proxy_%s_%s" % (pair, flow),
                    [PROXY, "--port", "0", "--prefill", hp(p),
                     "--decode", hp(d), "--flow", flow])
            if os.path.exists(TOY) and toy_runs():
                cls.proxies[pair, "toy"] = cls.toy(pair, p, d)

    @classmethod
    def toy(cls, pair, p, d):
        port = free_port()
        host_port = lambda s: s.url.rsplit(":", 1)  # noqa: E731
        (ph, pp), (dh, dp) = host_port(p), host_port(d)
        env = dict(os.environ)
        env.pop("OPENAI_API_KEY", None)
        log = open(os.path.join(cls.tmp, "toy_%s.log" % pair), "w")
        proc = subprocess.Popen(
            [sys.executable, TOY_RUN, TOY, "--port", str(port),
             "--prefiller-hosts", ph.replace("http://", ""),
             "--prefiller-ports", pp,
             "--decoder-hosts", dh.replace("http://", ""),
             "--decoder-ports", dp],
            stdout=subprocess.DEVNULL, stderr=log, env=env)
        log.close()
        cls.procs.append(("toy_" + pair, proc))
        url = "http://127.0.0.1:%d" % port

        def up():
            if proc.poll() is not None:
                raise RuntimeError("toy proxy exited: " + cls.log("toy_" +
                                                                  pair))
            try:
                with urllib.request.urlopen(url + "/healthcheck",
                                            timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False
        if not wait_for(up, 30, 0.1):
            raise RuntimeError("toy proxy did not start: " +
                               cls.log("toy_" + pair))
        return url

    @classmethod
    def log(cls, name):
        with open(os.path.join(cls.tmp, name + ".log"), errors="replace") as f:
            return f.read()[-3000:]

    @classmethod
    def tearDownClass(cls):
        for _, p in cls.procs:
            if p.poll() is None:
                p.terminate()
        bad = []
        for name, p in cls.procs:
            try:
                rc = p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
            if rc != 0:
                bad.append("%s exited %s: %s" % (name, rc, cls.log(name)))
        cls.agents.close()
        bad += cls.agents.bad_exits
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if bad:
            raise AssertionError("\n".join(bad))

    def test_info_names_the_connectors_agent(self):
        """/v1/pdx/info as pdx-engine answers it: pdx-proxy learns the
        peer address there, an operator the engine address."""
        for url, role in ((self.MP, "prefill"), (self.MD, "decode")):
            with urllib.request.urlopen(url + "/v1/pdx/info",
                                        timeout=10) as r:
                info = json.loads(r.read())
            self.assertEqual((info["role"], info["model"]), (role, "tiny"))
            self.assertTrue(info["peer_addr"].startswith("tcp://127.0.0.1:"),
                            info)
            self.assertTrue(info["agent"].startswith("ipc://"), info)

    # -- one proxy in front of one pair --------------------------------
    def drive(self, pair, flow):
        url = self.proxies.get((pair, flow))
        if url is None:
            self.skipTest("no %s (or no FastAPI, uvicorn, httpx)" % TOY)
        p, d = self.pairs[pair]
        sides = {p.name: p, d.name: d}
        before = {(s.name, o): s.count(o) for s in (p, d)
                  for o in ("sent", "received", "failed")}
        n = 0
        for stream in (False, True):
            for route, body in self.bodies("%s %s %s" % (pair, flow,
                                                         stream)):
                b = dict(body, stream=stream)
                if stream:
                    b["stream_options"] = {"include_usage": True}
                s, raw = post(url + route, b)
                self.assertEqual(s, 200, (route, stream, raw[:500]))
                if stream:  # whole: no error event, [DONE] last
                    self.assertTrue(raw.rstrip().endswith("data: [DONE]"),
                                    raw[-500:])
                s, want = post(self.C + route, b)
                self.assertEqual(s, 200, want[:500])
                want, got = (text_of(route, want, stream),
                             text_of(route, raw, stream))
                self.assertTrue(want)
                self.assertEqual(got, want, "%s %s %s stream=%s"
                                 % (pair, flow, route, stream))
                n += 1
        n += self.burst(url, "%s %s burst" % (pair, flow))
        expect = {(p.name, "sent"): n, (d.name, "received"): n,
                  (p.name, "failed"): 0, (d.name, "failed"): 0}

        def moved():
            return {(nm, o): sides[nm].count(o) - before[nm, o]
                    for nm, o in expect}
        ok = wait_for(lambda: moved() == expect, SETTLE_S, 0.1)
        self.assertTrue(ok, "transfers: want %s, have %s"
                        % (expect, moved()))
        ok = wait_for(lambda: p.blocks_used() == 0 and d.blocks_used() == 0,
                      SETTLE_S, 0.1)
        self.assertTrue(ok, "KV blocks held: %s %d, %s %d" % (
            p.name, p.blocks_used(), d.name, d.blocks_used()))

    def burst(self, url, tag, n=8):
        """n requests at once (several prefills in one step, several
        transfers in flight), streamed and not; each its own text."""
        long = " ".join("v%d" % i for i in range(60))
        bodies = [{"model": "tiny", "max_tokens": 6 + i, "stream": i % 2 == 1,
                   "prompt": "%d %s: %s" % (next(SERIAL), tag, long)}
                  for i in range(n)]
        got = [None] * n

        def one(i):
            got[i] = post(url + "/v1/completions", bodies[i])
        threads = [threading.Thread(target=one, args=(i,))
                   for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for b, g in zip(bodies, got):
            self.assertIsNotNone(g, "no answer in 60 s")
            self.assertEqual(g[0], 200, g[1][:500])
            s, want = post(self.C + "/v1/completions", b)
            self.assertEqual(text_of("/v1/completions", g[1], b["stream"]),
                             text_of("/v1/completions", want, b["stream"]),
                             "%s: %s" % (tag, b["prompt"][:40]))
        return n

    @staticmethod
    def bodies(tag):
        """Prompts new to every engine (each starts with a number of its
        own), several blocks long, completions and chat. A chat prompt's
        first block, its template's "<|system|", is every chat's: a
        decode side holds it after the first and asks for the rest."""
        long = " ".join("w%d" % i for i in range(150))
        return [
            ("/v1/completions", {"model": "tiny", "max_tokens": 12,
                                 "prompt": "%d %s: Hello, world!"
                                 % (next(SERIAL), tag)}),
            ("/v1/completions", {"model": "tiny", "max_tokens": 9,
                                 "prompt": "%d %s: %s"
                                 % (next(SERIAL), tag, long)}),
            ("/v1/chat/completions", {"model": "tiny", "max_tokens": 7,
                                      "messages": [
                                          {"role": "system", "content":
                                           "%d: be brief." % next(SERIAL)},
                                          {"role": "user", "content":
                                           "%s: tell me about KV caches"
                                           % tag}]}),
        ]


def toy_runs():
    """What toy_proxy_server.py runs on is installed."""
    return all(importlib.util.find_spec(m) for m in
               ("fastapi", "httpx", "uvicorn"))


def _add(pair, flow):
    def test(self):
        self.drive(pair, flow)
    test.__name__ = "test_%s_%s" % (pair, flow)
    setattr(Interop, test.__name__, test)


for _pair in ("python_to_engine", "engine_to_python"):
    for _flow in ("concurrent", "sequential", "toy"):
        _add(_pair, _flow)


if __name__ == "__main__":
    ENGINE, AGENT, PROXY = sys.argv[1:4]
    del sys.argv[1:4]
    os.environ.setdefault("UCX_TLS", "sm,self")
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    unittest.main(verbosity=2)
