"""mini_vllm_serve answers the OpenAI routes with the same text as a
colocated pdx-engine --model tiny, streamed and not, completions and
chat; /health, /v1/models, /v1/pdx/info; a bad body is refused as
pdx-engine refuses it.

usage: test_mini_vllm_http.py PDX_ENGINE
"""
import json
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request

from rig import start_server

HERE = os.path.dirname(os.path.abspath(__file__))


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def text_of(route, raw, stream):
    chat = route.endswith("chat/completions")
    if not stream:
        c = json.loads(raw)["choices"][0]
        return c["message"]["content"] if chat else c["text"]
    out = []
    for line in raw.split("\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for c in json.loads(line[6:])["choices"]:
            d = c.get("delta", {}) if chat else c
            out.append(d.get("content" if chat else "text") or "")
    return "".join(out)


def main():
    engine_bin = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="pdx-mv-")
    procs = []
    try:
        with open(os.path.join(tmp, "eng.log"), "w") as le, \
                open(os.path.join(tmp, "mv.log"), "w") as lm:
            pe, eng = start_server([engine_bin, "--port", "0", "--model", "tiny",
                             "--time-scale", "0"], le)
            procs.append(pe)
            pm, mv = start_server([sys.executable,
                            os.path.join(HERE, "mini_vllm_serve.py"),
                            "--port", "0", "--role", "decode"], lm)
            procs.append(pm)
        bodies = [
            ("/v1/completions", {"prompt": "Hello, world! Once more.",
                                 "max_tokens": 12}),
            ("/v1/completions", {"prompt": [5, 6, 7, 8, 9, 10, 11, 12, 13],
                                 "max_tokens": 9}),
            ("/v1/completions", {"prompt": "a" + " b" * 40}),
            ("/v1/chat/completions", {"messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi there"}],
                "max_tokens": 7}),
        ]
        for route, body in bodies:
            for stream in (False, True):
                b = dict(body, stream=stream)
                se, te = post(eng + route, b)
                sm, tm = post(mv + route, b)
                assert se == 200 and sm == 200, (route, se, te, sm, tm)
                a, m = text_of(route, te, stream), text_of(route, tm, stream)
                assert a == m and a, (route, stream, a, m)
        # the prompt cached by the runs above: same text from a prefix hit
        s, t = post(mv + bodies[0][0], bodies[0][1])
        assert text_of(bodies[0][0], t, False) == \
            text_of(bodies[0][0], post(eng + bodies[0][0], bodies[0][1])[1],
                    False)
        s, t = post(mv + "/v1/completions", {"prompt": "", "max_tokens": 2})
        assert s == 400 and json.loads(t)["error"]["param"] == "prompt", t
        s, t = post(mv + "/v1/completions", {"prompt": "x", "model": "no"})
        assert s == 404, (s, t)
        with urllib.request.urlopen(mv + "/health", timeout=10) as r:
            assert r.status == 200
        with urllib.request.urlopen(mv + "/v1/models", timeout=10) as r:
            assert json.loads(r.read())["data"][0]["id"] == "tiny"
        with urllib.request.urlopen(mv + "/v1/pdx/info", timeout=10) as r:
            info = json.loads(r.read())
        assert info == {"role": "decode", "model": "tiny", "agent": None,
                        "peer_addr": None}, info
        for p in procs:
            p.terminate()
        for p in procs:
            assert p.wait(20) == 0, "exit status %s" % p.returncode
        print("ok: same text as pdx-engine, streamed and not")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
