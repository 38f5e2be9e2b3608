#!/bin/bash
# A decode request whose client leaves while its KV is on the way: the
# decode engine keeps the request's KV blocks until its agent's event,
# which comes once the prefill agent said nothing more lands in them
# (`stopped`); only then are they free for another request. Here the
# prefill agent is frozen (SIGSTOP) after the decode agent asked it for
# the KV: while it is, the blocks stay held (before: freed at once, and a
# push still under way wrote them after another request took them); once
# it runs again they are free within 2 s, and the engines serve. The same
# when the decode engine's own bound (--kv-timeout-ms) ends its wait. A
# decode engine stopped while a receive waits exits cleanly.
#   decode_abort.sh PDX_ENGINE PDX_AGENT
. "$(dirname "$0")/lib.sh"
ENGINE=$1
AGENT=$2

# P's engine would take its agent's 1.5 s freeze below for a death (the
# link's liveness, 1 s by default) and register again, refusing transfers
# meanwhile: the freeze stands for a slow agent, not a dead one
pd_engine_start P prefill --time-scale 0 --agent-liveness-ms 10000
pd_engine_start D decode --time-scale 0 --kv-timeout-ms 20000
PEER_P=$(curl -sS "http://127.0.0.1:$PORT_P/v1/pdx/info" |
	sed -n 's/.*"peer_addr": *"\([^"]*\)".*/\1/p')
[ -n "$PEER_P" ] || fail "no peer address for P"

# used PORT: the engine's KV blocks held by requests
used() {
	curl -sS "http://127.0.0.1:$1/metrics" |
		sed -n 's/^pdx_engine_kv_blocks_used{[^}]*} \([0-9.e+]*\)$/\1/p' |
		awk '{ printf "%d", $1 }'
}

# waiting PORT OUT [KV_EXTRA]: a decode request to the engine at PORT
# for a transfer P's engine never begins (its agent asks P's, which holds
# the ask), its body in OUT and status in OUT.code, in the background
# (pid in $client); returns once it holds KV blocks.
waiting() {
	curl -sS -o "$2" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary \
		"{\"prompt\": \"$(seq -s ' ' 1 200)\", \"max_tokens\": 4, \"kv_transfer_params\": {\"xfer_id\": \"$(xid)\", \"remote_agent\": \"$PEER_P\", \"do_remote_prefill\": true${3:-}}}" \
		"http://127.0.0.1:$1/v1/completions" >"$2.code" &
	client=$!
	for _ in $(seq 50); do
		[ "$(used "$1")" -gt 0 ] && return
		sleep 0.1
	done
}

# wanted LOG: returns once the agent logging to LOG met P's agent (its
# hello answered): it sends its want at that moment (agent/handshake.c,
# xfers_peer_ready), and from then on P's agent may write the blocks.
# A fixed sleep here (0.5 s, 1 s) was not enough on a loaded machine: P's
# agent, frozen before it answered the hello, had been sent no want, and
# the receive's abort rightly freed the blocks at once (nothing could land
# in them), which the checks below took for the defect.
wanted() {
	for _ in $(seq 100); do
		grep -q "peer $PEER_P ready" "$1" && return 0
		sleep 0.1
	done
	fail "$1: its agent did not meet P's in 10 s: $(tail -3 "$1")"
}

# D waits for a transfer P's engine has not begun
waiting "$PORT_D" "$E2E_TMP/d0"
held=$(used "$PORT_D")
[ "$held" -gt 0 ] || fail "D's request holds no blocks while it waits"
wanted "$E2E_TMP/agent_d.log"

kill -STOP "$PID_agent_p"
kill "$client"
wait "$client" 2>/dev/null
sleep 1.5
now=$(used "$PORT_D")
kill -CONT "$PID_agent_p"
[ "$now" = "$held" ] ||
	fail "D freed its request's blocks ($held held, $now now) while P's agent, which may still write them, was frozen"

ok=
for _ in $(seq 20); do
	[ "$(used "$PORT_D")" = 0 ] && { ok=1; break; }
	sleep 0.1
done
[ -n "$ok" ] || fail "D still holds $(used "$PORT_D") blocks 2 s after P's agent ran again"
grep -q "aborted" "$E2E_TMP/D.log" || fail "D's engine logged no abort: $(tail -5 "$E2E_TMP/D.log")"

# both still serve a transfer
x=$(xid)
curl -sS -o "$E2E_TMP/d" -H 'Content-Type: application/json' --data-binary \
	"{\"prompt\": \"again\", \"max_tokens\": 3, \"kv_transfer_params\": {\"xfer_id\": \"$x\", \"remote_agent\": \"$PEER_P\", \"do_remote_prefill\": true}}" \
	"http://127.0.0.1:$PORT_D/v1/completions" &
d=$!
PEER_D=$(curl -sS "http://127.0.0.1:$PORT_D/v1/pdx/info" |
	sed -n 's/.*"peer_addr": *"\([^"]*\)".*/\1/p')
curl -sS -o "$E2E_TMP/p" -f -H 'Content-Type: application/json' --data-binary \
	"{\"prompt\": \"again\", \"max_tokens\": 1, \"kv_transfer_params\": {\"xfer_id\": \"$x\", \"remote_agent\": \"$PEER_D\", \"do_remote_decode\": true}}" \
	"http://127.0.0.1:$PORT_P/v1/completions" || fail "P: $(cat "$E2E_TMP/p")"
wait "$d"
grep -q '"finish_reason"' "$E2E_TMP/d" || fail "D after the abort: $(cat "$E2E_TMP/d")"

# The same when D's own bound (--kv-timeout-ms) ends the wait: E (a
# decode engine with a bound of 4 s) aborts the receive at its agent
# and waits for the event; with P's agent frozen, its request is still
# unanswered and its blocks held past the bound (before: a 502
# and the blocks free, or recomputed, at once); once P's agent runs, the
# request fails (on_failure fail) and every block is free. The bound
# leaves room for the new pair of agents' hellos under load (they must
# come before it for the want to be sent), and the freeze lasts until
# a second past it, counted from the request.
pd_engine_start E decode --time-scale 0 --kv-timeout-ms 4000
t0=$(date +%s%N)
waiting "$PORT_E" "$E2E_TMP/e" ', "on_failure": "fail"'
wanted "$E2E_TMP/agent_e.log"
kill -STOP "$PID_agent_p"
grep -q "no event in time" "$E2E_TMP/E.log" &&
	fail "E's bound passed before its agent met P's: $(tail -3 "$E2E_TMP/agent_e.log")"
left=$((5000 - ($(date +%s%N) - t0) / 1000000))
[ $left -gt 0 ] && sleep "$(printf '%d.%03d' $((left / 1000)) $((left % 1000)))"
now=$(used "$PORT_E")
alive=$(kill -0 "$client" 2>/dev/null && echo yes)
kill -CONT "$PID_agent_p"
[ "$now" -gt 0 ] && [ "$alive" = yes ] ||
	fail "E ended its receive at its bound without its agent's event ($now blocks held, request running: ${alive:-no}): $(cat "$E2E_TMP/e" 2>/dev/null)"
wait "$client"
[ "$(cat "$E2E_TMP/e.code")" = 502 ] || fail "E's request: $(cat "$E2E_TMP/e.code") $(cat "$E2E_TMP/e")"
for _ in $(seq 20); do
	[ "$(used "$PORT_E")" = 0 ] && break
	sleep 0.1
done
[ "$(used "$PORT_E")" = 0 ] || fail "E holds $(used "$PORT_E") blocks after its failed request"
named_stop E
named_stop agent_e

# D stopped while a receive waits (its blocks go to the transfer as
# on a client's leaving): a clean exit, nothing used after its free
waiting "$PORT_D" "$E2E_TMP/d1"
sleep 0.3
named_stop D
wait "$client" 2>/dev/null

named_stop P
named_stop agent_p
named_stop agent_d
echo "ok: an aborted receive's blocks held until nothing more lands"
