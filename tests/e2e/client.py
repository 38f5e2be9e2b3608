"""The e2e tests' client, in Python: completions through an engine or a
proxy, a client that leaves mid-request, and waits on /metrics.

  client.py stream PORT PROMPT MAX_TOKENS OUT.json
      One streamed completion through PORT. Writes OUT.json when it ends:
      {"status": HTTP status or 0, "ms": from send to end, "tokens": SSE
      token events, "text": their text joined, "done": "[DONE]" seen,
      "error": the SSE error event's or the error body's message, or the
      transport error ("" if none), "chunked_end": the response ended
      cleanly}. OUT.json.tokens holds the token count while it streams.
  client.py text PORT PROMPT MAX_TOKENS
      Prints a whole (not streamed) completion's text; exits 1 on an error.
  client.py abort PROXY PHASE P D FLOW PROMPT
      A request through the proxy on PROXY, in front of the prefill
      engine on P and the decode engine on D, whose client leaves at
      PHASE (see abort()); exits 1 when the phase is not reached or the
      proxy answered first.
  client.py settle SECONDS PORT/NAME=VALUE|PORT/NAME>=VALUE...
      Waits until every sample has its value (or at least it); on timeout
      says which do not and exits 1.
"""
import json
import os
import select
import socket
import sys
import time
import urllib.request


def body(prompt, max_tokens, stream):
    return json.dumps({"prompt": prompt, "max_tokens": int(max_tokens),
                       "stream": stream}).encode()


def stream(port, prompt, max_tokens, out):
    res = {"status": 0, "tokens": 0, "text": "", "done": False, "error": "",
           "chunked_end": False}
    t0 = time.monotonic()
    b = body(prompt, max_tokens, True)
    try:
        s = socket.create_connection(("127.0.0.1", int(port)), timeout=60)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nConnection: close\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(b) + b)
        f = s.makefile("rb")
        line = f.readline()
        res["status"] = int(line.split()[1]) if line.startswith(b"HTTP/") else 0
        headers = {}
        while True:
            h = f.readline()
            if h in (b"\r\n", b""):
                break
            k, _, v = h.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        chunked = headers.get("transfer-encoding", "") == "chunked"
        raw = b""
        sse = ""
        while True:
            if chunked:
                n = f.readline()
                if not n:
                    raise ConnectionError("connection closed mid-chunk")
                n = int(n.split(b";")[0], 16)
                if n == 0:
                    f.readline()
                    res["chunked_end"] = True
                    break
                data = f.read(n)
                f.readline()
            else:
                data = f.read1(65536) if hasattr(f, "read1") else f.read(65536)
                if not data:
                    res["chunked_end"] = True
                    break
            raw += data
            sse += data.decode(errors="replace")
            while "\n\n" in sse:
                ev, sse = sse.split("\n\n", 1)
                if not ev.startswith("data: "):
                    continue
                ev = ev[6:]
                if ev == "[DONE]":
                    res["done"] = True
                    continue
                try:
                    j = json.loads(ev)
                except ValueError:
                    res["error"] = res["error"] or "bad SSE event: " + ev[:80]
                    continue
                if "error" in j:
                    res["error"] = j["error"].get("message", str(j["error"]))
                for c in j.get("choices", []):
                    res["tokens"] += 1
                    res["text"] += c.get("text", "")
                with open(out + ".tokens.part", "w") as t:
                    t.write(str(res["tokens"]))
                os.rename(out + ".tokens.part", out + ".tokens")
        if res["status"] != 200 and not res["error"]:
            try:
                res["error"] = json.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                res["error"] = "HTTP %d: %r" % (res["status"], raw[:100])
    except (OSError, ValueError) as e:
        res["error"] = res["error"] or "transport: %s" % e
        res["transport"] = True
    res["ms"] = int((time.monotonic() - t0) * 1000)
    with open(out + ".part", "w") as f:
        json.dump(res, f)
    os.rename(out + ".part", out)


def metrics(port):
    with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port,
                                timeout=5) as r:
        text = r.read().decode()
    return dict(l.rsplit(" ", 1) for l in text.splitlines()
                if l and l[0] != "#")


def eng(port, name):
    return int(metrics(port).get('pdx_engine_%s{model_name="tiny"}' % name, "0"))


def until(what, cond, seconds=10):
    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > end:
            sys.exit("timed out waiting until " + what)
        time.sleep(0.02)


def abort(proxy, phase, p, d, flow, prompt):
    """Sends a request and leaves at PHASE: prefill (P prefills; in the
    concurrent and early-callback flows D waits for the KV), stream (two
    tokens streamed), whole (not streamed, P done, D decoding) or queued
    (P done, D's request queued behind a full engine)."""
    p_fin = eng(p, "requests_finished_total")
    b = json.dumps({"prompt": prompt, "max_tokens": 1000,
                    "stream": phase == "stream"}).encode()
    s = socket.create_connection(("127.0.0.1", int(proxy)))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % len(b) + b)
    got = b""
    if phase == "prefill":
        d_has = flow != "sequential"
        until("P prefills and D %s" % ("waits" if d_has else "has nothing"),
              lambda: eng(p, "num_requests_running") == 1 and
              eng(d, "num_requests_running") == int(d_has))
    elif phase == "stream":
        s.settimeout(10)
        while got.count(b"data: {") < 2:
            b = s.recv(65536)
            if not b:
                sys.exit("the stream ended early: %r" % got)
            got += b
        assert b" 200 " in got.split(b"\r\n")[0], got
        got = b""
    elif phase == "queued":
        until("P answered and D queued the request",
              lambda: eng(p, "requests_finished_total") == p_fin + 1 and
              eng(d, "num_requests_waiting") == 1)
    else:
        until("P answered and sent the KV, and D decodes",
              lambda: eng(p, "requests_finished_total") == p_fin + 1 and
              eng(p, "kv_blocks_used") == 0 and
              eng(d, "num_requests_running") == 1)
        time.sleep(0.2)  # 20 of D's 1000 tokens
    if select.select([s], [], [], 0)[0]:
        got += s.recv(65536)
    if got:
        sys.exit("the proxy answered before the client left: %r" % got[:200])
    s.close()


def settle(seconds, checks):
    end = time.monotonic() + float(seconds)
    while True:
        bad, seen = [], {}
        for c in checks:
            port, _, rest = c.partition("/")
            name, _, want = rest.rpartition("=")
            at_least = name.endswith(">")
            name = name.rstrip(">")
            if port not in seen:
                try:
                    seen[port] = metrics(port)
                except OSError as e:
                    seen[port] = {}
                    bad.append("%s: /metrics: %s" % (port, e))
            v = seen[port].get(name, "absent")
            if v == "absent" or not (float(v) >= float(want) if at_least
                                     else float(v) == float(want)):
                bad.append("%s: %s is %s, want %s%s" % (
                    port, name, v, ">=" if at_least else "", want))
        if not bad:
            return 0
        if time.monotonic() > end:
            print("after %s s: %s" % (seconds, "; ".join(bad)))
            return 1
        time.sleep(0.05)


def text(port, prompt, max_tokens):
    req = urllib.request.Request(
        "http://127.0.0.1:%s/v1/completions" % port,
        data=body(prompt, max_tokens, False),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            print(json.load(r)["choices"][0]["text"])
    except Exception as e:
        print("completion through %s: %s" % (port, e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "stream":
        stream(*args)
    elif cmd == "abort":
        abort(*args)
    elif cmd == "settle":
        sys.exit(settle(args[0], args[1:]))
    else:
        sys.exit(text(*args))
