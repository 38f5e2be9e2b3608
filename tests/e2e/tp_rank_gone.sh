#!/usr/bin/env bash
# A rank of a tensor-parallel instance killed:
#  * a prefill rank's engine gone after its instance answered the
#    prefill (its agent up, no engine registered): the decode agent's
#    hello is refused for want of an engine, and the decode engine's 502
#    says the other side failed (X-PDX-Failed-Side: peer), so a proxy
#    retries on another prefill instance and counts it against the
#    prefill one only. Before, every hello_nack failed the transfers
#    EINCOMPAT ("the agents refused to pair", a mismatch of the two):
#    X-PDX-Failed-Side: both, the failure counted against the healthy
#    decode instance too, and the retry looked for another decode
#    instance. The same for a TP 1 prefill engine.
#  * a rank killed while a generation runs on its instance: the request
#    fails (the leader cannot run a pass without the rank), and what the
#    client reads names the rank, as /health does: streamed, an SSE error
#    event; whole, the 500's message. Before, both said "peer
#    unreachable" (the status's name), the reason only in /health.
#  * a follower whose leader never comes (a wrong --tp-leader) waits, as
#    ranks may start in any order, but says so every ten liveness
#    periods; before, it waited without a word.
#   tp_rank_gone.sh PDX_ENGINE PDX_AGENT
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
small=(--model tiny --kv-blocks 64 --max-model-len 256 --time-scale 0
	--kv-timeout-ms 30000)
toks=$(seq -s, 7 36)

# gone_decode NAME VICTIM WHAT: P prefills on prefill instance NAME, its
# engine VICTIM (a rank) is killed, D decodes from P's answer: a 502
# naming the other side
gone_decode() {
	local port
	port=$(eval echo "\$PORT_$1")
	PORT=$port post /v1/completions "{\"prompt\": [$toks], \"max_tokens\": 1,
		\"kv_transfer_params\": {\"do_remote_decode\": true}}" >"$E2E_TMP/p.json"
	status_is 200 "prefill ($3)"
	kv=$($PY -c "import json; print(json.dumps(json.load(open('$E2E_TMP/p.json'))['kv_transfer_params']))")
	kill9 "$2"
	# its agent saw the engine's end (else D's hello could come first,
	# and the transfer fail as the engine's, not by a refusal)
	local agent_log
	agent_log="$E2E_TMP/agent_$(echo "$2" | tr '[:upper:]' '[:lower:]').log"
	for _ in $(seq 50); do
		grep -q "the engine's connection closed" "$agent_log" && break
		sleep 0.1
	done
	grep -q "the engine's connection closed" "$agent_log" ||
		fail "$3: its agent did not see the engine's end: $(tail -3 "$agent_log")"
	curl -sS -D "$E2E_TMP/d.h" -o "$E2E_TMP/body" -w '%{http_code}' \
		-H 'Content-Type: application/json' --data-binary \
		"{\"prompt\": [$toks], \"max_tokens\": 3, \"kv_transfer_params\": $kv}" \
		"http://127.0.0.1:$PORT_D/v1/completions" >"$E2E_TMP/status"
	status_is 502 "decode from a prefill whose engine is gone ($3)"
	grep -qi '^X-PDX-Failed-Side: peer' "$E2E_TMP/d.h" ||
		fail "$3: the other side failed, not both: $(grep -i x-pdx "$E2E_TMP/d.h"): $(cat "$E2E_TMP/body")"
	grep -q "no engine registered" "$E2E_TMP/body" ||
		fail "$3: why: $(cat "$E2E_TMP/body")"
}

pd_engine_start D decode "${small[@]}"
tp_engine_start P prefill 2 "${small[@]}"
gone_decode P P1 "TP 2, rank 1 killed"
pd_engine_start Q prefill "${small[@]}"
gone_decode Q Q "TP 1"
# D is as well as before
blocks_free "$PORT_D"
PORT=$PORT_D get /health >/dev/null
status_is 200 "D's health"
for x in P D; do named_stop $x; done

# llama3-8b's modeled decode steps (time-scale 20): ~0.1 s a token
E2E_MODEL=llama3-8b # e()'s label
opts=(--model llama3-8b --kv-blocks 32 --max-model-len 512 --time-scale 20)

# gen NAME STREAM: instance NAME (TP 2, colocated) generates 200 tokens;
# rank 1 is killed after its first tokens; the answer in $E2E_TMP/NAME.out
gen() {
	tp_engine_start "$1" both 2 "${opts[@]}"
	local port
	port=$(eval echo "\$PORT_$1")
	curl -sS -N -o "$E2E_TMP/$1.out" -w '%{http_code}' \
		-H 'Content-Type: application/json' --data-binary \
		"{\"prompt\": \"hello there\", \"max_tokens\": 200, \"stream\": $2}" \
		"http://127.0.0.1:$port/v1/completions" >"$E2E_TMP/$1.status" &
	local cpid=$!
	settle 10 "$port/$(e num_requests_running)=1" ||
		fail "$1: the generation did not start"
	sleep 0.5 # a few of its tokens
	kill9 "${1}1"
	wait $cpid
}

gen S true
[ "$(cat "$E2E_TMP/S.status")" = 200 ] || fail "stream: HTTP $(cat "$E2E_TMP/S.status")"
grep '^data: {"error"' "$E2E_TMP/S.out" | grep -q "tensor-parallel rank 1" ||
	fail "the stream's error event names the rank: $(grep error "$E2E_TMP/S.out")"

gen W false
[ "$(cat "$E2E_TMP/W.status")" = 500 ] || fail "whole: HTTP $(cat "$E2E_TMP/W.status"): $(cat "$E2E_TMP/W.out")"
grep -q "tensor-parallel rank 1" "$E2E_TMP/W.out" ||
	fail "the 500 names the rank: $(cat "$E2E_TMP/W.out")"
for x in S W; do named_stop $x; done

agent_start lone1
bg_start L1 "$ENGINE" --tp-size 2 --tp-rank 1 --agent-liveness-ms 100 \
	--tp-leader "ipc://$E2E_TMP/nobody.tp" --agent "ipc://$E2E_TMP/lone1.engine"
for _ in $(seq 50); do
	grep -q "no word from the leader at ipc://$E2E_TMP/nobody.tp yet" \
		"$E2E_TMP/L1.log" && break
	sleep 0.1
done
grep -q "no word from the leader" "$E2E_TMP/L1.log" ||
	fail "a follower without its leader says nothing: $(tail -3 "$E2E_TMP/L1.log")"
kill -0 "$PID_L1" || fail "the follower without its leader exited: $(tail -3 "$E2E_TMP/L1.log")"
echo ok
