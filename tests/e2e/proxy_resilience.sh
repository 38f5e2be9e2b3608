#!/usr/bin/env bash
# pdx-proxy when engines fail, in front of two prefill engines and a
# decode engine with their pdx-agents, checked against a colocated
# engine's text:
#  * a prefill engine stopped (SIGSTOP): its leg's first byte times out
#    and the request starts over on the other P (sequential flow);
#  * the stopped engine fails its health checks: unhealthy in the admin
#    list and /metrics, no request goes to it (no more retries); after
#    SIGCONT it passes them and is re-admitted (it serves again); the
#    log says "no answer in time" for it, "cannot connect" for a killed
#    one;
#  * a prefill engine killed (SIGKILL) mid-prefill while D waits for its
#    KV (concurrent flow): D's request ends, aborted by the proxy or
#    failed by D's agent once P1's agent says its engine is gone (D's
#    engine counts it either way), and the request starts over on the
#    other P under a new xfer_id; no KV block stays held; the killed
#    engine turns unhealthy;
#  * no usable prefill instance left: 503 at once, not a hang, and
#    /ready answers 503; a prefill address nobody listens on: after its
#    breaker opens, 503s that pick no decode instance (its request count
#    stays); /ready 200 once the admin API removed every prefill instance
#    (decode-only), and under --on-prefill-failure local;
#  * a prefill instance whose breaker opened for a minute answers again:
#    health checks that saw it go and come back let the trial go at
#    once, and it closes the breaker;
#  * a decode instance answering 500: retried on the other (the client
#    never sees the 500); its circuit breaker opens after
#    --breaker-failures, lets one trial through after --breaker-open-ms
#    (failed: open again), and closes when the trial succeeds;
#  * a decode instance of another model (the agents refuse to pair,
#    X-PDX-Failed-Side: both): its breaker opens, the prefill instance's
#    stays closed, every request served by a retry on the good one;
#  * the timeouts on the decode leg: connect (a listener whose backlog is
#    full) answered 504, and a stream whose engine stops mid-way cut at
#    --idle-timeout.
#   proxy_resilience.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
# shellcheck disable=SC2034 # agent_start (lib.sh) reads it
AGENT=$2
PROXY=$3

# tiny at scale 10000: P prefills in chunks of 32 tokens, so the long
# prompt below takes ~0.8 s there; a short one a step or two
slow=(--time-scale 10000 --max-prefill-tokens 32)
pd_engine_start P1 prefill "${slow[@]}"
pd_engine_start P2 prefill "${slow[@]}"
pd_engine_start D decode --time-scale 0
named_engine_start C "$ENGINE" --time-scale 0
# health checks every 300 ms, out after 2 failed, back after 2 passed;
# the breaker off here (it has its own proxy below)
pools=(--prefill "127.0.0.1:$PORT_P1" --prefill "127.0.0.1:$PORT_P2"
	--decode "127.0.0.1:$PORT_D" --retries 1 --health-interval 300
	--health-timeout 200 --unhealthy-after 2 --healthy-after 2
	--breaker-failures 0 --admin-token t)
named_engine_start X "$PROXY" "${pools[@]}" --flow concurrent
# (XS without health checks: its requests below must meet the stopped
# P2; a client later than two of XS's checks found it out of rotation
# already, 0 retries; X checks health for both)
named_engine_start XS "$PROXY" "${pools[@]}" --flow sequential --first-byte-timeout 1000 \
	--health-interval 0
pp1="http://127.0.0.1:$PORT_P1"
pp2="http://127.0.0.1:$PORT_P2"

healthy() { echo "pdx_proxy_instance_healthy{$(instance "$1")}"; }
retries() { val "$1" 'pdx_proxy_retries_total{leg="prefill"}'; }

# wait_val SECONDS PORT NAME VALUE: until the sample has the value.
wait_val() {
	local end v
	end=$(($(date +%s%N) + $1 * 1000000000))
	while v=$(val "$2" "$3"); [ "$v" != "$4" ]; do
		[ "$(date +%s%N)" -lt $end ] ||
			fail "after $1 s $3 is $v, want $4 (port $2): $(tail -5 "$E2E_TMP/X.log")"
		sleep 0.05
	done
}

# burst PORT N PROMPT: N completions at once; prints "STATUS TEXT" each.
burst() {
	$PY - "$@" <<'PYEOF'
import json, sys, threading, urllib.request, urllib.error
port, n, prompt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
out = [None] * n
def one(k):
    req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % port,
        data=json.dumps({"prompt": prompt, "max_tokens": 6}).encode(),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            out[k] = "%d %s" % (r.status, json.load(r)["choices"][0]["text"])
    except urllib.error.HTTPError as e:
        out[k] = "%d %s" % (e.code, e.read().decode())
    except Exception as e:
        out[k] = "000 %s" % e
ts = [threading.Thread(target=one, args=(k,)) for k in range(n)]
for t in ts: t.start()
for t in ts: t.join()
print("\n".join(out))
PYEOF
}

# colocated PROMPT: the colocated engine's text.
colocated() {
	burst "$PORT_C" 1 "$1" | sed -n 's/^200 //p'
}

# all_ok PORT N PROMPT WHAT: N at once, each 200 with the colocated text;
# the last burst's output in $E2E_TMP/burst.
all_ok() {
	local line want
	want=$(colocated "$3")
	[ -n "$want" ] || fail "no text from the colocated engine"
	burst "$1" "$2" "$3" >"$E2E_TMP/burst"
	while read -r line; do
		[ "$line" = "200 $want" ] ||
			fail "$4: '$line', want '200 $want': $(tail -5 "$E2E_TMP/X.log")"
	done <"$E2E_TMP/burst"
}

short="resilience, a short prompt"
long=$($PY -c "print(' '.join('w%d' % i for i in range(2000)))")
all_ok "$PORT_X" 4 "$short" "warm-up through both prefill engines"
all_ok "$PORT_XS" 2 "$short" "warm-up, sequential flow"
[ "$(retries "$PORT_X")" = 0 ] || fail "retries before any failure"

# P2 stops: one of two requests meets it, its first byte times out and
# the request starts over on P1 with a new transfer
kill -STOP "$PID_P2"
all_ok "$PORT_XS" 2 "$short" "a prefill engine stopped"
[ "$(retries "$PORT_XS")" = 1 ] || fail "$(retries "$PORT_XS") retries after a prefill engine stopped, want 1"
grep -q "prefill instance $pp2: first byte timed out; retry 1 of 1 on other instances, transfer [0-9a-f]\{32\} (was [0-9a-f]\{32\})" "$E2E_TMP/XS.log" ||
	fail "no retry logged: $(grep -i retry "$E2E_TMP/XS.log")"
wait_val 3 "$PORT_X" "$(healthy P2)" 0
grep -q "prefill instance $pp2 unhealthy: 2 health checks failed in a row (last: no answer in time)" "$E2E_TMP/X.log" ||
	fail "the stopped instance's checks: $(grep "$pp2 unhealthy" "$E2E_TMP/X.log")"
PORT=$PORT_X get /ready >/dev/null
status_is 200 "/ready with one prefill instance unhealthy"
curl -sS -H 'Authorization: Bearer t' "http://127.0.0.1:$PORT_X/admin/instances" |
	$PY -c "import json, sys
i = {x['url']: x for x in json.load(sys.stdin)['instances']}
assert i['$pp2']['healthy'] is False and i['$pp1']['healthy'] is True, i
assert i['$pp2']['breaker'] == 'closed', i" || fail "admin list: P2 unhealthy, P1 healthy"
all_ok "$PORT_X" 4 "$short" "P2 out of rotation"
[ "$(retries "$PORT_X")" = 0 ] || fail "a request went to the unhealthy prefill instance"

# P2 comes back: re-admitted after two passed checks, and serves
kill -CONT "$PID_P2"
wait_val 3 "$PORT_X" "$(healthy P2)" 1
n2=$(val "$PORT_X" "pdx_proxy_instance_requests_total{$(instance P2)}")
all_ok "$PORT_X" 4 "$short" "P2 re-admitted"
[ "$(val "$PORT_X" "pdx_proxy_instance_requests_total{$(instance P2)}")" -gt "$n2" ] ||
	fail "the re-admitted prefill instance got no request"
grep -q "prefill instance $pp2 healthy again" "$E2E_TMP/X.log" || fail "re-admission not logged"

# P1 is killed mid-prefill while D waits for its KV: D's request ends,
# the request starts over on P2 under a new transfer. Which ends it is a
# race: the proxy leaving it (aborted) or D's agent hearing P1's agent's
# `gone` first (D answers 502, rejected).
d_ended() {
	echo $(($(val "$PORT_D" "$(e requests_aborted_total)") +
		$(val "$PORT_D" "$(e requests_rejected_total)")))
}
d_ab=$(d_ended)
burst "$PORT_X" 2 "$long" >"$E2E_TMP/burst" &
b=$!
for _ in $(seq 200); do
	[ "$(val "$PORT_P1" "$(e num_requests_running)")" = 1 ] &&
		[ "$(val "$PORT_D" "$(e num_requests_running)")" = 2 ] && break
	sleep 0.02
done
[ "$(val "$PORT_D" "$(e num_requests_running)")" = 2 ] || fail "D does not wait for both transfers"
kill9 P1
wait $b
want=$(colocated "$long")
[ "$(grep -c "^200 $want\$" "$E2E_TMP/burst")" = 2 ] ||
	fail "prefill killed mid-prefill: $(cut -c1-200 "$E2E_TMP/burst"), want 200 '$want'"
[ "$(retries "$PORT_X")" = 1 ] || fail "$(retries "$PORT_X") retries after a prefill engine was killed, want 1"
[ "$(d_ended)" -gt "$d_ab" ] ||
	fail "the decode engine did not end the request of the killed prefill"
sed -n 's/.*transfer \([0-9a-f]*\) (was \([0-9a-f]*\))$/\1 \2/p' "$E2E_TMP/X.log" "$E2E_TMP/XS.log" >"$E2E_TMP/ids"
[ "$(wc -l <"$E2E_TMP/ids")" = 2 ] || fail "retries logged: $(cat "$E2E_TMP/ids")"
while read -r new old; do
	[ "$new" != "$old" ] || fail "a retry reused transfer $old"
done <"$E2E_TMP/ids"
wait_val 3 "$PORT_X" "$(healthy P1)" 0
# dead, not hung: the log says which
grep -q "prefill instance $pp1 unhealthy: 2 health checks failed in a row (last: cannot connect (nothing listens there, or no route to it))" "$E2E_TMP/X.log" ||
	fail "the killed instance's checks: $(grep "$pp1 unhealthy" "$E2E_TMP/X.log")"
blocks_free "$PORT_D" "$PORT_P2"

# no usable prefill instance: 503 at once, and not ready
kill -STOP "$PID_P2"
wait_val 3 "$PORT_X" "$(healthy P2)" 0
t0=$(date +%s%N)
PORT=$PORT_X post /v1/completions "{\"prompt\": \"$short\", \"max_tokens\": 6}" >"$E2E_TMP/r.json"
ms=$((($(date +%s%N) - t0) / 1000000))
status_is 503 "no usable prefill instance"
grep -q 'no usable prefill instance' "$E2E_TMP/r.json" || fail "503 body: $(cat "$E2E_TMP/r.json")"
[ $ms -lt 1000 ] || fail "the 503 took $ms ms"
PORT=$PORT_X get /ready >/dev/null
status_is 503 "/ready with no usable prefill instance"
kill -CONT "$PID_P2"
named_stop X
named_stop XS

# a prefill address nobody listens on: its breaker opens after the
# first request; then a 503 without a decode instance picked (its
# request count and any breaker trial untouched), and not ready
nowhere="127.0.0.1:$(free_port)"
lone=(--prefill "$nowhere" --decode "127.0.0.1:$PORT_D" --retries 0
	--breaker-failures 1 --breaker-open-ms 60000 --health-interval 0
	--admin-token t)
named_engine_start N "$PROXY" "${lone[@]}"
for k in $(seq 6); do
	PORT=$PORT_N post /v1/completions "{\"prompt\": \"$short\", \"max_tokens\": 6}" >/dev/null
	[ "$(cat "$E2E_TMP/status")" -ge 500 ] || fail "request $k with the prefill instance unreachable: $(cat "$E2E_TMP/status")"
done
[ "$(val "$PORT_N" "pdx_proxy_instance_requests_total{$(instance D)}")" -le 1 ] ||
	fail "$(val "$PORT_N" "pdx_proxy_instance_requests_total{$(instance D)}") requests counted on the decode instance, want at most 1"
PORT=$PORT_N get /ready >/dev/null
status_is 503 "/ready with the prefill instance's breaker open (--on-prefill-failure fail)"
# every prefill instance removed: decode-only, served and ready
[ "$(curl -sS -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer t' -X DELETE \
	"http://127.0.0.1:$PORT_N/admin/instances?url=http://$nowhere")" = 200 ] ||
	fail "removing the prefill instance"
PORT=$PORT_N get /ready >/dev/null
status_is 200 "/ready with every prefill instance removed"
all_ok "$PORT_N" 1 "$short" "decode-only once every prefill instance is removed"
named_stop N
# the same under --on-prefill-failure local: D prefills, so ready
named_engine_start L "$PROXY" "${lone[@]}" --on-prefill-failure local
all_ok "$PORT_L" 2 "$short" "prefill instance unreachable, D prefills"
PORT=$PORT_L get /ready >/dev/null
status_is 200 "/ready with the prefill instance unusable under --on-prefill-failure local"
named_stop L

# a prefill instance that stops answering opens its breaker (for a
# minute here) and comes back: health checks that saw it go and come
# back after the breaker opened let one trial go at once, and its
# success closes the breaker (before, the instance got nothing for the
# whole minute, and the failures of the others had nowhere to be
# retried meanwhile)
named_engine_start H "$PROXY" --prefill "127.0.0.1:$PORT_P2" \
	--decode "127.0.0.1:$PORT_D" --retries 0 --flow sequential \
	--first-byte-timeout 300 --breaker-failures 1 --breaker-open-ms 60000 \
	--health-interval 200 --health-timeout 150 --unhealthy-after 2 \
	--healthy-after 1
hb() { val "$PORT_H" "pdx_proxy_instance_breaker_state{$(instance P2)}"; }
kill -STOP "$PID_P2"
PORT=$PORT_H post /v1/completions "{\"prompt\": \"$short\", \"max_tokens\": 6}" >/dev/null
[ "$(cat "$E2E_TMP/status")" -ge 500 ] || fail "a request to the stopped prefill instance: $(cat "$E2E_TMP/status")"
[ "$(hb)" = 1 ] || fail "breaker state $(hb) after the instance failed, want 1 (open)"
# out after two failed checks, then two more at least (every 200 ms,
# 150 ms each) sent after the breaker opened fail
wait_val 3 "$PORT_H" "$(healthy P2)" 0
sleep 0.5
kill -CONT "$PID_P2"
t0=$(date +%s%N)
for _ in $(seq 50); do
	PORT=$PORT_H post /v1/completions "{\"prompt\": \"$short\", \"max_tokens\": 6}" >/dev/null
	[ "$(cat "$E2E_TMP/status")" = 200 ] && break
	sleep 0.1
done
ms=$((($(date +%s%N) - t0) / 1000000))
status_is 200 "the prefill instance answering again ${ms} ms after its breaker opened for 60 s"
[ "$(hb)" = 0 ] || fail "breaker state $(hb) after the trial succeeded, want 0 (closed)"
grep -q "prefill instance $pp2 failed a health check and then passed one while its circuit breaker was open: one trial request may go now" "$E2E_TMP/H.log" ||
	fail "the early trial not logged: $(grep -i breaker "$E2E_TMP/H.log")"
named_stop H

# a decode instance that passes health checks but answers completions
# with 500 (until the file ok exists), beside a good one
cat >"$E2E_TMP/flaky.py" <<'PYEOF'
import os, socketserver, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def reply(self, code, body):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.reply(200, b'{"status":"ok"}')
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        ok = os.path.exists(sys.argv[1] + "/ok")
        with open(sys.argv[1] + "/posts", "a") as f:
            f.write("200\n" if ok else "500\n")
        if ok:
            self.reply(200, b'{"choices": [{"index": 0, "text": "flaky"}]}')
        else:
            self.reply(500, b'{"error": {"message": "broken"}}')
    def log_message(self, *a):
        pass
class S(socketserver.ThreadingMixIn, HTTPServer):
    daemon_threads = True
s = S(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
PYEOF
$PY "$E2E_TMP/flaky.py" "$E2E_TMP" >"$E2E_TMP/flaky.port" &
E2E_PIDS="$E2E_PIDS $!"
for _ in $(seq 50); do [ -s "$E2E_TMP/flaky.port" ] && break; sleep 0.1; done
fl="http://127.0.0.1:$(cat "$E2E_TMP/flaky.port")"
named_engine_start B "$PROXY" --decode "$fl" --decode "127.0.0.1:$PORT_C" \
	--retries 1 --breaker-failures 3 --breaker-open-ms 1000 --health-interval 0
prompt=$short
state() { val "$PORT_B" "pdx_proxy_instance_breaker_state{role=\"decode\",instance=\"$fl\"}"; }
turned() { val "$PORT_B" "pdx_proxy_instance_breaker_transitions_total{role=\"decode\",instance=\"$fl\",to=\"$1\"}"; }
posts() { grep -c "^$1" "$E2E_TMP/posts"; }
for k in $(seq 8); do
	PORT=$PORT_B post /v1/completions "{\"prompt\": \"$prompt\", \"max_tokens\": 6}" >"$E2E_TMP/r.json"
	status_is 200 "request $k with a decode instance answering 500"
done
[ "$(posts 500)" = 3 ] || fail "$(posts 500) requests reached the failing instance, want 3 (then its breaker opens)"
[ "$(val "$PORT_B" 'pdx_proxy_retries_total{leg="decode"}')" = 3 ] || fail "decode retries"
[ "$(state)" = 1 ] && [ "$(turned open)" = 1 ] || fail "breaker state $(state), opened $(turned open) times"
# open for 1 s, then one trial: it fails, the breaker opens again
sleep 1.1
for k in 1 2 3 4; do
	PORT=$PORT_B post /v1/completions "{\"prompt\": \"$prompt\", \"max_tokens\": 6}" >/dev/null
	status_is 200 "request $k while the breaker is half-open"
done
[ "$(posts 500)" = 4 ] || fail "$(posts 500) requests reached the failing instance, want 4 (one trial)"
[ "$(state)" = 1 ] && [ "$(turned half_open)" = 1 ] && [ "$(turned open)" = 2 ] ||
	fail "after a failed trial: state $(state), half-open $(turned half_open), open $(turned open)"
# the instance works again: the next trial closes the breaker
touch "$E2E_TMP/ok"
sleep 1.1
for k in 1 2 3 4; do
	PORT=$PORT_B post /v1/completions "{\"prompt\": \"$prompt\", \"max_tokens\": 6}" >/dev/null
	status_is 200 "request $k once the instance works"
done
[ "$(posts 200)" -ge 2 ] && [ "$(state)" = 0 ] && [ "$(turned closed)" = 1 ] ||
	fail "after a good trial: $(posts 200) served, state $(state), closed $(turned closed)"
PORT=$PORT_B get /metrics >"$E2E_TMP/metrics"
$PY "$HERE/promcheck.py" "$E2E_TMP/metrics" || fail "/metrics is not valid Prometheus text"
named_stop B

# a decode instance of another model beside a good one: the agents
# refuse to pair (the layouts differ), which is both instances' doing;
# the one that fails with every partner opens its breaker, the prefill
# instance's stays closed (it succeeds with the good one), and every
# request is served by a retry on the good decode instance
pd_engine_start W decode --model qwen2-7b --kv-blocks 16 --time-scale 0
named_engine_start M "$PROXY" --prefill "127.0.0.1:$PORT_P2" \
	--decode "127.0.0.1:$PORT_D" --decode "127.0.0.1:$PORT_W" \
	--retries 1 --breaker-failures 3 --breaker-open-ms 60000 \
	--health-interval 0
breaker() { val "$PORT_M" "pdx_proxy_instance_breaker_state{$(instance "$1")}"; }
# (a prompt of a few chunks: W's refusal, at once, answers before P2's
# prefill ends, so the retry avoids W, not the one prefill instance)
mid=$($PY -c "print(' '.join('w%d' % i for i in range(200)))")
for k in $(seq 10); do
	all_ok "$PORT_M" 1 "$mid" "request $k beside a decode instance of another model"
done
[ "$(breaker W)" = 1 ] && [ "$(breaker P2)" = 0 ] && [ "$(breaker D)" = 0 ] ||
	fail "breakers: W $(breaker W) (want open), P2 $(breaker P2), D $(breaker D) (want closed)"
named_stop M
named_stop W

# a decode instance whose own bound is too short (--kv-timeout-ms 20,
# below P2's prefill of a few chunks) beside a good one: its 502 says
# both sides (a bound ran out: which side was slow, or whose bound too
# short, neither can tell), so it opens its own breaker, not the prefill
# instance's, and every request is served by a retry on the good one
# (before: "peer", counted against the prefill instance alone, whose
# breaker opened while the short one's stayed closed: with two prefill
# instances both went out, and every client got 503; a chaos helper's
# find)
pd_engine_start V decode --time-scale 0 --kv-timeout-ms 20
named_engine_start M "$PROXY" --prefill "127.0.0.1:$PORT_P2" \
	--decode "127.0.0.1:$PORT_D" --decode "127.0.0.1:$PORT_V" \
	--retries 1 --breaker-failures 3 --breaker-open-ms 60000 \
	--health-interval 0
for k in $(seq 10); do
	all_ok "$PORT_M" 1 "$mid" "request $k beside a decode instance whose bound is too short"
done
[ "$(breaker V)" = 1 ] && [ "$(breaker P2)" = 0 ] && [ "$(breaker D)" = 0 ] ||
	fail "breakers: V $(breaker V) (want open), P2 $(breaker P2), D $(breaker D) (want closed)"
grep -q "decode instance http://127.0.0.1:$PORT_V failed (502); retry" "$E2E_TMP/M.log" ||
	fail "the retries did not avoid V: $(grep retry "$E2E_TMP/M.log" | head -3)"
named_stop M
named_stop V

# connect timeout: a listener whose accept queue is full drops the SYN
$PY -c 'import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(0)
cs = []
for _ in range(4):
    c = socket.socket(); c.setblocking(False); c.connect_ex(s.getsockname()); cs.append(c)
print(s.getsockname()[1], flush=True); time.sleep(60)' >"$E2E_TMP/full" &
E2E_PIDS="$E2E_PIDS $!"
for _ in $(seq 50); do [ -s "$E2E_TMP/full" ] && break; sleep 0.1; done
named_engine_start T "$PROXY" --decode "127.0.0.1:$(cat "$E2E_TMP/full")" \
	--connect-timeout 300 --health-interval 0
PORT=$PORT_T post /v1/completions '{"prompt": "anyone?", "max_tokens": 3}' >"$E2E_TMP/r.json"
status_is 504 "a connect that never completes"
grep -q 'connect timed out' "$E2E_TMP/r.json" || fail "504 body: $(cat "$E2E_TMP/r.json")"
named_stop T

# idle timeout: the engine stops mid-stream; the stream ends within
# --idle-timeout (1 s), without [DONE]
named_engine_start S "$ENGINE" --time-scale 10000
named_engine_start I "$PROXY" --decode "127.0.0.1:$PORT_S" --idle-timeout 1 --health-interval 0
stream_start I 1000 "a long story"
kill -STOP "$PID_S"
t0=$(date +%s%N)
wait $c
ms=$((($(date +%s%N) - t0) / 1000000))
kill -CONT "$PID_S"
grep -q '^data: {' "$E2E_TMP/I.sse" || fail "no token before the engine stopped"
! grep -q '\[DONE\]' "$E2E_TMP/I.sse" || fail "a stream cut short ended with [DONE]"
[ $ms -ge 500 ] && [ $ms -lt 3000 ] || fail "the stream ended $ms ms after the engine stopped, want ~1000"
grep -q 'idle timeout; stream cut short' "$E2E_TMP/I.log" || fail "idle timeout not logged: $(tail -3 "$E2E_TMP/I.log")"
named_stop I
named_stop S
for x in P2 D C; do named_stop $x; done
echo ok
