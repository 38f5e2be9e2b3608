#!/usr/bin/env bash
# Tensor parallelism 2 -> 2: a prefill and a decode instance of two ranks
# each (four pdx-engine processes, four pdx-agents; rank i of one pairs
# with rank i of the other), driven directly and behind pdx-proxy in each
# of its flows (sequential, concurrent, early-callback: the proxy names
# every rank's agent to the other side and counts each transfer once per
# instance, done when all its ranks' agents reported it). Each rank holds its KV heads only: both decode ranks'
# pools are checked byte for byte against the whole model's KV of their
# heads (tp_kv_check.py, from docs/engine.md's formula); the text equals a
# TP 1 colocated engine's (the token reads head 0, which rank 0 holds
# whatever the TP size); every block comes back free. Then a follower
# killed mid-request: the request ends at once with a reason naming the
# rank (not at --kv-timeout-ms), /health says why, and the instance
# refuses new transfers. Before that, the whole decode instance frozen a
# moment longer than its ranks' liveness is not broken by it.
#   tp_pd.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3

notify="tcp://127.0.0.1:$(free_port)"
AGENT_OPTS+=(--notify "$notify")
small=(--model tiny --kv-blocks 64 --max-model-len 256 --time-scale 0
	--kv-timeout-ms 30000)

# refusals first: a split that cannot work says why
"$ENGINE" --model tiny --tp-size 4 --tp-leader ipc://x --agent ipc://y \
	--port 0 2>"$E2E_TMP/bad.log" && fail "tiny (2 KV heads) on 4 ranks started"
grep -q "do not split evenly" "$E2E_TMP/bad.log" || fail "why not 4: $(cat "$E2E_TMP/bad.log")"
"$ENGINE" --model tiny --tp-size 3 --port 0 2>"$E2E_TMP/bad.log" && fail "TP 3 started"
grep -q "power of two" "$E2E_TMP/bad.log" || fail "why not 3: $(cat "$E2E_TMP/bad.log")"

tp_engine_start P prefill 2 "${small[@]}"
tp_engine_start D decode 2 "${small[@]}"
named_engine_start C "$ENGINE" "${small[@]}"
grep -q "engine registered: 4 layers x 2 tensors" "$E2E_TMP/agent_p1.log" ||
	fail "rank 1's agent: $(grep registered "$E2E_TMP/agent_p1.log")"
# a follower of another role is refused by the leader, saying why (it
# joined before: the hello carried no role)
agent_start dx
timeout 10 "$ENGINE" --role prefill --tp-size 2 --tp-rank 1 \
	--tp-leader "ipc://$E2E_TMP/d.tp" --agent "ipc://$E2E_TMP/dx.engine" \
	"${small[@]}" 2>"$E2E_TMP/role.log"
rc=$?
[ "$rc" = 1 ] && grep -q "rank 1 has --role prefill, the leader decode" "$E2E_TMP/role.log" ||
	fail "a prefill follower of a decode leader: exit $rc, $(tail -2 "$E2E_TMP/role.log")"
PORT=$PORT_P get /v1/pdx/info >"$E2E_TMP/info"
py "import json; i=json.load(open('$E2E_TMP/info')); assert len(i['peer_addrs']) == 2 and i['peer_addrs'][0] == i['peer_addr'] and i['tp_size'] == 2, i" \
	"the leader's info lists both ranks' agents"

# pd TOKENS TAG WHAT: P prefills the prompt TOKENS (its answer's
# kv_transfer_params in $kv), D decodes 5 tokens from its KV, and the text
# must be the colocated engine's; the answers in $E2E_TMP/{p,d,c}TAG.json.
pd() {
	PORT=$PORT_P post /v1/completions "{\"prompt\": [$1], \"max_tokens\": 1,
		\"kv_transfer_params\": {\"do_remote_decode\": true}}" >"$E2E_TMP/p$2.json"
	status_is 200 "prefill $3"
	kv=$("$PY" -c "import json; print(json.dumps(json.load(open('$E2E_TMP/p$2.json'))['kv_transfer_params']))")
	PORT=$PORT_D post /v1/completions "{\"prompt\": [$1], \"max_tokens\": 5,
		\"kv_transfer_params\": $kv}" >"$E2E_TMP/d$2.json"
	status_is 200 "decode $3"
	PORT=$PORT_C post /v1/completions "{\"prompt\": [$1], \"max_tokens\": 5}" >"$E2E_TMP/c$2.json"
	py "import json; a=json.load(open('$E2E_TMP/c$2.json')); b=json.load(open('$E2E_TMP/d$2.json')); assert a['choices'][0]['text'] == b['choices'][0]['text'], (a, b)" \
		"TP 2 -> 2 equals TP 1 colocated $3"
}
# health_becomes CODE WHAT: D's /health answers CODE within 10 s
health_becomes() {
	for _ in $(seq 100); do
		PORT=$PORT_D get /health >/dev/null
		[ "$(cat "$E2E_TMP/status")" = "$1" ] && break
		sleep 0.1
	done
	status_is "$1" "health $2"
}

# directly, in vLLM's sequential shape: P's answer names both its ranks
toks=$(seq -s, 7 36) # 30 tokens: 8 blocks of 4, the last one partial
pd "$toks" "" ""
py "import json; k=json.loads('$kv'); assert k['remote_tp_size'] == 2 and len(k['remote_agents']) == 2 and k['remote_agents'][0] == k['remote_agent'], k" \
	"the prefill answer carries both ranks' agents"
kv1=$kv
for r in "D:0" "D1:1" "P:0" "P1:1"; do
	pid=$(eval echo "\$PID_${r%%:*}")
	$PY "$HERE/tp_kv_check.py" "$(engine_pool "$pid")" 4 2 2 16 2 4 64 2 \
		"${r##*:}" "$toks" || fail "${r%%:*}'s KV is not its heads' exactly"
done

# the same prompt and more: the leader's prefix cache takes its 7 full
# blocks on every rank, and each rank's agent asks only for the rest
pd "$toks,$(seq -s, 37 44)" 2 "with a prefix hit"
settle 10 "$PORT_D/$(e prefix_hit_tokens_total)=28" || fail "no prefix hit of 28 tokens"
# (every rank checks the whole prompt's KV, cached and received, and
# logs "differs" where a byte is wrong: grepped below)

# through pdx-proxy, in each flow; every rank's agent reports to it
# proxy_start NAME FLOW: the proxy, also as PORT_X
proxy_start() {
	named_engine_start "$1" "$PROXY" --prefill "127.0.0.1:$PORT_P" \
		--decode "127.0.0.1:$PORT_D" --flow "$2" --notify-bind "$notify" \
		--admin-token s3cret
	PORT_X=$(eval echo "\$PORT_$1")
}
# tp_known ROLE: the TP size the proxy learned for that instance
tp_known() {
	curl -sS -H 'Authorization: Bearer s3cret' \
		"http://127.0.0.1:$PORT_X/admin/instances" >"$E2E_TMP/admin.json"
	$PY -c "import json; print([i.get('tp') for i in json.load(open('$E2E_TMP/admin.json'))['instances'] if i['role'] == '$1'][0])"
}
for flow in sequential concurrent early-callback; do
	proxy_start "X_${flow%%-*}" $flow
	n=0
	for p in '"Hello, world!"' "[$(seq -s, 1 64)]" '"The quick brown fox jumps over the lazy dog"'; do
		n=$((n + 1))
		req="{\"prompt\": $p, \"max_tokens\": $((n * 3))}"
		PORT=$PORT_C post /v1/completions "$req" >"$E2E_TMP/c$n.json"
		status_is 200 "colocated: $req"
		PORT=$PORT_X post /v1/completions "$req" >"$E2E_TMP/x$n.json"
		status_is 200 "through the proxy ($flow): $req"
		py "import json; a=json.load(open('$E2E_TMP/c$n.json')); b=json.load(open('$E2E_TMP/x$n.json')); assert a['choices'][0]['text'] == b['choices'][0]['text'], (a, b)" \
			"TP 2 -> 2 through pdx-proxy ($flow) equals TP 1 colocated: $req"
	done
	blocks_free "$PORT_P" "$PORT_D"
	# P's TP size, in every flow: its transfers count until both its
	# ranks reported them (the sequential and early-callback flows never
	# asked P, and ended P's count at rank 0's report)
	[ "$(tp_known prefill)" = 2 ] && [ "$(tp_known decode)" = 2 ] ||
		fail "$flow: the proxy's TP sizes: $(cat "$E2E_TMP/admin.json")"
	# one transfer per request, each instance counted as one
	settle 10 "$PORT_X/pdx_proxy_transfers_sent_total{path=\"ipc\"}=3" \
		"$PORT_X/pdx_proxy_instance_transfers{$(instance P)}=0" \
		"$PORT_X/pdx_proxy_instance_transfers{$(instance D)}=0" ||
		fail "$flow: the proxy's transfer counts"
	named_stop "X_${flow%%-*}"
done
proxy_start X sequential
for x in D D1 P P1; do
	grep -q "differs" "$E2E_TMP/$x.log" && fail "$x found KV that differs"
done

# a follower's agent killed: the instance is unready, as it is without
# rank 0's agent (/health 503 naming the rank, a transfer refused with
# 503, which the proxy retries elsewhere and does not count against the
# instance), and ready again once the agent is back at its address
xid=$("$PY" -c "import secrets; print(secrets.token_hex(16))")
PORT=$PORT_D post /v1/completions "{\"prompt\": [1,2,3], \"max_tokens\": 2,
	\"kv_transfer_params\": {\"do_remote_prefill\": true, \"xfer_id\": \"$xid\",
	\"remote_agents\": [\"tcp://127.0.0.1:1\", \"tcp://127.0.0.1:2\", \"tcp://127.0.0.1:2\"],
	\"remote_tp_size\": 3}}" >/dev/null
status_is 400 "remote_tp_size 3"
grep -q "power of two" "$E2E_TMP/body" || fail "why not 3: $(cat "$E2E_TMP/body")"
listen_d1=$(sed -n 's/.*peer link \(tcp:[^ ]*\) .*/\1/p' "$E2E_TMP/agent_d1.log" | tail -1)
[ -n "$listen_d1" ] || fail "agent d1's address: $(tail -3 "$E2E_TMP/agent_d1.log")"
kill9 agent_d1
health_becomes 503 "with rank 1's agent gone"
grep -q "tensor-parallel rank 1: the link to the agent" "$E2E_TMP/body" ||
	fail "health names the rank and its agent: $(cat "$E2E_TMP/body")"
PORT=$PORT_D post /v1/completions "{\"prompt\": [$toks], \"max_tokens\": 5,
	\"kv_transfer_params\": $kv1}" >/dev/null
status_is 503 "a transfer while rank 1's agent is gone"
agent_start d1 --listen "$listen_d1"
health_becomes 200 "once rank 1's agent is back"
pd "$toks" 3 "after rank 1's agent came back"

# the whole decode instance frozen (its ranks and agents stopped, as a
# frozen container's) for longer than the ranks' liveness (1 s): on
# waking no rank takes another's silence, which was its own, for death
kill -STOP "$PID_D" "$PID_D1" "$PID_agent_d0" "$PID_agent_d1"
sleep 2.5
kill -CONT "$PID_D" "$PID_D1" "$PID_agent_d0" "$PID_agent_d1"
sleep 1.5
pd "$toks" 4 "after the decode instance was frozen for 2.5 s"
grep -q "did not run for" "$E2E_TMP/D.log" || fail "the leader did not notice its stall: $(tail -3 "$E2E_TMP/D.log")"

# a follower killed while a decode request waits for its KV: it ends now
# with the reason, not at --kv-timeout-ms
xid=$("$PY" -c "import secrets; print(secrets.token_hex(16))")
ag=$("$PY" -c "import json; print(json.dumps(json.loads('$kv1')['remote_agents']))")
t0=$(date +%s.%N)
curl -sS -o "$E2E_TMP/w.json" -w '%{http_code}' -H 'Content-Type: application/json' \
	--data-binary "{\"prompt\": [1,2,3], \"max_tokens\": 3, \"kv_transfer_params\":
	{\"do_remote_prefill\": true, \"xfer_id\": \"$xid\", \"remote_agents\": $ag}}" \
	"http://127.0.0.1:$PORT_D/v1/completions" >"$E2E_TMP/w.status" &
cpid=$!
settle 10 "$PORT_D/$(e num_requests_running)=1" || fail "the waiting request did not start"
kill9 D1
wait $cpid
t1=$(date +%s.%N)
[ "$(cat "$E2E_TMP/w.status")" = 500 ] || fail "waiting request: HTTP $(cat "$E2E_TMP/w.status"): $(cat "$E2E_TMP/w.json")"
grep -q "tensor-parallel rank 1" "$E2E_TMP/w.json" || fail "no reason: $(cat "$E2E_TMP/w.json")"
py "assert $t1 - $t0 < 10, $t1 - $t0" "the request failed fast (not at the 30 s timeout)"
PORT=$PORT_D get /health >/dev/null
status_is 503 "health after a rank died"
grep -q "tensor-parallel rank 1 is gone" "$E2E_TMP/body" || fail "health: $(cat "$E2E_TMP/body")"
PORT=$PORT_D post /v1/completions "{\"prompt\": [$toks], \"max_tokens\": 5,
	\"kv_transfer_params\": $kv1}" >/dev/null
status_is 503 "a transfer to an instance that lost a rank"
PORT=$PORT_D post /v1/completions '{"prompt": "Hi", "max_tokens": 2}' >/dev/null
status_is 503 "a plain request to an instance that lost a rank"
xid=$("$PY" -c "import secrets; print(secrets.token_hex(16))")
PORT=$PORT_D post /v1/completions "{\"prompt\": [1,2,3], \"max_tokens\": 2,
	\"kv_transfer_params\": {\"do_remote_prefill\": true, \"xfer_id\": \"$xid\",
	\"remote_agents\": $ag, \"on_failure\": \"recompute\"}}" >/dev/null
status_is 503 "a decode request that may recompute, to an instance that lost a rank"
PORT=$PORT_X post /v1/completions '{"prompt": "Hi", "max_tokens": 2}' >/dev/null
[ "$(cat "$E2E_TMP/status")" != 200 ] || fail "the proxy served through an instance that lost a rank"

for x in X C P P1 D; do named_stop $x; done
echo ok
