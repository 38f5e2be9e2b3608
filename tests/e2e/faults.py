"""faults.sh's client and waits.

  faults.py stream PORT PROMPT MAX_TOKENS OUT.json
      One streamed completion through PORT. Writes OUT.json when it ends:
      {"status": HTTP status or 0, "ms": from send to end, "tokens": SSE
      token events, "text": their text joined, "done": "[DONE]" seen,
      "error": the SSE error event's or the error body's message, or the
      transport error ("" if none), "chunked_end": the response ended
      cleanly}. OUT.json.tokens holds the token count while it streams.
  faults.py settle SECONDS PORT/NAME=VALUE...
      Waits until every sample has its value; on timeout prints the ones
      that do not and exits 1.
  faults.py text PORT PROMPT MAX_TOKENS
      Prints a whole (not streamed) completion's text; exits 1 on an error.
"""
import json
import os
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


def settle(seconds, checks):
    end = time.monotonic() + float(seconds)
    while True:
        bad, seen = [], {}
        for c in checks:
            port, _, rest = c.partition("/")
            name, _, want = rest.rpartition("=")
            if port not in seen:
                try:
                    seen[port] = metrics(port)
                except OSError as e:
                    seen[port] = {}
                    bad.append("%s: /metrics: %s" % (port, e))
            v = seen[port].get(name, "absent")
            if v == "absent" or float(v) != float(want):
                bad.append("%s: %s is %s, want %s" % (port, name, v, want))
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
    elif cmd == "settle":
        sys.exit(settle(args[0], args[1:]))
    else:
        sys.exit(text(*args))
