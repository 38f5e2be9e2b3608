#!/usr/bin/python3
"""py_sglang_proxy_kinds: pdx-proxy's pool kinds in front of SGLang
servers (mini_sglang_serve.py, pdx.sglang) and pdx-engine, every agent
notifying the proxy (--notify-bind).

1. --flow sglang (both pools SGLang): each completion has the text a
   colocated pdx-engine gives, and the room's transfer counts in the
   instances' load: every agent notification is about a transfer the
   proxy counted (none unknown, none expired), and the instances'
   transfers gauge falls back to 0 once the agents reported.
2. --prefill-kind sglang --decode-kind pdx (an SGLang prefill server, a
   pdx-engine decode instance): the proxy learns P's agent from P's
   bootstrap server and gives D kv_transfer_params for the room's
   transfer; the same text (D checks every received position and decodes
   from the received KV, so equal text means byte-exact KV), streamed and
   not, and the same counting.
3. --prefill-kind pdx --decode-kind sglang (a pdx-engine prefill instance,
   an SGLang decode server): the proxy runs a bootstrap server for P that
   names P's agent, P gets an open send of the room's transfer; the same
   text and counting.
4. An SGLang prefill server of two attention TP ranks before a pdx-engine
   decode instance (which receives from one prefill rank): 502 at once,
   saying so.

    test_sglang_proxy_kinds.py PDX-ENGINE PDX-AGENT PDX-PROXY
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pdx.sglang.bootstrap import PdxKVBootstrapServer, register
from pdx.vllm.agent import AgentProcess
from rig import free_port, start_server
from test_sglang_http import PROMPTS, completion, post, text

HERE = os.path.dirname(os.path.abspath(__file__))
BOUND_S = 20


def metrics(proxy):
    with urllib.request.urlopen(proxy + "/metrics", timeout=10) as r:
        return r.read().decode()


def metric(m, name, labels=""):
    pat = r"^%s%s (\d+)$" % (re.escape(name), re.escape(labels))
    return sum(int(v) for v in re.findall(pat, m, re.M))


def gauge_total(m, name):
    return sum(int(v) for v in re.findall(r"^%s\{[^}]*\} (\d+)$" %
                                          re.escape(name), m, re.M))


def counted(proxy, want_events):
    """The agents' notifications all named transfers the proxy counted,
    at least want_events of them, and no instance still counts one."""
    end = time.monotonic() + BOUND_S
    while True:
        m = metrics(proxy)
        n = "pdx_proxy_transfer_notifications_total"
        got = metric(m, n, '{about="counted"}')
        unknown = metric(m, n, '{about="unknown"}')
        left = gauge_total(m, "pdx_proxy_instance_transfers")
        expired = metric(m, "pdx_proxy_transfers_expired_total")
        assert unknown == 0 and expired == 0, ("unknown", unknown,
                                               "expired", expired)
        if got >= want_events and left == 0:
            return got
        assert time.monotonic() < end, (got, want_events, left)
        time.sleep(0.05)


def serve_all(proxy, colocated, what):
    """Every prompt through the proxy, plain and streamed: the text
    colocated gives."""
    for prompt, n in PROMPTS:
        s, want = post(colocated + "/v1/completions", completion(prompt, n))
        assert s == 200, (s, want)
        for stream in (False, True):
            s, got = post(proxy + "/v1/completions",
                          dict(completion(prompt, n), stream=stream))
            assert s == 200, (what, prompt, s, got)
            assert text(got) == text(want), (what, prompt, text(got),
                                             text(want))
        print("ok   %s: %r" % (what, prompt))


def tp_prefill_stand_in():
    """An SGLang prefill server's two routes the proxy asks before it
    dispatches: GET /get_server_info (its bootstrap port) and its
    bootstrap server, where two attention TP ranks registered. Returns
    (url, close)."""
    boot = PdxKVBootstrapServer("127.0.0.1", free_port())
    for rank in (0, 1):
        register("127.0.0.1:%d" % boot.port, dict(
            attn_tp_size=2, attn_tp_rank=rank, pp_size=1, pp_rank=0,
            dp_size=1, dp_rank=0, peer_addr="tcp://127.0.0.1:%d" % (9 + rank),
            shape=None))

    class Info(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = ('{"disaggregation_bootstrap_port": %d}' % boot.port
                    ).encode()
            self.send_response(200 if self.path == "/get_server_info"
                               else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    info = ThreadingHTTPServer(("127.0.0.1", 0), Info)
    threading.Thread(target=info.serve_forever, daemon=True).start()

    def close():
        info.shutdown()
        info.server_close()
        boot.close()
    return "http://127.0.0.1:%d" % info.server_address[1], close


def main():
    engine_bin, agent_bin, proxy_bin = sys.argv[1:4]
    notify = "tcp://127.0.0.1:%d" % free_port()
    # pdx-engine's tiny model, token by token: 2 KV heads of 16 fp16s
    os.environ.update(PDX_SGLANG_AGENT_BIN=agent_bin, PDX_SGLANG_TOKEN="2,16,2",
                      PDX_SGLANG_XFER_TIMEOUT_MS="8000",
                      PDX_SGLANG_AGENT_ARGS="--notify " + notify,
                      UCX_TLS="sm,self", UCX_WARN_UNUSED_ENV_VARS="n")
    tmp = tempfile.mkdtemp(prefix="pdx-sglk-")
    procs, agent, p_agent = {}, None, None

    def spawn(name, cmd):
        with open(os.path.join(tmp, name + ".log"), "w") as log:
            procs[name], url = start_server(cmd, log, new_session=True)
        return url

    def proxy(name, decode, *kinds, prefill=None):
        return spawn(name, [proxy_bin, "--port", "0",
                            "--prefill", hp(prefill or p_url),
                            "--decode", hp(decode), "--notify-bind", notify,
                            "--health-interval", "0", *kinds])

    def stop(name):
        procs[name].terminate()
        assert procs[name].wait(20) == 0, name

    hp = lambda u: u[len("http://"):]
    # an SGLang pool runs the sglang flow, and that flow needs one
    for bad, why in ((["--flow", "concurrent", "--decode-kind", "sglang"],
                      "a pool of kind sglang runs the sglang flow"),
                     (["--flow", "sglang", "--prefill-kind", "pdx",
                       "--decode-kind", "pdx"], "both pools of kind pdx")):
        r = subprocess.run([proxy_bin, "--decode", "127.0.0.1:1", *bad],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and why in r.stderr, (bad, r.returncode,
                                                        r.stderr)
    serve = [sys.executable, os.path.join(HERE, "mini_sglang_serve.py"),
             "--port", "0", "--request-timeout", "20"]
    try:
        colocated = spawn("colocated", [engine_bin, "--port", "0", "--model",
                                        "tiny", "--time-scale", "0"])
        p_url = spawn("prefill", serve + [
            "--disaggregation-mode", "prefill",
            "--disaggregation-bootstrap-port", str(free_port())])
        d_url = spawn("decode", serve + ["--disaggregation-mode", "decode"])
        agent = AgentProcess(agent_bin, args=["--notify", notify])
        e_url = spawn("engine_decode", [
            engine_bin, "--port", "0", "--model", "tiny", "--time-scale", "0",
            "--role", "decode", "--agent", agent.engine_addr])
        # every request is one transfer, reported by P's agent and D's
        events = 2 * 2 * len(PROMPTS)

        front = proxy("proxy_sglang", d_url, "--flow", "sglang")
        serve_all(front, colocated, "SGLang -> SGLang")
        print("ok   counted: %d notifications" % counted(front, events))
        stop("proxy_sglang")

        # the agents' notifications reach the next proxy on the same
        # address (their sockets reconnect)
        front = proxy("proxy_mixed", e_url, "--prefill-kind", "sglang",
                      "--decode-kind", "pdx")
        serve_all(front, colocated, "SGLang -> pdx-engine")
        print("ok   counted: %d notifications" % counted(front, events))
        stop("proxy_mixed")

        # and back: the proxy runs P's bootstrap server, naming its agent
        p_agent = AgentProcess(agent_bin, args=["--notify", notify])
        e_p_url = spawn("engine_prefill", [
            engine_bin, "--port", "0", "--model", "tiny", "--time-scale", "0",
            "--role", "prefill", "--agent", p_agent.engine_addr])
        front = proxy("proxy_back", d_url, "--prefill-kind", "pdx",
                      "--decode-kind", "sglang", prefill=e_p_url)
        serve_all(front, colocated, "pdx-engine -> SGLang")
        print("ok   counted: %d notifications" % counted(front, events))
        stop("proxy_back")

        tp_url, tp_close = tp_prefill_stand_in()
        try:
            front = proxy("proxy_tp", e_url, "--prefill-kind", "sglang",
                          "--decode-kind", "pdx", prefill=tp_url)
            t0 = time.monotonic()
            s, got = post(front + "/v1/completions", completion("tp", 4))
            assert s == 502 and "attn_tp_size 2" in got, (s, got)
            assert time.monotonic() - t0 < 5, time.monotonic() - t0
            print("ok   SGLang TP 2 -> pdx-engine refused: %s" %
                  json.loads(got)["error"]["message"])
            stop("proxy_tp")
        finally:
            tp_close()
        print("ok")
    finally:
        for p in procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        for a in (agent, p_agent):
            if a is not None:
                a.stop()
        if os.environ.get("PDX_TEST_VERBOSE"):
            for name in procs:
                with open(os.path.join(tmp, name + ".log")) as f:
                    print("--- %s\n%s" % (name, f.read()[-3000:]))
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
