"""Inside the image (tests/e2e/image.sh pipes it to the container's
python3): one prefill and one decode pdx-engine, each with its pdx-agent,
pdx-proxy in front, and a colocated engine; a completion through the proxy
must equal the colocated engine's. Ports are fixed: the container has a
network namespace of its own. Prints "smoke ok"; exits 1 with the logs'
ends otherwise."""
import json
import os
import subprocess
import sys
import time
import urllib.request

DEADLINE = time.monotonic() + 60
procs = {}


def start(name, *argv):
    log = open(f"/tmp/{name}.log", "w")
    procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def fail(why):
    print(f"FAIL: {why}", file=sys.stderr)
    for name in procs:
        with open(f"/tmp/{name}.log") as f:
            print(f"--- {name}\n" + "".join(f.readlines()[-8:]), file=sys.stderr)
    sys.exit(1)


def wait_for(what, ready):
    while not ready():
        for name, p in procs.items():
            if p.poll() is not None:
                fail(f"{name} exited {p.returncode} while waiting for {what}")
        if time.monotonic() > DEADLINE:
            fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def get_ok(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                    timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def complete(port):
    body = json.dumps({"prompt": "an image of pdx", "max_tokens": 12}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)["choices"][0]["text"]


os.environ.update(UCX_TLS="sm,self", UCX_WARN_UNUSED_ENV_VARS="n")
try:
    for side, port in (("p", 7001), ("d", 7002)):
        start(f"agent_{side}", "pdx-agent", "--engine", f"ipc:///tmp/{side}.sock",
              "--listen", f"tcp://127.0.0.1:{port}")
    for side in ("p", "d"):
        wait_for(f"agent {side}", lambda: os.path.exists(f"/tmp/{side}.sock"))
    start("engine_p", "pdx-engine", "--port", "8101", "--role", "prefill",
          "--agent", "ipc:///tmp/p.sock", "--time-scale", "0")
    start("engine_d", "pdx-engine", "--port", "8102", "--role", "decode",
          "--agent", "ipc:///tmp/d.sock", "--time-scale", "0")
    start("engine_c", "pdx-engine", "--port", "8103", "--time-scale", "0")
    start("proxy", "pdx-proxy", "--port", "8000", "--prefill", "127.0.0.1:8101",
          "--decode", "127.0.0.1:8102")
    for port in (8101, 8102, 8103, 8000):
        wait_for(f"GET :{port}/health", lambda: get_ok(port, "/health"))
    wait_for("the proxy's /ready", lambda: get_ok(8000, "/ready"))
    want, got = complete(8103), complete(8000)
    if not want or got != want:
        fail(f"through the proxy {got!r}, colocated {want!r}")
    print("smoke ok")
finally:
    for p in procs.values():
        p.terminate()
    for p in procs.values():
        p.wait()
