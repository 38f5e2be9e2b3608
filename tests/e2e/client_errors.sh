#!/usr/bin/env bash
# A client's mistake is never counted against an instance (issue 14,
# item 3), through pdx-proxy (concurrent flow, one prefill and one decode
# engine, the circuit breaker at its default of 5 failures) and at an
# engine itself:
#  * five bodies just under the proxy's limit (8 MiB), each a prompt far
#    too long, and more 4xx-provoking requests (over the limit,
#    max_tokens 0, not JSON) all get a 4xx with OpenAI's error object,
#    never a 5xx; the decode instance's breaker stays closed and the
#    next valid request is served (before: the engine dropped the
#    connection on a body the proxy had grown past its limit, the proxy
#    answered 502 and counted it, and five opened the breaker: 503 for
#    every client);
#  * every error body is JSON, 413 included: the proxy's and the
#    engine's, whose limit sits above the proxy's by the room the proxy's
#    fields take;
#  * a 405 names the methods the route takes in Allow, any method; a
#    404 names the path asked for (the proxy's said "no such route");
#  * what real clients send is served as vLLM serves it, never refused
#    as their mistake, at the proxy and at an engine: a completion's
#    prompt as a list of one (LangChain's shape; before: 400 "a list of
#    prompts"), a body after a UTF-8 byte order mark (Python's json.loads
#    skips it; before: 400 invalid JSON), a key given twice (its last
#    value; before: the engine's 400), a NUL (\u0000) in a prompt (text,
#    as in Python; before: 400 "not allowed without JSON_ALLOW_NUL"; in
#    other fields a 400 naming the field); an empty body is a 400 that says
#    so (the proxy's said "wrong arguments"); and an X-Request-Id the
#    proxy keeps is the one in the response's id (one with a quote was
#    echoed by the proxy, refused by the engine, and the body's id was
#    another), and both keep one of up to 128 characters (the proxy
#    replaced one of 65 to 128);
#  * CORS, off unless --allowed-origins lists the origins (below);
#  * an answer to HEAD has no body, a stream to an HTTP/1.0 client
#    asking for keep-alive ends with the connection, and two
#    Content-Length headers that differ are refused;
#  * kv_transfer_params keys only the proxy may set, from a client, are
#    not passed on (a client could fail or falsify everyone's requests):
#    five requests naming a dead remote_agent (or agents, a metaserver,
#    do_remote_decode) get 200 and the colocated text, the breakers stay
#    closed and the next request is served (before: five 502s opened P's
#    breaker, then 503 for every client); sixteen requests at once with
#    one xfer_id all get 200 and the colocated text, breakers closed
#    (before: 500s from both engines opened both breakers); a first_token
#    does not change the answer (before: D answered from it); and a
#    decode-only proxy, which passes the client's body on as it came,
#    takes them out too (before: a transfer of the client's making failed
#    against D alone, whose breaker opened).
#   client_errors.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
# shellcheck disable=SC2034 # pd_engine_start (lib.sh) reads them
ENGINE=$1
# shellcheck disable=SC2034
AGENT=$2
PROXY=$3

pd_engine_start P prefill --time-scale 0
pd_engine_start D decode --time-scale 0
# Health checks of 10 s: under the sanitizers, beside another test, an
# engine reading an 8 MiB prompt held its loop past the default 1 s,
# twice, and was taken out of rotation (503), which is not what this test
# is about.
named_engine_start X "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D" --flow concurrent --health-timeout 10000

$PY - "$PORT_X" "$PORT_D" <<'PYEOF' || fail "checks above"
import http.client, json, sys, urllib.request

proxy, engine = int(sys.argv[1]), int(sys.argv[2])
MIB = 1 << 20


def call(port, method, path, body=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"} if body is not None else {}
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    out = (r.status, r.getheader("Content-Type") or "",
           r.getheader("Allow"), r.read())
    c.close()
    return out


def openai_error(what, status, ctype, raw, code):
    assert status == code, f"{what}: HTTP {status}, want {code}: {raw[:300]!r}"
    assert ctype.startswith("application/json"), f"{what}: {ctype}: {raw[:300]!r}"
    e = json.loads(raw)["error"]
    assert set(e) == {"message", "type", "param", "code"}, (what, e)
    assert e["code"] == code and e["message"] and e["type"], (what, e)
    return e


def near_limit(size):
    """A completion body of exactly size bytes: a prompt far too long."""
    head, tail = b'{"max_tokens": 4, "prompt": "', b'"}'
    words = b"w " * ((size - len(head) - len(tail)) // 2)
    b = head + words + b"x" * (size - len(head) - len(words) - len(tail)) + tail
    assert len(b) == size
    return b


def breaker(port):
    m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return [l for l in m.splitlines()
            if l.startswith("pdx_proxy_instance_breaker_state{")]


# Five bodies just under the proxy's limit: the engines (their limit
# above the proxy's) answer 400, passed back as the client's error.
for i in range(5):
    st, ct, _, raw = call(proxy, "POST", "/v1/completions",
                          near_limit(8 * MIB - 64))
    assert st < 500, f"near-limit body {i + 1} answered {st}: {raw[:300]!r}"
    e = openai_error(f"near-limit body {i + 1}", st, ct, raw, 400)
print(f"ok: five bodies just under 8 MiB: 400 ({e['message'][:60]}...)")
st, ct, _, raw = call(proxy, "POST", "/v1/completions",
                      near_limit(8 * MIB + 1))
e = openai_error("a body over the proxy's limit", st, ct, raw, 413)
print(f"ok: over the proxy's limit: 413 JSON ({e['message']})")
st, ct, _, raw = call(proxy, "POST", "/v1/completions",
                      json.dumps({"prompt": "hi " * 2000, "max_tokens": 0}))
openai_error("max_tokens 0", st, ct, raw, 400)
st, ct, _, raw = call(proxy, "POST", "/v1/chat/completions", b"{not json")
openai_error("a body that is not JSON", st, ct, raw, 400)
# a client's mistakes count for no instance: the breakers stay closed
for l in breaker(proxy):
    assert l.endswith(" 0"), f"a breaker is not closed after 4xx: {l}"
st, ct, _, raw = call(proxy, "POST", "/v1/completions",
                      json.dumps({"prompt": "still served", "max_tokens": 3}))
assert st == 200, f"the valid request after the client errors: {st} {raw!r}"
print("ok: after eight client errors the breakers are closed and a valid "
      "request is served")

# The engine's own limit: the proxy's and the room for its fields.
st, ct, _, raw = call(engine, "POST", "/v1/completions",
                      near_limit(8 * MIB + 32 * 1024))
openai_error("engine: a body within its headroom", st, ct, raw, 400)
st, ct, _, raw = call(engine, "POST", "/v1/completions",
                      near_limit(8 * MIB + 64 * 1024 + 1))
e = openai_error("engine: a body over its limit", st, ct, raw, 413)
print(f"ok: engine: 413 JSON over 8 MiB + 64 KiB ({e['message']})")

# 405 with Allow, JSON, whatever the method.
for who, port, method, path, allow in [
        ("proxy", proxy, "GET", "/v1/completions", "POST"),
        ("proxy", proxy, "PUT", "/v1/chat/completions", "POST"),
        ("proxy", proxy, "DELETE", "/metrics", "GET"),
        ("proxy", proxy, "POST", "/health", "GET"),
        ("engine", engine, "GET", "/v1/completions", "POST"),
        ("engine", engine, "PUT", "/v1/chat/completions", "POST"),
        ("engine", engine, "POST", "/health", "GET"),
        ("engine", engine, "DELETE", "/metrics", "GET")]:
    st, ct, got, raw = call(port, method, path)
    openai_error(f"{who}: {method} {path}", st, ct, raw, 405)
    assert got == allow, f"{who}: {method} {path}: Allow {got!r}, want {allow}"
st, ct, _, raw = call(engine, "GET", "/no/such/route")
openai_error("engine: an unknown route", st, ct, raw, 404)
print("ok: 405 carries Allow, and every error is JSON (proxy and engine)")
PYEOF
$PY - "$PORT_X" "$PORT_D" <<'PYEOF' || fail "real clients' shapes"
import http.client, json, sys

proxy, engine = int(sys.argv[1]), int(sys.argv[2])


def post(port, path, body, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", path, body=body, headers=headers or {})
    r = c.getresponse()
    out = r.status, r.getheader("X-Request-Id"), r.read()
    c.close()
    return out


def served(who, port, body, want_text=None):
    st, _, raw = post(port, "/v1/completions", body)
    assert st == 200, f"{who}: {body[:60]!r}: HTTP {st}: {raw[:300]!r}"
    out = json.loads(raw)
    return out["choices"][0]["text"], out["usage"]


for who, port in (("proxy", proxy), ("engine", engine)):
    text, _ = served(who, port, b'{"prompt": "a b c", "max_tokens": 3}')
    for body in (b'{"prompt": ["a b c"], "max_tokens": 3}',
                 b'\xef\xbb\xbf{"prompt": "a b c", "max_tokens": 3}'):
        got, _ = served(who, port, body)
        assert got == text, f"{who}: {body!r}: {got!r}, want {text!r}"
    ids, _ = served(who, port, b'{"prompt": [1, 2, 3], "max_tokens": 3}')
    got, _ = served(who, port, b'{"prompt": [[1, 2, 3]], "max_tokens": 3}')
    assert got == ids, f"{who}: a list of one token-id prompt: {got!r}"
    # a NUL is text in a prompt (as in Python), no part of a model's name
    _, u = served(who, port, b'{"prompt": "a\\u0000b", "max_tokens": 1}')
    assert u["prompt_tokens"] == 3, f"{who}: a NUL in the prompt: {u}"
    st, _, raw = post(port, "/v1/completions",
                      b'{"prompt": "a", "model": "tiny\\u0000x"}')
    e = json.loads(raw)["error"]
    assert st == 400 and e["param"] == "model", f"{who}: NUL in model: {raw!r}"
    _, u = served(who, port,
                  b'{"prompt": "a", "max_tokens": 2, "max_tokens": 3}')
    assert u["completion_tokens"] == 3, f"{who}: a key given twice: {u}"
    st, _, raw = post(port, "/v1/completions", b"")
    e = json.loads(raw)["error"]
    assert st == 400 and "empty" in e["message"], f"{who}: empty body: {raw!r}"
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/v1/nothing?x=1")
    r = c.getresponse()
    e = json.loads(r.read())["error"]
    assert r.status == 404 and e["message"] == "no route /v1/nothing" and \
        e["type"] == "not_found_error", f"{who}: 404: {e}"
    # up to 128 characters at both (the proxy replaced one of 65 to 128
    # that the engine keeps)
    kept = ("my-req-7", "r" * 128)
    for rid in kept + ('quo"te', "back\\slash", "s" * 129):
        st, head, raw = post(port, "/v1/completions",
                             b'{"prompt": "a", "max_tokens": 1}',
                             {"X-Request-Id": rid})
        body_id = json.loads(raw)["id"]
        assert st == 200 and body_id == "cmpl-" + head, \
            f"{who}: X-Request-Id {rid!r}: head {head!r}, body {body_id!r}"
        assert (head == rid) == (rid in kept), (who, rid, head)
print("ok: real clients' shapes are served, at the proxy and the engine")
PYEOF

# CORS: off by default (a browser's preflight gets the 405 of any other
# OPTIONS, an answer no Access-Control-Allow-Origin); with
# --allowed-origins the listed origins' preflights get 204 with the
# route's methods and the headers asked for (Authorization included),
# others 403, and every answer to a listed origin, a stream included,
# carries the header ("*": any origin, answered "*"). A bad list stops
# the proxy at start.
"$PROXY" --decode "127.0.0.1:$PORT_D" --allowed-origins "ftp://ui" 2>"$E2E_TMP/cors.err"
[ $? -eq 2 ] && grep -q -- "--allowed-origins" "$E2E_TMP/cors.err" ||
	fail "a bad --allowed-origins: $(cat "$E2E_TMP/cors.err")"
named_engine_start XC "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D" --allowed-origins "http://ui.example:3000,https://b.example"
named_engine_start XS "$PROXY" --decode "127.0.0.1:$PORT_D" --allowed-origins "*"
$PY - "$PORT_X" "$PORT_XC" "$PORT_XS" <<'PYEOF' || fail "CORS"
import http.client, json, sys
off, listed, anyone = (int(p) for p in sys.argv[1:])
UI = "http://ui.example:3000"


def ask(port, method, path, headers, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    raw = r.read()
    c.close()
    return r.status, r, raw


pre = {"Origin": UI, "Access-Control-Request-Method": "POST",
       "Access-Control-Request-Headers": "authorization, content-type"}
st, r, _ = ask(listed, "OPTIONS", "/v1/chat/completions", pre)
assert st == 204, st
assert r.getheader("Access-Control-Allow-Origin") == UI, r.getheaders()
assert r.getheader("Access-Control-Allow-Methods") == "POST", r.getheaders()
assert r.getheader("Access-Control-Allow-Headers") == "authorization, content-type"
assert r.getheader("Vary") == "Origin"
st, r, raw = ask(listed, "OPTIONS", "/v1/chat/completions",
                 dict(pre, Origin="http://evil.example"))
assert st == 403 and "--allowed-origins" in json.loads(raw)["error"]["message"], (st, raw)
st, r, _ = ask(off, "OPTIONS", "/v1/chat/completions", pre)
assert st == 405 and r.getheader("Access-Control-Allow-Origin") is None, st
body = b'{"prompt": "cors", "max_tokens": 3, "stream": true}'
for port, origin, want in ((listed, UI, UI), (listed, "http://evil.example", None),
                           (off, UI, None), (anyone, "http://x.example", "*")):
    st, r, raw = ask(port, "POST", "/v1/completions",
                     {"Origin": origin, "Content-Type": "application/json"}, body)
    assert st == 200 and b"[DONE]" in raw, (port, st, raw[:200])
    assert r.getheader("Access-Control-Allow-Origin") == want, (port, origin, r.getheaders())
# the proxy's own 413 (a body over --max-body) is marked too
st, r, raw = ask(listed, "POST", "/v1/completions",
                 {"Origin": UI, "Content-Type": "application/json"},
                 b'{"prompt": "' + b"x" * (8 << 20) + b'"}')
assert st == 413 and r.getheader("Access-Control-Allow-Origin") == UI, (st, r.getheaders())
print("ok: CORS")
PYEOF
$PY - "$PORT_X" "$PORT_XS" "$PORT_D" <<'PYEOF' || fail "kv_transfer_params of the client's"
import http.client, json, sys, threading, urllib.request

proxy, alone, engine = (int(p) for p in sys.argv[1:])
DEAD = "tcp://127.0.0.1:1"
X = "00112233445566778899aabbccddeeff"


def post(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.status, r.read()
    c.close()
    return out


def text(port, body, what):
    st, raw = post(port, body)
    assert st == 200, f"{what}: HTTP {st}: {raw[:300]!r}"
    return json.loads(raw)["choices"][0]["text"]


def breakers_closed(port, what):
    m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read()
    b = [l for l in m.decode().splitlines()
         if l.startswith("pdx_proxy_instance_breaker_state{")]
    assert b and all(l.endswith(" 0") for l in b), (what, b)


req = {"prompt": "whose transfer is it", "max_tokens": 6}
want = text(engine, req, "D colocated")
for i, kv in enumerate([{"remote_agent": DEAD}] * 3 + [
        {"remote_agents": [DEAD, DEAD], "remote_tp_size": 2},
        {"metaserver": "http://127.0.0.1:1/v1/metaserver",
         "do_remote_decode": True, "do_remote_prefill": True}]):
    got = text(proxy, dict(req, kv_transfer_params=kv), f"{kv} ({i + 1})")
    assert got == want, (kv, got, want)
breakers_closed(proxy, "after five requests naming a dead agent")
assert text(proxy, req, "the next request") == want
print("ok: a client's remote_agent and the like are not passed on")

out = [None] * 16


def one(i):
    out[i] = post(proxy, dict(req, kv_transfer_params={"xfer_id": X}))


ts = [threading.Thread(target=one, args=(i,)) for i in range(len(out))]
for t in ts:
    t.start()
for t in ts:
    t.join()
for i, (st, raw) in enumerate(out):
    assert st == 200, f"one xfer_id, request {i + 1}: HTTP {st}: {raw[:300]!r}"
    assert json.loads(raw)["choices"][0]["text"] == want, (i, raw)
breakers_closed(proxy, "after sixteen requests with one xfer_id")
print("ok: sixteen requests with one xfer_id of the client's: 200 each")

# two tokens: one of them at least is not P's
for ft in (5, 6):
    got = text(proxy, dict(req, kv_transfer_params={"first_token": ft}),
               f"first_token {ft}")
    assert got == want, (ft, got, want)
print("ok: a client's first_token does not change the answer")

for i in range(6):
    got = text(alone, dict(req, kv_transfer_params={
        "do_remote_prefill": True, "xfer_id": X, "remote_agent": DEAD}),
        f"decode-only, a transfer of the client's ({i + 1})")
    assert got == want, (got, want)
breakers_closed(alone, "decode-only, after six transfers of the client's")
print("ok: a decode-only proxy takes out a client's transfer too")

# straight to a decode engine: its own agent as the other side, or an
# address without tcp://, is the client's mistake (a 500 from the agent's
# refusal before)
info = urllib.request.urlopen(f"http://127.0.0.1:{engine}/v1/pdx/info")
own = json.loads(info.read())["peer_addr"]
for ra, says in ((own, "this engine's own agent"),
                 ("127.0.0.1:7001", "tcp://HOST:PORT")):
    st, raw = post(engine, dict(req, kv_transfer_params={
        "do_remote_prefill": True, "xfer_id": X, "remote_agent": ra}))
    assert st == 400 and says in json.loads(raw)["error"]["message"], \
        (ra, st, raw[:300])
print("ok: a decode engine's own agent or a bare HOST:PORT as the sender: 400")
PYEOF

# HTTP framing: an answer to HEAD has no body (it had one, which a client
# read as the start of its next answer), and a stream to an HTTP/1.0
# client that asks for keep-alive ends with the connection (it was
# answered "Content-Length: 0", the events after it).
$PY - "$PORT_X" "$PORT_D" <<'PYEOF' || fail "HTTP framing"
import json, socket, sys

def talk(port, raw):
    s = socket.create_connection(("127.0.0.1", int(port)), timeout=10)
    s.sendall(raw)
    got = b""
    while True:
        try:
            b = s.recv(65536)
        except socket.timeout:
            break
        if not b:
            break
        got += b
    s.close()
    return got

for port in sys.argv[1:]:
    got = talk(port, b"HEAD /nope HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /health HTTP/1.1\r\nHost: x\r\n"
                     b"Connection: close\r\n\r\n")
    head, rest = got.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 404"), head
    assert rest.startswith(b"HTTP/1.1 200"), (port, got[:300])
    body = json.dumps({"prompt": "Hi", "max_tokens": 2,
                       "stream": True}).encode()
    got = talk(port, b"POST /v1/completions HTTP/1.0\r\nHost: x\r\n"
                     b"Connection: keep-alive\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
    head, rest = got.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.0 200"), head
    assert b"content-length" not in head.lower(), head
    assert rest.startswith(b"data: {") and rest.endswith(b"data: [DONE]\n\n"), \
        (port, rest[:200], rest[-40:])
    # two Content-Length headers that differ: which framed the body is
    # a guess (libevent took the first): refused, as RFC 9112 says
    got = talk(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: 2\r\nContent-Length: 40\r\n"
                     b"Connection: close\r\n\r\n{}")
    assert got.startswith(b"HTTP/1.1 400") and \
        b"two Content-Length headers that differ" in got, (port, got[:300])
print("ok: HEAD answered without a body; an HTTP/1.0 keep-alive stream "
      "ends with its connection; two Content-Lengths that differ: 400")
PYEOF
settle 10 $(engine_idle P D) || fail "engines not idle after the client errors"
for n in X XC XS P D agent_p agent_d; do named_stop $n; done
echo "ok: client errors are the client's: JSON, 4xx, never an instance failure"
