#!/usr/bin/env bash
# What a client meets at the HTTP edge of pdx-engine and pdx-proxy (a
# decode-only proxy in front of a colocated engine), the same at both:
#  * GET /version answers {"version": V}, V what --version prints, as
#    vLLM's API server does (clients and dashboards probe it; it was a
#    404).
#  * a trailing slash names the route without it (POST /v1/completions/,
#    GET /v1/models/, /health/, every route; it was a 404): the same
#    answer, 405 with Allow for another method, and an unknown path
#    stays a 404.
#  * a client that waits for "100 Continue" before a body over the limit
#    (Expect: 100-continue) gets 413 at once, its connection closed (it
#    got nothing until it sent the body anyway, curl after 1 s; over
#    twice the limit, libevent waited for the body); under the limit it
#    gets its 100 and then its answer.
#  * an engine's port refuses connections until the engine serves: while
#    it waits for its agent at start (up to 10 s) a client is refused
#    (it was accepted and left without an answer), and it serves once
#    the agent comes; another process on its port is still found at
#    once, before that wait.
#   http_edge.sh PDX_ENGINE PDX_PROXY PDX_AGENT
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
PROXY=$2
# shellcheck disable=SC2034 # agent_start (lib.sh) reads it
AGENT=$3

named_engine_start E "$ENGINE" --time-scale 0
named_engine_start X "$PROXY" --decode "127.0.0.1:$PORT_E" \
	--admin-token s3cret
wait_healthy X

for who in E:"$ENGINE" X:"$PROXY"; do
	name=${who%%:*}
	want=$("${who#*:}" --version) || fail "$name: --version"
	PORT=$(eval echo "\$PORT_$name") get /version >/dev/null
	status_is 200 "$name: GET /version"
	py "import json; v = json.load(open('$E2E_TMP/body')); \
assert v == {'version': '${want#* }'}, v" "$name: /version says '${want#* }'"
done
echo "ok: GET /version at the engine and the proxy says what --version says"

$PY - "$PORT_E" "$PORT_X" <<'PYEOF' || fail "a trailing slash"
import http.client, json, sys

engine, proxy = int(sys.argv[1]), int(sys.argv[2])
COMPLETION = json.dumps({"prompt": "a slash at the end", "max_tokens": 4})
CHAT = json.dumps({"messages": [{"role": "user", "content": "slash"}],
                   "max_tokens": 4})


def call(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    h = {"Authorization": "Bearer s3cret"}
    if body is not None:
        h["Content-Type"] = "application/json"
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    out = r.status, r.getheader("Allow"), r.read()
    c.close()
    return out


def same(port, method, path, body=None):
    """path/ answers as path does (ids and timings aside)."""
    st, _, raw = call(port, method, path, body)
    st2, _, raw2 = call(port, method, path + "/", body)
    assert st == st2, f"{port} {method} {path}/: {st2}, {path}: {st}: {raw2[:200]!r}"
    assert st != 404, f"{port} {method} {path}: 404"
    if path in ("/v1/completions", "/v1/chat/completions"):
        a, b = json.loads(raw), json.loads(raw2)
        assert a["choices"] == b["choices"], (path, a, b)
    elif path != "/metrics":  # the others say the same twice
        assert raw == raw2, (path, raw, raw2)


both = [("/v1/completions", "POST", COMPLETION),
        ("/v1/chat/completions", "POST", CHAT),
        ("/v1/models", "GET", None), ("/health", "GET", None),
        ("/metrics", "GET", None), ("/version", "GET", None)]
for path, method, body in both + [("/live", "GET", None),
                                  ("/v1/pdx/info", "GET", None)]:
    same(engine, method, path, body)
for path, method, body in both + [("/ready", "GET", None),
                                  ("/admin/instances", "GET", None),
                                  ("/v1/metaserver", "POST", "{}")]:
    same(proxy, method, path, body)
for port in engine, proxy:
    st, allow, raw = call(port, "GET", "/v1/completions/")
    assert st == 405 and allow == "POST", (port, st, allow, raw)
    for path in ("/nope/", "/v1/models//", "/v1/model/"):
        st, _, raw = call(port, "GET", path)
        e = json.loads(raw)["error"]
        assert st == 404 and e["message"] == "no route " + path, (port, path, st, raw)
print("ok: a trailing slash names the route without it, at the engine and "
      "the proxy; an unknown path stays 404")
PYEOF

$PY - "$PORT_E" "$PORT_X" <<'PYEOF' || fail "Expect: 100-continue"
import json, socket, sys, time

engine, proxy = int(sys.argv[1]), int(sys.argv[2])
MIB = 1 << 20
limits = {engine: 8 * MIB + 64 * 1024, proxy: 8 * MIB}  # client_errors


def head(length):
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % length)


def read_all(s):
    got = b""
    while True:
        b = s.recv(65536)
        if not b:
            return got
        got += b


for port, limit in limits.items():
    for length in (limit + 1, 3 * limit):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        t0 = time.monotonic()
        s.sendall(head(length))  # and waits, as the client should
        try:
            got = read_all(s)
        except socket.timeout:
            raise AssertionError(f"{port}: {length} bytes declared: no "
                                 f"answer without the body")
        took = time.monotonic() - t0
        s.close()
        h, _, body = got.partition(b"\r\n\r\n")
        assert h.startswith(b"HTTP/1.1 413") and \
            b"connection: close" in h.lower(), (port, length, got[:300])
        e = json.loads(body)["error"]
        assert e["code"] == 413 and str(length) in e["message"], e
        assert took < 2, f"{port}: the 413 took {took:.1f} s"
    # under the limit: the 100, then the answer
    body = json.dumps({"prompt": "continue", "max_tokens": 3,
                       "user": "u" * 4096}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(head(len(body)))
    got = s.recv(65536)
    assert got == b"HTTP/1.1 100 Continue\r\n\r\n", (port, got)
    s.sendall(body)
    got = b""
    while b"\r\n\r\n" not in got:
        got += s.recv(65536)
    assert got.startswith(b"HTTP/1.1 200"), (port, got[:300])
    s.close()
print("ok: Expect: 100-continue over the limit: 413 at once and closed; "
      "under it: 100, then 200 (engine and proxy)")
PYEOF

# An engine whose agent is not there yet: refused, not left hanging.
PORT_W=$(free_port)
bg_start W "$ENGINE" --port "$PORT_W" --role prefill --time-scale 0 \
	--agent "ipc://$E2E_TMP/w.engine"
logged W "http://127.0.0.1:$PORT_W refuses connections until it answers" ||
	echo "(no word of the wait in its log: connecting anyway)"
$PY - "$PORT_W" <<'PYEOF' || fail "a client of an engine waiting for its agent"
import socket, sys

s = socket.socket()
s.settimeout(5)
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
except ConnectionRefusedError:
    print("ok: the port refuses connections while the engine waits for "
          "its agent")
    sys.exit(0)
s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
s.settimeout(2)
try:
    got = s.recv(100)
except socket.timeout:
    sys.exit("accepted, and no answer in 2 s")
sys.exit(f"accepted and answered before it serves: {got!r}")
PYEOF
# another process on the port: found at once, before the agent's wait
t0=$SECONDS
timeout 8 "$ENGINE" --port "$PORT_E" --role prefill \
	--agent "ipc://$E2E_TMP/none.engine" 2>"$E2E_TMP/taken.log"
rc=$?
[ $rc = 1 ] && grep -q "Address already in use" "$E2E_TMP/taken.log" ||
	fail "an engine on a port taken: exit $rc: $(cat "$E2E_TMP/taken.log")"
[ $((SECONDS - t0)) -lt 5 ] || fail "a port taken found after $((SECONDS - t0)) s"
# the agent comes: the engine serves
agent_start w --metrics 127.0.0.1:0
logged W "listening on http://127.0.0.1:$PORT_W" ||
	fail "the engine does not serve once its agent came: $(tail -3 "$E2E_TMP/W.log")"
wait_healthy W
echo "ok: an engine serves once its agent came; a port taken is found at once"
# the agent's own /metrics takes the slash too; other paths stay 404
PORT_AW=$(agent_metrics_port w) || exit 1
for path in /metrics /metrics/ /nope /metrics//; do
	code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT_AW$path")
	case $path in /metrics | /metrics/) want=200 ;; *) want=404 ;; esac
	[ "$code" = $want ] || fail "agent GET $path: $code, want $want"
done
echo "ok: the agent's /metrics/ is /metrics"

for n in W agent_w X E; do named_stop $n; done
