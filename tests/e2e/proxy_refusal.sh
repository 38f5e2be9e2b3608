#!/usr/bin/env bash
# One side's refusal ends the other side's leg at once (issue 14, item 2):
#  * in each flow (concurrent, sequential, early-callback) a request the
#    decode engine refuses (streamed with continuous usage stats, which
#    vLLM allows, so the proxy sends it on, and pdx-engine does not
#    implement; the prefill leg carries no stream_options, so the
#    prefill engine computes its long prompt) frees the prefill engine's
#    KV blocks within a second, long before the lease (3 s) would; two of
#    them in a row leave room for the next valid request, which is served
#    at once (before: it queued behind KV nobody would take, and got a 500
#    at the KV timeout);
#  * KV blocks freed by a lease that expired start the request queued
#    for them at once (before: it waited for some other request to come);
#  * a request that gets no room within --queue-timeout-ms is answered
#    503 with a JSON error and Retry-After (before: it waited, however
#    long);
#  * a client's bad on_failure is refused by the proxy before any leg,
#    and, given to a decode engine directly, frees P's KV at once;
#  * a P/D pair whose agents advertise one address is refused by the
#    proxy with a 502 that says what to fix, and both agents say it;
#  * a decode agent whose --advertise reaches nobody says so at start,
#    and its failed transfers blame its own instance, not the prefill.
#   proxy_refusal.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
# shellcheck disable=SC2034 # agent_start (lib.sh) reads it
AGENT=$2
PROXY=$3
LEASE_MS=3000

AGENT_OPTS+=(--lease-ms "$LEASE_MS" --xfer-timeout-ms 20000)
# tiny: 4 tokens a block; a 500-word prompt takes 125 of the 300 blocks,
# so two held prompts leave no room for a third. P prefills in chunks of
# 32 tokens, ~0.8 s for the long prompt: the decode engine refuses while
# P computes (concurrent, early-callback flows: the proxy cancels P's
# leg) or after P answered and holds the KV (sequential: the decode
# engine has its agent abort the transfer at P's)
pd_engine_start P prefill --kv-blocks 300 --time-scale 10000 \
	--max-prefill-tokens 32 --kv-timeout-ms 20000
pd_engine_start D decode --time-scale 0 --kv-timeout-ms 20000
# colocated, slow (~10 ms a token): a long answer keeps its blocks ~3 s
named_engine_start Q "$ENGINE" --kv-blocks 300 --time-scale 10000 \
	--queue-timeout-ms 800
pools=(--prefill "127.0.0.1:$PORT_P" --decode "127.0.0.1:$PORT_D")
named_engine_start XC "$PROXY" "${pools[@]}" --flow concurrent
named_engine_start XS "$PROXY" "${pools[@]}" --flow sequential
named_engine_start XE "$PROXY" "${pools[@]}" --flow early-callback

LONG=$($PY -c 'print(" ".join(["w"] * 500))')
PEER_D=$(curl -sS "http://127.0.0.1:$PORT_D/v1/pdx/info" |
	$PY -c 'import json, sys; print(json.load(sys.stdin)["peer_addr"])')

# req PORT MAX_TOKENS TIMEOUT_S [KV_JSON]: one completion of the long
# prompt; prints "STATUS MS RETRY_AFTER BODY" (status 0: no answer).
req() {
	$PY - "$@" <<'PYEOF'
import json, sys, time, urllib.request, urllib.error
port, n, tmo = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
b = {"prompt": " ".join(["w"] * 500), "max_tokens": n}
if len(sys.argv) > 4 and sys.argv[4]:
    b["kv_transfer_params"] = json.loads(sys.argv[4])
if len(sys.argv) > 5:
    b.update(json.loads(sys.argv[5]))
r = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % port,
    data=json.dumps(b).encode(), headers={"Content-Type": "application/json"})
t0 = time.monotonic()
try:
    with urllib.request.urlopen(r, timeout=tmo) as f:
        st, ra, body = f.status, "-", f.read().decode()
except urllib.error.HTTPError as e:
    st, ra, body = e.code, e.headers.get("Retry-After") or "-", e.read().decode()
except Exception as e:
    st, ra, body = 0, "-", str(e).replace(" ", "_")
print(st, int((time.monotonic() - t0) * 1000), ra, body)
PYEOF
}

# p_free MS: P holds no KV block within MS ms; prints how long it took.
p_free() {
	local t0 end
	t0=$(date +%s%N)
	end=$((t0 + $1 * 1000000))
	until [ "$(val "$PORT_P" "$(e kv_blocks_used)")" = 0 ]; do
		[ "$(date +%s%N)" -lt $end ] || return 1
		sleep 0.02
	done
	echo $((($(date +%s%N) - t0) / 1000000))
}

# A request vLLM's rules allow (so the proxy sends it on) and only the
# decode engine refuses: the prefill leg carries no stream_options, so the
# prefill engine computes and keeps its KV for the transfer. The
# sequential flow first: its first refusal reaches the prefill agent as
# an abort before the two agents ever met.
D_ONLY='{"stream": true, "stream_options": {"continuous_usage_stats": true}}'
for x in XS XC XE; do
	port=$(eval echo "\$PORT_$x")
	for i in 1 2; do
		read -r st ms _ body < <(req "$port" 10 10 "" "$D_ONLY")
		[ "$st" = 400 ] || fail "$x: a request only the decode engine refuses answered $st: $body"
		echo "$body" | $PY -c 'import json, sys; e = json.load(sys.stdin)["error"]; assert e["type"] == "invalid_request_error" and e["param"] == "stream_options", e' ||
			fail "$x: the refusal is not the decode engine's error: $body"
		took=$(p_free 1000) ||
			fail "$x: refusal $i: the prefill engine still holds $(val "$PORT_P" "$(e kv_blocks_used)") KV blocks 1 s after the decode engine refused (lease $LEASE_MS ms)"
		echo "ok: $x: refusal $i answered 400 in $ms ms; prefill's KV free after $took ms"
	done
	read -r st ms _ body < <(req "$port" 4 10)
	[ "$st" = 200 ] || fail "$x: the valid request after two refusals: $st $body"
	[ "$ms" -lt 3000 ] || fail "$x: the valid request after two refusals took $ms ms"
	echo "ok: $x: the next valid request served in $ms ms"
done
settle 10 $(engine_idle P D) || fail "engines not idle after the refusals"

# A client's kv_transfer_params.on_failure that is neither "fail" nor
# "recompute": the proxy answers 400 before any leg (before: D refused
# it after P's leg had begun, and P held the prompt's KV for its lease
# whenever it had answered first: a burst of them starved P, and the
# next valid request failed against P's breaker).
p_legs() {
	curl -sS "http://127.0.0.1:$PORT_XC/metrics" |
		awk '/^pdx_proxy_instance_requests_total\{role="prefill"/ { n += $2 } END { print n + 0 }'
}
legs=$(p_legs)
read -r st _ _ body < <(req "$PORT_XC" 4 10 '{"on_failure": "bogus"}')
[ "$st" = 400 ] && echo "$body" | grep -q '"param":"kv_transfer_params.on_failure"' ||
	fail "a client's on_failure \"bogus\" through the proxy: $st $body"
[ "$(p_legs)" = "$legs" ] || fail "the prefill instance got a leg of a request the proxy refused"
echo "ok: a client's on_failure \"bogus\": 400 from the proxy, no leg sent"

# The decode engine given it directly (a proxy before this one, vLLM's):
# its refusal tells P's agent, which frees the KV at once (before: the
# refusal did not read kv_transfer_params' ids once on_failure was bad,
# and P held the KV for its lease).
peer_p=$(curl -sS "http://127.0.0.1:$PORT_P/v1/pdx/info" |
	$PY -c 'import json, sys; print(json.load(sys.stdin)["peer_addr"])')
x=$(xid)
read -r st _ _ body < <(req "$PORT_P" 4 10 \
	"{\"xfer_id\": \"$x\", \"remote_agent\": \"$PEER_D\", \"do_remote_decode\": true}")
[ "$st" = 200 ] || fail "the prefill request: $st $body"
read -r st _ _ body < <(req "$PORT_D" 4 10 \
	"{\"xfer_id\": \"$x\", \"remote_agent\": \"$peer_p\", \"do_remote_prefill\": true, \"on_failure\": \"bogus\"}")
[ "$st" = 400 ] || fail "the decode engine took on_failure \"bogus\": $st $body"
took=$(p_free 1500) ||
	fail "P still holds $(val "$PORT_P" "$(e kv_blocks_used)") KV blocks 1.5 s after D refused on_failure \"bogus\" (lease $LEASE_MS ms)"
echo "ok: D refuses on_failure \"bogus\" and P's KV is free after $took ms"

# Two prompts' KV held for a decode side that never asks (until the
# lease expires), and a third request queued for blocks: it starts when
# the lease frees them, with nothing else arriving.
for i in 1 2; do
	read -r st _ _ body < <(req "$PORT_P" 4 10 \
		"{\"xfer_id\": \"$(xid)\", \"remote_agent\": \"$PEER_D\", \"do_remote_decode\": true}")
	[ "$st" = 200 ] || fail "orphan $i: $st $body"
done
[ "$(val "$PORT_P" "$(e kv_blocks_used)")" = 250 ] ||
	fail "the orphans hold $(val "$PORT_P" "$(e kv_blocks_used)") blocks, want 250"
read -r st ms _ body < <(req "$PORT_P" 4 $((LEASE_MS / 1000 + 8)))
[ "$st" = 200 ] ||
	fail "a request queued for blocks a lease freed was not served: $st after $ms ms: $body"
[ "$ms" -gt $((LEASE_MS / 2)) ] || fail "the request did not queue ($ms ms)"
[ "$ms" -lt $((LEASE_MS + 2500)) ] ||
	fail "the queued request started $ms ms after it came, lease $LEASE_MS ms"
grep -q "lease expired" "$E2E_TMP/agent_p.log" ||
	fail "the prefill agent's log does not say a lease freed the KV"
echo "ok: a request queued for blocks held under a lease served after $ms ms"

# No room within --queue-timeout-ms: 503 with a JSON error, at its bound.
$PY "$HERE/client.py" stream "$PORT_Q" "$LONG" 300 "$E2E_TMP/a.json" &
apid=$!
settle 10 "$PORT_Q/$(e num_requests_running)=1" || fail "the long request did not start"
read -r st ms ra body < <(req "$PORT_Q" 4 10)
[ "$st" = 503 ] || fail "a request with no room for 800 ms answered $st after $ms ms: $body"
echo "$body" | $PY -c 'import json, sys; e = json.load(sys.stdin)["error"]; assert e["type"] == "service_unavailable" and "queue-timeout-ms" in e["message"] and e["code"] == 503, e' ||
	fail "the 503 is not an OpenAI error naming its bound: $body"
[ "$ra" = 1 ] || fail "the 503 has no Retry-After: $ra"
[ "$ms" -ge 700 ] && [ "$ms" -lt 2500 ] || fail "the 503 came after $ms ms, bound 800 ms"
wait $apid
$PY -c "import json; r = json.load(open('$E2E_TMP/a.json')); assert r['status'] == 200 and r['tokens'] == 300, r" ||
	fail "the long request beside it: $(cat "$E2E_TMP/a.json")"
settle 10 $(engine_idle Q) || fail "Q not idle"
echo "ok: no room within --queue-timeout-ms: 503 after $ms ms, Retry-After $ra"

# A decode instance whose agent advertises P's agent's address (each
# host's agent left at the one-machine example's loopback --listen): the
# proxy refuses the pair, 502 saying what to fix, logged at warn once
# (before: D's engine answered every request 400 "this engine's own
# agent", blaming the client, and both instances stayed healthy)
agent_start w --advertise "$peer_p"
named_engine_start W "$ENGINE" --role decode --agent "ipc://$E2E_TMP/w.engine" \
	--time-scale 0
wait_healthy W
named_engine_start XW "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_W" --health-interval 0
for i in 1 2; do
	read -r st ms ra body < <(req "$PORT_XW" 4 10)
	[ "$st" = 502 ] || fail "a pair with one agent address answered $st: $body"
	echo "$body" | grep -q "advertise one agent address, $peer_p" ||
		fail "the 502 does not say the agents advertise one address: $body"
done
[ "$(grep -v "answered 502: " "$E2E_TMP/XW.log" | grep -c "advertise one agent address")" = 1 ] ||
	fail "the proxy did not warn once: $(grep -c "advertise one agent" "$E2E_TMP/XW.log")"
logged agent_w "does not reach this agent: .*(another agent took it)" ||
	fail "W's agent did not say its --advertise reaches another agent"
logged agent_p "another agent advertises this agent's address $peer_p" ||
	fail "P's agent did not say another agent advertises its address"
echo "ok: a P/D pair whose agents advertise one address: 502 saying so, both agents say it"

# The same under another name (localhost for P's 127.0.0.1): the proxy
# cannot tell, and P's agent answers U's hellos to itself. It refuses
# that answer, its own hello, saying so once (before: it took it, and
# kept itself as a ready peer, its own KV regions as that peer's).
agent_start u --advertise "${peer_p/127.0.0.1/localhost}" \
	--handshake-timeout-ms 1000
named_engine_start U "$ENGINE" --role decode --agent "ipc://$E2E_TMP/u.engine" \
	--time-scale 0
wait_healthy U
# its probe's verdict first (3 s): before it, a hello unanswered blames P
logged agent_u "does not reach this agent: .*(another agent took it)" ||
	fail "U's agent did not say its --advertise reaches another agent"
for i in 1 2; do
	read -r st _ _ body < <(req "$PORT_U" 4 10 \
		"{\"xfer_id\": \"$(xid)\", \"remote_agent\": \"$peer_p\", \"do_remote_prefill\": true}")
	[ "$st" = 500 ] && echo "$body" | grep -q "does not reach it (another agent took it)" ||
		fail "a decode engine whose agent advertises P's address under another name: $st $body"
done
logged agent_p "handshake with $peer_p refused: the hello from $peer_p is this agent's own" ||
	fail "P's agent did not refuse its own hello: $(grep "$peer_p" "$E2E_TMP/agent_p.log" | tail -3)"
[ "$(grep -c "is this agent's own" "$E2E_TMP/agent_p.log")" = 1 ] ||
	fail "P's agent did not say it once: $(grep -c "is this agent's own" "$E2E_TMP/agent_p.log")"
! grep -q "peer $peer_p ready" "$E2E_TMP/agent_p.log" ||
	fail "P's agent keeps itself as a peer: $(grep "peer $peer_p ready" "$E2E_TMP/agent_p.log")"
named_stop U
named_stop agent_u
echo "ok: an agent refuses its own hello, come back under another name for its address"

# A decode instance whose agent advertises an address nobody listens at
# (a typo in --advertise): P's agent answers its hellos there. Its own
# probe says so at start, and its transfers fail blaming it (500), so
# the proxy opens V's breaker, not P's (before: V's engine said 502
# X-PDX-Failed-Side: peer, "no answer to our hello from P", and P was
# blamed for every request; its breaker opened, and P's other decode
# instances could not be served).
agent_start v --advertise "tcp://127.0.0.1:$(free_port)" \
	--handshake-timeout-ms 1000
logged agent_v "does not reach this agent: .*(nothing listens there, or no route)" ||
	fail "V's agent did not say its --advertise reaches nobody: $(tail -3 "$E2E_TMP/agent_v.log")"
named_engine_start V "$ENGINE" --role decode --agent "ipc://$E2E_TMP/v.engine" \
	--time-scale 0
wait_healthy V
read -r st ms _ body < <(req "$PORT_V" 4 10 \
	"{\"xfer_id\": \"$(xid)\", \"remote_agent\": \"$peer_p\", \"do_remote_prefill\": true}")
[ "$st" = 500 ] && echo "$body" | grep -q "this agent's --advertise tcp://127.0.0.1:[0-9]*, where peers answer, does not reach it (nothing listens there, or no route)" ||
	fail "a decode engine whose agent's --advertise reaches nobody: $st $body"
named_engine_start XV "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_V" --health-interval 0 --breaker-failures 2
for i in 1 2 3; do
	read -r st ms _ body < <(req "$PORT_XV" 4 10)
	echo "$body" | grep -q "does not reach it\|no usable decode instance" ||
		fail "request $i through a proxy to V: $st $body"
done
# the proxy's log says a request failed (it said nothing of them)
logged XV "answered 500: relayed from decode instance http://127.0.0.1:$PORT_V" ||
	fail "the proxy did not log the failed request: $(tail -3 "$E2E_TMP/XV.log")"
breakers=$(curl -sS "http://127.0.0.1:$PORT_XV/metrics" | grep '^pdx_proxy_instance_breaker_state')
echo "$breakers" | grep -q "role=\"prefill\".* 0$" ||
	fail "P's breaker is not closed: $breakers"
echo "$breakers" | grep -q "role=\"decode\".* [12]$" ||
	fail "V's breaker is not open: $breakers"
echo "ok: a decode agent whose --advertise reaches nobody says so at start; its transfers blame it, not P (last: $st ${body:0:160})"

# Peers that reach an agent where its own probe does not (behind a NAT
# that does not hairpin; here, P's agent given V's agent's listening
# address): the first message from one takes the warning back, and
# V's unanswered hellos blame their peer again.
v_listen=$(sed -n 's/.*peer link \(tcp:[^ ]*\) (advertised.*/\1/p' "$E2E_TMP/agent_v.log")
read -r st _ _ body < <(req "$PORT_P" 4 10 \
	"{\"xfer_id\": \"$(xid)\", \"remote_agent\": \"$v_listen\", \"do_remote_decode\": true}")
[ "$st" = 200 ] || fail "a prefill request for V's listening address: $st $body"
logged agent_v "a message from $peer_p came: .*the warning is taken back" ||
	fail "V's agent did not take its warning back at a peer's message: $(tail -3 "$E2E_TMP/agent_v.log")"
echo "ok: a peer's message takes the agent's --advertise warning back"

# the early-callback flow behind a wildcard --host without
# --metaserver-url: prefill engines elsewhere cannot post their callback
# to its loopback default, which the proxy says at start (before: only
# "sequential" at info, per request)
named_engine_start XH "$PROXY" --host 0.0.0.0 --flow early-callback \
	"${pools[@]}" --health-interval 0
grep -q "early-callback with --host 0.0.0.0 and no --metaserver-url" "$E2E_TMP/XH.log" ||
	fail "no warning for early-callback behind 0.0.0.0: $(tail -3 "$E2E_TMP/XH.log")"
! grep -q "metaserver-url" "$E2E_TMP/XE.log" ||
	fail "a warning for early-callback on 127.0.0.1: $(grep metaserver-url "$E2E_TMP/XE.log")"

for n in XC XS XE XW XV XH P D W V Q agent_p agent_d agent_w agent_v; do
	named_stop $n
done
echo "ok: a refusal frees the other side's KV at once; freed blocks wake the queue"
