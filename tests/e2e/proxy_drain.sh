#!/usr/bin/env bash
# pdx-proxy's shutdown and admission, in front of a colocated engine that
# streams a token every ~10 ms:
#  * SIGTERM during a stream: /ready answers 503 at once, a new request
#    gets 503, the stream runs to its [DONE], and the proxy exits 0;
#  * a second signal during the drain ends it at once (exit 0, the
#    stream cut with an error event saying why, the engine aborts its
#    request);
#  * --drain-timeout ends a drain that lasts too long: a stream ends
#    with that error event, a request not yet answered gets 503;
#  * at --max-inflight a request gets 429 with Retry-After; a body over
#    --max-body gets 413.
#   proxy_drain.sh PDX_ENGINE PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
PROXY=$2

named_engine_start S "$ENGINE" --time-scale 10000

# exited NAME: waits for the proxy; its exit status must be 0. How many
# ms it took in $ms.
exited() {
	local pid rc t0
	pid=$(eval echo "\$PID_$1")
	t0=$(date +%s%N)
	wait "$pid"
	rc=$?
	E2E_PIDS=${E2E_PIDS/ $pid/}
	[ $rc = 0 ] || fail "$1 exited with $rc: $(tail -3 "$E2E_TMP/$1.log")"
	ms=$((($(date +%s%N) - t0) / 1000000))
}

# cut_short NAME: the stream in $E2E_TMP/NAME.sse was cut by the proxy
# stopping: it ends with an error event saying so, no [DONE]
cut_short() {
	! grep -q '\[DONE\]' "$E2E_TMP/$1.sse" || fail "$1: a cut stream ended with [DONE]"
	grep -v "^$" "$E2E_TMP/$1.sse" | tail -1 | grep -q '^data: {"error"' ||
		fail "$1: a cut stream's last event is not an error: $(tail -c 300 "$E2E_TMP/$1.sse")"
	grep -v "^$" "$E2E_TMP/$1.sse" | tail -1 | grep -q 'proxy is shutting down' ||
		fail "$1: the error does not say why: $(tail -1 "$E2E_TMP/$1.sse")"
	! grep -q 'client left' "$E2E_TMP/$1.log" || fail "$1: the proxy's own stop logged as a client leaving"
}

# SIGTERM mid-stream: the stream finishes, nothing new is taken
named_engine_start W "$PROXY" --decode "127.0.0.1:$PORT_S" --health-interval 0
stream_start W 150 "drain me"
kill -TERM "$PID_W"
PORT=$PORT_W get /ready >/dev/null
status_is 503 "/ready while draining"
grep -q draining "$E2E_TMP/body" || fail "/ready body: $(cat "$E2E_TMP/body")"
[ "$(val "$PORT_W" pdx_proxy_draining)" = 1 ] || fail "pdx_proxy_draining is not 1"
PORT=$PORT_W post /v1/completions '{"prompt": "too late", "max_tokens": 2}' >/dev/null
status_is 503 "a new request while draining"
grep -q 'shutting down' "$E2E_TMP/body" || fail "503 body: $(cat "$E2E_TMP/body")"
wait $c || fail "the stream did not finish cleanly while draining (curl $?)"
grep -q '^data: \[DONE\]' "$E2E_TMP/W.sse" || fail "the drained stream has no [DONE]"
[ "$(grep -c '^data: {' "$E2E_TMP/W.sse")" -ge 150 ] ||
	fail "the drained stream has $(grep -c '^data: {' "$E2E_TMP/W.sse") chunks, want 150"
exited W
[ "$ms" -lt 5000 ] || fail "the proxy took $ms ms to exit after its last request"

# a second signal while draining: out at once, the stream cut, the
# engine's request aborted
ab=$(val "$PORT_S" "$(e requests_aborted_total)")
named_engine_start W2 "$PROXY" --decode "127.0.0.1:$PORT_S" --health-interval 0
stream_start W2 3000 "drain me"
kill -TERM "$PID_W2"
sleep 0.3
kill -INT "$PID_W2"
exited W2
[ "$ms" -lt 2000 ] || fail "a second signal: the proxy took $ms ms to exit"
wait $c
cut_short W2
for _ in $(seq 100); do
	[ "$(val "$PORT_S" "$(e requests_aborted_total)")" -gt "$ab" ] &&
		[ "$(val "$PORT_S" "$(e num_requests_running)")" = 0 ] && break
	sleep 0.05
done
[ "$(val "$PORT_S" "$(e num_requests_running)")" = 0 ] ||
	fail "the engine still runs the request of a proxy that exited"

# --drain-timeout: a stream longer than it is cut when it passes
named_engine_start W3 "$PROXY" --decode "127.0.0.1:$PORT_S" --health-interval 0 \
	--drain-timeout 1
stream_start W3 3000 "drain me"
s3=$c
curl -sS -o "$E2E_TMP/W3.body" -w '%{http_code}' \
	-d '{"prompt": "unanswered", "max_tokens": 3000}' \
	"http://127.0.0.1:$PORT_W3/v1/completions" >"$E2E_TMP/W3.status" &
u3=$!
sleep 0.3
kill -TERM "$PID_W3"
exited W3
[ "$ms" -ge 700 ] && [ "$ms" -lt 3000 ] || fail "--drain-timeout 1: exited after $ms ms"
grep -q 'drain-timeout: 2 requests still in flight are cut short' "$E2E_TMP/W3.log" ||
	fail "drain timeout not logged: $(tail -3 "$E2E_TMP/W3.log")"
wait $s3
cut_short W3
wait $u3
[ "$(cat "$E2E_TMP/W3.status")" = 503 ] && grep -q 'proxy is shutting down' "$E2E_TMP/W3.body" ||
	fail "a request unanswered at --drain-timeout: $(cat "$E2E_TMP/W3.status") $(cat "$E2E_TMP/W3.body")"

# admission: 429 with Retry-After at --max-inflight, 413 over --max-body
named_engine_start W4 "$PROXY" --decode "127.0.0.1:$PORT_S" --health-interval 0 \
	--max-inflight 1 --max-body 1024
stream_start W4 100 "drain me"
curl -sS -D "$E2E_TMP/head" -o "$E2E_TMP/body" -w '%{http_code}' \
	-d '{"prompt": "one more", "max_tokens": 2}' \
	"http://127.0.0.1:$PORT_W4/v1/completions" >"$E2E_TMP/status" || fail "curl"
status_is 429 "a request over --max-inflight"
grep -qi '^retry-after: 1' "$E2E_TMP/head" || fail "429 without Retry-After: $(cat "$E2E_TMP/head")"
/usr/bin/python3 -c 'import json, sys; e = json.load(open(sys.argv[1]))["error"]; assert e["code"] == 429 and "in flight" in e["message"], e' \
	"$E2E_TMP/body" || fail "429 body: $(cat "$E2E_TMP/body")"
wait $c || fail "the stream beside the 429"
PORT=$PORT_W4 post /v1/completions '{"prompt": "room again", "max_tokens": 2}' >/dev/null
status_is 200 "a request once the one in flight ended"
big=$(head -c 2000 /dev/zero | tr '\0' a)
PORT=$PORT_W4 post /v1/completions "{\"prompt\": \"$big\", \"max_tokens\": 2}" >/dev/null
status_is 413 "a body over --max-body"
[ "$(val "$PORT_W4" 'pdx_proxy_requests_total{code="429"}')" = 1 ] || fail "429 not counted"
named_stop W4
named_stop S
echo ok
