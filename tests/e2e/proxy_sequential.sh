#!/usr/bin/env bash
# pdx-proxy in the sequential flow in front of two colocated engines, one
# as the prefill instance, one as the decode instance. Colocated engines
# refuse kv_transfer_params, so the proxy runs with --on-prefill-failure
# local and D prefills itself: the text through the proxy, streamed and
# not, equals the text from an engine directly. Also: the request id is
# kept, the admin API with and without its token (and refusing a host
# that is no name or address: 400), valid /metrics, a
# killed engine answered with 502/503 and an error JSON, and serving on
# after the dead instance is removed; clients that leave get their
# engine requests aborted (no KV held), also on a reused connection;
# engine connections are kept alive, expire, and a request that meets a
# connection the engine closed is answered 502 and not sent again; out
# of file descriptors, the proxy answers 502 with the reason and does
# not spin on accept(); bad command lines (a host with a CR LF among
# them, no decode instance to be had) exit 2.
#   proxy_sequential.sh BUILD/engine/pdx-engine BUILD/proxy/pdx-proxy
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
PROXY=$2

# admin METHOD PATH [TOKEN] [BODY]: prints the body; status in
# $E2E_TMP/status.
admin() {
	local auth=() data=()
	[ -n "${3:-}" ] && auth=(-H "Authorization: Bearer $3")
	[ -n "${4:-}" ] && data=(--data-binary "$4")
	curl -sS -o "$E2E_TMP/body" -w '%{http_code}' -X "$1" "${auth[@]}" \
		"${data[@]}" "http://127.0.0.1:$PORT$2" >"$E2E_TMP/status" ||
		fail "curl $1 $2"
	cat "$E2E_TMP/body"
}

# established_to PORT: TCP connections open to PORT on this host
established_to() {
	"$PY" - "$1" <<'PYEOF'
import sys
n = 0
for f in ('/proc/net/tcp', '/proc/net/tcp6'):
    try:
        rows = open(f).read().splitlines()[1:]
    except OSError:
        continue
    for r in rows:
        x = r.split()
        n += int(x[2].rsplit(':', 1)[1], 16) == int(sys.argv[1]) and x[3] == '01'
print(n)
PYEOF
}

named_engine_start P "$ENGINE" --time-scale 0
named_engine_start D "$ENGINE" --time-scale 0
named_engine_start D2 "$ENGINE" --time-scale 0 # added by the admin API
named_engine_start X "$PROXY" --prefill "127.0.0.1:$PORT_P" --decoder-hosts 127.0.0.1 \
	--decoder-ports "$PORT_D" --on-prefill-failure local \
	--admin-token s3cret --policy-d least-loaded --flow sequential --retries 0
PORT=$PORT_X

get /health >/dev/null
status_is 200 /health
get /ready >/dev/null
status_is 200 /ready
get /v1/models | py 'import json,sys; m=json.load(sys.stdin); assert [d["id"] for d in m["data"]] == ["tiny"], m' "/v1/models through the proxy"

# the same text through the proxy as from an engine directly
for p in '"Hello, world!"' '[1, 2, 3, 4, 5, 6, 7, 8, 9]'; do
	req="{\"model\": \"tiny\", \"prompt\": $p, \"max_tokens\": 12}"
	PORT=$PORT_P post /v1/completions "$req" >"$E2E_TMP/direct.json"
	PORT=$PORT_X
	post /v1/completions "$req" >"$E2E_TMP/proxied.json"
	status_is 200 "completion through the proxy"
	py "import json; a=json.load(open('$E2E_TMP/direct.json')); b=json.load(open('$E2E_TMP/proxied.json')); assert a['choices'][0]['text'] == b['choices'][0]['text'], (a, b)" "proxied text equals direct text"
	curl -sS -N -d "{\"prompt\": $p, \"max_tokens\": 12, \"stream\": true, \"stream_options\": {\"include_usage\": true}}" \
		"http://127.0.0.1:$PORT/v1/completions" >"$E2E_TMP/proxied.sse" ||
		fail "stream through the proxy"
	"$PY" "$HERE/sse_check.py" "$E2E_TMP/direct.json" \
		"$E2E_TMP/proxied.sse" text 12 >/dev/null || fail "proxied stream vs direct"
done
post /v1/chat/completions '{"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 5}' |
	py 'import json,sys; r=json.load(sys.stdin); assert r["usage"]["completion_tokens"] == 5, r' "chat through the proxy"
post /v1/completions 'not json' >/dev/null
status_is 400 "invalid JSON"

# the client's request id goes to the engine and comes back
curl -sS -D "$E2E_TMP/headers" -o /dev/null -H 'X-Request-Id: my-req-7' \
	-d '{"prompt": "hi", "max_tokens": 2}' "http://127.0.0.1:$PORT/v1/completions" ||
	fail "request with an id"
grep -qi '^x-request-id: my-req-7' "$E2E_TMP/headers" || fail "request id not echoed"

# admin API
admin GET /admin/instances >/dev/null
status_is 401 "admin without a token"
admin GET /admin/instances wrong >/dev/null
status_is 401 "admin with a wrong token"
admin GET /admin/instances s3cret |
	py "import json,sys; r=json.load(sys.stdin); assert sorted((i['role'], i['url']) for i in r['instances']) == [('decode', 'http://127.0.0.1:$PORT_D'), ('prefill', 'http://127.0.0.1:$PORT_P')], r" "admin list"
admin POST /admin/instances s3cret "{\"role\": \"decode\", \"url\": \"http://127.0.0.1:$PORT_D2\"}" >/dev/null
status_is 201 "admin add"
admin POST /admin/instances s3cret "{\"role\": \"decode\", \"url\": \"http://127.0.0.1:$PORT_D2\"}" >/dev/null
status_is 409 "admin add twice"
# an engine of the prefill pool: one or the other, as on the command line
admin POST /admin/instances s3cret "{\"role\": \"decode\", \"url\": \"http://127.0.0.1:$PORT_P\"}" >/dev/null
status_is 409 "admin add of a prefill instance as decode"
admin POST /admin/instances s3cret '{"role": "middle", "url": "http://127.0.0.1:1"}' >/dev/null
status_is 400 "admin add with a bad role"
# a host that is no name or address: a CR LF in one split the /metrics
# page (every Prometheus scrape of it failed), a quote broke its labels
for url in 'http://a\r\nX: y:1' 'http://a\"b:1' 'http://a b:1'; do
	admin POST /admin/instances s3cret "{\"role\": \"decode\", \"url\": \"$url\"}" >/dev/null
	status_is 400 "admin add of the host in $url"
	grep -q "bad address" "$E2E_TMP/body" || fail "admin add of $url: $(cat "$E2E_TMP/body")"
done
admin GET /admin/instances s3cret |
	py 'import json,sys; r=json.load(sys.stdin); assert len(r["instances"]) == 3, r' "admin list after add"

get /metrics >"$E2E_TMP/metrics"
"$PY" "$HERE/promcheck.py" "$E2E_TMP/metrics" 'pdx_proxy_requests_inflight=0' \
	"pdx_proxy_instances{role=\"decode\"}=2" ||
	fail "/metrics is not valid Prometheus text"

# the decode engine dies: its requests get 502/503 with an error JSON
# (this proxy does not retry them on the other; proxy_resilience.sh does)
kill -KILL "$PID_D"
wait "$PID_D" 2>/dev/null
E2E_PIDS=${E2E_PIDS/ $PID_D/}
rm -f "/dev/shm/pdx-engine-$PID_D-"* # its KV pool, left by the kill
bad=0
for _ in 1 2 3 4; do
	post /v1/completions '{"prompt": "still?", "max_tokens": 3}' >"$E2E_TMP/r.json"
	case $(cat "$E2E_TMP/status") in
	200) ;;
	502 | 503)
		bad=$((bad + 1))
		py "import json; e=json.load(open('$E2E_TMP/r.json'))['error']; assert e['type'] and e['message'] and e['code'] in (502, 503), e" "error JSON"
		;;
	*) fail "HTTP $(cat "$E2E_TMP/status") with a dead decode engine" ;;
	esac
done
[ $bad -ge 1 ] || fail "no request met the dead engine"
admin DELETE "/admin/instances?url=http://127.0.0.1:$PORT_D" s3cret >/dev/null
status_is 200 "admin remove"
admin DELETE "/admin/instances?url=http://127.0.0.1:$PORT_D" s3cret >/dev/null
status_is 404 "admin remove twice"
# the type every other 404 of the proxy gives (it said "not_found")
py "import json; e=json.load(open('$E2E_TMP/body'))['error']; assert e['type'] == 'not_found_error', e" "admin 404 JSON"
for _ in 1 2 3 4; do
	post /v1/completions '{"prompt": "still?", "max_tokens": 3}' >/dev/null
	status_is 200 "served by the other instance after the remove"
done
get /metrics >"$E2E_TMP/metrics"
"$PY" "$HERE/promcheck.py" "$E2E_TMP/metrics" "pdx_proxy_requests_total{code=\"502\"}=$bad" ||
	fail "/metrics after the failure"
named_stop X

# no admin token configured: the admin API is off
# (no health checks: their connections would be counted below)
named_engine_start Y "$PROXY" --decode "127.0.0.1:$PORT_P" --keepalive-timeout 1000 \
	--health-interval 0
PORT=$PORT_Y
admin GET /admin/instances anything >/dev/null
status_is 403 "admin without a configured token"
post /v1/completions '{"prompt": "decode only", "max_tokens": 3}' >/dev/null
status_is 200 "decode-only proxy"

# one keep-alive connection to the engine serves requests one after
# another, and is closed once idle for --keepalive-timeout
for _ in $(seq 10); do
	post /v1/completions '{"prompt": "again", "max_tokens": 2}' >/dev/null
	status_is 200 "request on a kept connection"
done
n=$(established_to "$PORT_P")
[ "$n" = 1 ] || fail "$n connections to the engine after 11 requests one by one, want 1"
sleep 1.5
n=$(established_to "$PORT_P")
[ "$n" = 0 ] || fail "$n connections to the engine left after --keepalive-timeout"
named_stop Y

# out of file descriptors (ulimit -n 32): --max-inflight is lowered; a
# request whose engine leg gets no socket is answered 503 with the
# reason, and is neither counted against the instance (6 of them opened
# its breaker, and every client got 503 "no usable decode instance"
# after the burst) nor retried on the other; accept() failing is not retried in a loop; the proxy
# serves again once descriptors are free
bg_start F bash -c 'ulimit -n 32 && exec "$@" --port 0' _ "$PROXY" --decode "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D"
for _ in $(seq 100); do
	PORT_F=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9]*\)$/\1/p' "$E2E_TMP/F.log")
	[ -n "$PORT_F" ] && break
	sleep 0.1
done
[ -n "$PORT_F" ] || fail "proxy under ulimit -n 32 did not start: $(tail -3 "$E2E_TMP/F.log")"
grep -q -- '--max-inflight 4096 lowered to' "$E2E_TMP/F.log" ||
	fail "--max-inflight not lowered under ulimit -n 32"
"$PY" - "$PORT_F" >"$E2E_TMP/emfile" <<'PYEOF' || fail "client holding descriptors"
import socket, sys, time
port = int(sys.argv[1])
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(60)]
time.sleep(0.6)
body = b'{"prompt": "hi", "max_tokens": 2}'
for k in range(6):  # more than --breaker-failures
    socks[k].sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\n'
                     b'Content-Type: application/json\r\nContent-Length: %d\r\n\r\n'
                     % len(body) + body)
    socks[k].settimeout(10)
    data = b''
    while b'\r\n\r\n' not in data or not data.rstrip().endswith(b'}'):
        d = socks[k].recv(65536)
        if not d:
            break
        data += d
print(data.split(b' ')[1].decode(), data.partition(b'\r\n\r\n')[2].decode())
for s in socks:
    s.close()
PYEOF
read -r code body <"$E2E_TMP/emfile"
[ "$code" = 503 ] || fail "out of descriptors: HTTP $code, want 503: $body"
echo "$body" | grep -q '"message":"this proxy is out of file descriptors.*"type":"service_unavailable"' ||
	fail "out of descriptors: the 503 does not say why: $body"
# nor retried on the other instance (its leg would fail alike): each
# request was, counted and logged
! grep -q "retry 1 of" "$E2E_TMP/F.log" ||
	fail "out of descriptors: retried: $(grep -m1 "retry 1 of" "$E2E_TMP/F.log")"
n=$(grep -c 'accept:' "$E2E_TMP/F.log")
[ "$n" -ge 1 ] && [ "$n" -le 5 ] ||
	fail "$n accept() error lines in 0.6 s, want 1..5: $(grep 'accept:' "$E2E_TMP/F.log" | head -3)"
sleep 0.3
PORT=$PORT_F post /v1/completions '{"prompt": "room again", "max_tokens": 2}' >/dev/null
status_is 200 "served again once descriptors are free"
named_stop F

# a container's ulimit -n 256 and 4 instances: the idle connections kept
# are counted only as far as requests could have opened them (every
# instance's whole --keepalive counted lowered --max-inflight to 1)
bg_start G bash -c 'ulimit -n 256 && exec "$@" --port 0' _ "$PROXY" \
	--decode "127.0.0.1:$PORT_P" --decode 127.0.0.1:1 \
	--decode 127.0.0.1:2 --decode 127.0.0.1:3
for _ in $(seq 100); do
	grep -q 'listening on' "$E2E_TMP/G.log" && break
	sleep 0.1
done
cap=$(sed -n 's/.*--max-inflight 4096 lowered to \([0-9]*\):.*/\1/p' "$E2E_TMP/G.log")
[ "${cap:-0}" -ge 20 ] ||
	fail "ulimit -n 256, 4 instances: --max-inflight lowered to '$cap', want 20 or more: $(tail -3 "$E2E_TMP/G.log")"
named_stop G

# an engine that closes a kept connection instead of answering the next
# request on it: that request gets 502 and is not sent again (a prefill
# must not run twice); the next one gets a new connection
"$PY" - "$E2E_TMP/closer.log" >"$E2E_TMP/closer" <<'PYEOF' &
import socket, sys, threading
log = open(sys.argv[1], 'a', buffering=1)
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)

def serve(c, k):
    buf = b''
    for n in (1, 2):
        while b'\r\n\r\n' not in buf:
            d = c.recv(65536)
            if not d:
                c.close()
                return
            buf += d
        head, _, buf = buf.partition(b'\r\n\r\n')
        lines = head.decode().split('\r\n')
        clen, auth = 0, '-'
        for l in lines[1:]:
            name, _, v = l.partition(':')
            if name.strip().lower() == 'content-length':
                clen = int(v)
            if name.strip().lower() == 'authorization':
                auth = v.strip().replace(' ', '_')
        while len(buf) < clen:
            buf += c.recv(65536)
        body, buf = buf[:clen], buf[clen:]
        log.write('%d %d %s %s\n' % (k, n, auth, body.decode()))
        if n == 1:
            out = b'{"choices": [{"text": "ok"}]}'
            c.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n'
                      b'Content-Length: %d\r\n\r\n' % len(out) + out)
    c.close()

k = 0
while True:
    c, _ = s.accept()
    k += 1
    threading.Thread(target=serve, args=(c, k), daemon=True).start()
PYEOF
E2E_PIDS="$E2E_PIDS $!"
for _ in $(seq 50); do [ -s "$E2E_TMP/closer" ] && break; sleep 0.1; done
named_engine_start C "$PROXY" --decode "127.0.0.1:$(cat "$E2E_TMP/closer")" \
	--retries 0 --health-interval 0
PORT=$PORT_C
post /v1/completions '{"prompt": "first", "max_tokens": 2}' >/dev/null
status_is 200 "first request to the closing engine"
post /v1/completions '{"prompt": "second", "max_tokens": 2}' >"$E2E_TMP/r.json"
status_is 502 "a request on a connection the engine closed"
py "import json; e=json.load(open('$E2E_TMP/r.json'))['error']; assert 'closed early' in e['message'], e" "502 error JSON"
curl -sS -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer k3y' \
	-d '{"prompt": "third", "max_tokens": 2}' \
	"http://127.0.0.1:$PORT/v1/completions" >"$E2E_TMP/status"
status_is 200 "the request after, on a new connection"
grep third "$E2E_TMP/closer.log" | grep -q "Bearer_k3y" ||
	fail "the client's Authorization did not reach the engine: $(cat "$E2E_TMP/closer.log")"
[ "$(grep -c second "$E2E_TMP/closer.log")" = 1 ] ||
	fail "the request was sent $(grep -c second "$E2E_TMP/closer.log") times: $(cat "$E2E_TMP/closer.log")"
grep -q '^1 2 .*second' "$E2E_TMP/closer.log" ||
	fail "the second request did not go on the kept connection: $(cat "$E2E_TMP/closer.log")"
named_stop C

# clients that leave mid-stream or mid-generation: the engine's requests
# are aborted and their KV freed (tiny at scale 10000: ~10 ms a token)
named_engine_start S "$ENGINE" --time-scale 10000
named_engine_start Z "$PROXY" --decode "127.0.0.1:$PORT_S"
PORT=$PORT_Z post /v1/completions '{"prompt": "warm", "max_tokens": 2}' >/dev/null
status_is 200 "a request that leaves a kept connection"
long='{"prompt": "tell me a long story", "max_tokens": 1000'
curl -sS -N --max-time 1 -d "$long, \"stream\": true}" \
	"http://127.0.0.1:$PORT_Z/v1/completions" >"$E2E_TMP/s1" 2>/dev/null &
c1=$!
curl -sS --max-time 1 -d "$long}" \
	"http://127.0.0.1:$PORT_Z/v1/completions" >/dev/null 2>&1 &
c2=$!
wait $c1 $c2
grep -q '^data: {' "$E2E_TMP/s1" || fail "the proxied stream sent no token before the client left"
sleep 0.3
PORT=$PORT_S get /metrics >"$E2E_TMP/after"
"$PY" "$HERE/promcheck.py" "$E2E_TMP/after" \
	'pdx_engine_num_requests_running{model_name="tiny"}=0' \
	'pdx_engine_kv_blocks_used{model_name="tiny"}=0' \
	'pdx_engine_requests_aborted_total{model_name="tiny"}=2' ||
	fail "the engine kept requests whose client left the proxy"
PORT=$PORT_Z get /metrics >"$E2E_TMP/after"
"$PY" "$HERE/promcheck.py" "$E2E_TMP/after" \
	'pdx_proxy_requests_aborted_total=2' 'pdx_proxy_requests_inflight=0' ||
	fail "proxy metrics after the clients left"
PORT=$PORT_Z post /v1/completions '{"prompt": "after", "max_tokens": 2}' >/dev/null
status_is 200 "a request after the clients left"
named_stop Z
named_stop S
named_stop P

# an engine that accepts and never answers: 504 at the first-byte deadline
"$PY" -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8)
print(s.getsockname()[1], flush=True); time.sleep(30)' >"$E2E_TMP/hole" &
E2E_PIDS="$E2E_PIDS $!"
for _ in $(seq 50); do [ -s "$E2E_TMP/hole" ] && break; sleep 0.1; done
named_engine_start H "$PROXY" --decode "127.0.0.1:$(cat "$E2E_TMP/hole")" --first-byte-timeout 300 \
	--health-interval 0
PORT=$PORT_H post /v1/completions '{"prompt": "anyone?", "max_tokens": 3}' >"$E2E_TMP/r.json"
status_is 504 "an engine that never answers"
py "import json; e=json.load(open('$E2E_TMP/r.json'))['error']; assert 'first byte' in e['message'], e" "504 error JSON"
named_stop H

# bad command lines exit 2
"$PROXY" --port 0 --prefill 127.0.0.1:1 2>"$E2E_TMP/bare.log"
[ $? -eq 2 ] && grep -q "no decode instance: give --decode" "$E2E_TMP/bare.log" ||
	fail "a proxy that could never serve should be refused: $(cat "$E2E_TMP/bare.log")"
"$PROXY" --flow parallel 2>/dev/null
[ $? -eq 2 ] || fail "an unknown flow should be refused"
"$PROXY" --metaserver-url ftp://x 2>/dev/null
[ $? -eq 2 ] || fail "a metaserver URL that is not http:// should be refused"
"$PROXY" --prefiller-hosts a b --prefiller-ports 1 2>/dev/null
[ $? -eq 2 ] || fail "unpaired vLLM lists should be refused"
"$PROXY" --decode nope 2>/dev/null
[ $? -eq 2 ] || fail "a bad address should be refused"
"$PROXY" --decode "$(printf 'a\r\nb:1')" 2>/dev/null
[ $? -eq 2 ] || fail "a host with a CR LF should be refused"
# one engine given as both (each pair then shared one agent, and got a
# 502 that prescribed --advertise)
"$PROXY" --port 0 --prefill 127.0.0.1:1 --decode http://127.0.0.1:1/ 2>"$E2E_TMP/both.log"
[ $? -eq 2 ] && grep -q "is given with both --prefill and --decode" "$E2E_TMP/both.log" ||
	fail "one engine in both pools: $(cat "$E2E_TMP/both.log")"
echo ok
