"""SGLang's routing in front of SGLang servers with pdx's backend
(mini_sglang_serve.py: a prefill and a decode server, each with the
pdx-agent pdx.sglang starts): through pdx-proxy --flow sglang and through
a stand-in of SGLang's mini load balancer (mini_sglang_router.py), each
request is served with the text a colocated pdx-engine --model tiny gives
(the decode server checks every received position and samples its first
token from the received KV, so equal text means byte-exact KV), over
/v1/completions (streamed and not) and /generate; both rooms of a front pair on one prefill
server; a prefill instance that is no SGLang server is refused with why
(502). Then the prefill server's agent dies, then the server itself:
through either front a request ends in an error, not a hang.

usage: test_sglang_http.py PDX_ENGINE PDX_AGENT PDX_PROXY
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from mini_sglang import remove_left
from rig import free_port, start_server

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS = [("Hello, world! Once more.", 12),
           ([5, 6, 7, 8, 9, 10, 11, 12, 13], 9),
           ("a" + " b" * 40, 5),
           ("x", 3)]
ERROR_BOUND_S = 15


def post(url, body, timeout=30):
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def completion(prompt, n):
    return {"model": "tiny", "prompt": prompt, "max_tokens": n}


def text(raw):
    """A completion's text, or a stream's joined."""
    if not raw.startswith("data: "):
        return json.loads(raw)["choices"][0]["text"]
    assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
    return "".join(json.loads(line[6:])["choices"][0]["text"]
                   for line in raw.split("\n")
                   if line.startswith("data: {"))


def child_of(pid):
    """The process's pdx-agent (pdx.sglang started it)."""
    with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
        kids = [int(k) for k in f.read().split()]
    agents = [k for k in kids
              if os.path.basename(os.readlink("/proc/%d/exe" % k)) ==
              "pdx-agent"]
    assert len(agents) == 1, kids
    return agents[0]


def failed(what, *fronts):
    """A request through each front ends in an error, in the bound."""
    for front in fronts:
        t0 = time.monotonic()
        s, got = post(front + "/v1/completions", completion(what, 4),
                      timeout=ERROR_BOUND_S + 10)
        took = time.monotonic() - t0
        assert s >= 500, (what, front, s, got)
        assert took < ERROR_BOUND_S, (what, front, took)
        print("%s, %s: %d in %.1f s: %s" % (what, front, s, took,
                                           got[:200]))


def main():
    engine_bin, agent_bin, proxy_bin = sys.argv[1:4]
    os.environ.update(PDX_SGLANG_AGENT_BIN=agent_bin,
                      PDX_SGLANG_XFER_TIMEOUT_MS="4000",
                      PDX_SGLANG_BOOTSTRAP_TIMEOUT_S="4",
                      PDX_SGLANG_LIVENESS_MS="1000",
                      PDX_SGLANG_AGENT_ARGS="--lease-ms 3000 "
                                            "--peer-timeout-ms 2000",
                      UCX_TLS="sm,self", UCX_WARN_UNUSED_ENV_VARS="n")
    tmp = tempfile.mkdtemp(prefix="pdx-sglh-")
    procs = {}

    def spawn(name, cmd):
        with open(os.path.join(tmp, name + ".log"), "w") as log:
            procs[name], url = start_server(cmd, log, new_session=True)
        return url

    serve = [sys.executable, os.path.join(HERE, "mini_sglang_serve.py"),
             "--port", "0", "--request-timeout", "20"]
    boot = free_port()
    try:
        eng = spawn("engine", [engine_bin, "--port", "0", "--model", "tiny",
                               "--time-scale", "0"])
        p_url = spawn("prefill", serve + [
            "--disaggregation-mode", "prefill",
            "--disaggregation-bootstrap-port", str(boot)])
        d_url = spawn("decode", serve + ["--disaggregation-mode", "decode"])
        hp = lambda u: u[len("http://"):]
        proxy = spawn("proxy", [proxy_bin, "--port", "0", "--flow", "sglang",
                                "--prefill", hp(p_url), "--decode", hp(d_url),
                                "--health-interval", "0"])
        router = spawn("router", [
            sys.executable, os.path.join(HERE, "mini_sglang_router.py"),
            "--port", "0", "--prefill", p_url, str(boot),
            "--decode", d_url])

        for prompt, n in PROMPTS:
            s, want = post(eng + "/v1/completions", completion(prompt, n))
            assert s == 200, (s, want)
            want = text(want)
            for front in (proxy, router):
                s, got = post(front + "/v1/completions",
                              completion(prompt, n))
                assert s == 200, (front, prompt, s, got)
                assert text(got) == want, (front, prompt, text(got), want)
                assert json.loads(got)["usage"]["completion_tokens"] == n
                s, got = post(front + "/v1/completions",
                              dict(completion(prompt, n), stream=True))
                assert s == 200 and text(got) == want, (front, s, got)
        # SGLang's own route, through its router's shape
        s, want = post(eng + "/v1/completions", completion("Hi there", 7))
        s, got = post(router + "/generate", {
            "text": "Hi there", "sampling_params": {"max_new_tokens": 7}})
        assert s == 200 and json.loads(got)["text"] == text(want), (s, got)

        # a prefill instance that is no SGLang server (pdx-engine: no
        # /get_server_info) has no bootstrap port: 502, and says so
        odd = spawn("proxy_odd", [proxy_bin, "--port", "0", "--flow",
                                  "sglang", "--prefill", hp(eng),
                                  "--decode", hp(d_url),
                                  "--health-interval", "0"])
        s, got = post(odd + "/v1/completions", completion("x", 2))
        assert s == 502 and "disaggregation_bootstrap_port" in got, (s, got)

        # the prefill server's agent dies: its transfers fail on both
        # sides (the decode server's after its peer timeout)
        os.kill(child_of(procs["prefill"].pid), signal.SIGKILL)
        failed("prefill agent dead", router, proxy)
        # the prefill server dies, its agent with it
        os.killpg(procs["prefill"].pid, signal.SIGKILL)
        procs["prefill"].wait(10)
        # its resource tracker died with it: its pool stayed in /dev/shm,
        # and its agent's directory in /tmp
        remove_left(procs["prefill"].pid)
        failed("prefill dead", proxy, router)
        # the decode server is still there for the next request
        with urllib.request.urlopen(d_url + "/health", timeout=10) as r:
            assert r.status == 200
        for name in ("proxy", "proxy_odd", "router", "decode"):
            procs[name].terminate()
        for name in ("proxy", "proxy_odd", "decode"):
            rc = procs[name].wait(20)
            assert rc == 0, "%s exit status %s" % (name, rc)
        print("ok: pdx-proxy --flow sglang and the router stand-in, "
              "text as pdx-engine's; a dead prefill is an error")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in procs.items():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        for name in ("prefill", "decode", "proxy"):
            path = os.path.join(tmp, name + ".log")
            if os.path.exists(path) and os.environ.get("PDX_TEST_VERBOSE"):
                with open(path) as f:
                    print("--- %s\n%s" % (name, f.read()[-3000:]))
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
