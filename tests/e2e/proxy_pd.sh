#!/usr/bin/env bash
# pdx-proxy in the sequential flow in front of a real prefill engine and
# decode engine, each with its pdx-agent: the proxy asks D for its agent
# (/v1/pdx/info), sends P max_tokens=1 with kv_transfer_params naming D's
# agent, hands P's answer to D, and relays D's stream. The text must equal
# a colocated engine's, streamed and not, and every KV block is free on
# both engines afterwards. Skips (77) while the engine has no P/D roles.
#   proxy_pd.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3
PIDS=""
trap 'for p in $PIDS; do kill $p 2>/dev/null; done; for p in $PIDS; do wait $p 2>/dev/null; done; cleanup' EXIT

"$ENGINE" --help | grep -q -- '--agent' || { echo "engine has no --agent: skip"; exit 77; }

# start NAME CMD...: as in proxy_sequential.sh.
start() {
	local name=$1 pid port
	shift
	"$@" --port 0 2>"$E2E_TMP/$name.log" >/dev/null &
	pid=$!
	PIDS="$PIDS $pid"
	eval "PID_$name=$pid"
	for _ in $(seq 100); do
		port=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9]*\)$/\1/p' \
			"$E2E_TMP/$name.log")
		[ -n "$port" ] && { eval "PORT_$name=$port"; return 0; }
		kill -0 $pid 2>/dev/null ||
			fail "$name exited at start: $(tail -3 "$E2E_TMP/$name.log")"
		sleep 0.1
	done
	fail "$name did not start listening"
}

stop() {
	local pid rc
	pid=$(eval echo "\$PID_$1")
	kill -TERM $pid
	wait $pid
	rc=$?
	[ $rc -eq 0 ] || fail "$1 exited with $rc: $(tail -5 "$E2E_TMP/$1.log")"
}

export UCX_TLS=sm,self UCX_WARN_UNUSED_ENV_VARS=n
for side in p d; do
	port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	"$AGENT" --engine "ipc://$E2E_TMP/$side.engine" --listen "tcp://127.0.0.1:$port" \
		--xfer-timeout-ms 5000 2>"$E2E_TMP/agent_$side.log" >/dev/null &
	PIDS="$PIDS $!"
done
for side in p d; do
	for _ in $(seq 100); do
		[ -S "$E2E_TMP/$side.engine" ] && break
		sleep 0.1
	done
	[ -S "$E2E_TMP/$side.engine" ] || fail "agent $side did not start"
done
start P "$ENGINE" --role prefill --agent "ipc://$E2E_TMP/p.engine" --time-scale 0
start D "$ENGINE" --role decode --agent "ipc://$E2E_TMP/d.engine" --time-scale 0
start C "$ENGINE" --time-scale 0
start X "$PROXY" --prefill "127.0.0.1:$PORT_P" --decode "127.0.0.1:$PORT_D"

n=0
for p in '"Hello, world!"' '"The quick brown fox jumps over the lazy dog again and again"' \
	'[1, 2, 3, 4, 5, 6, 7, 8, 9]' '"a"'; do
	n=$((n + 1))
	req="{\"prompt\": $p, \"max_tokens\": $((n * 4))"
	PORT=$PORT_C post /v1/completions "$req}" >"$E2E_TMP/c$n.json"
	PORT=$PORT_X
	post /v1/completions "$req}" >"$E2E_TMP/x$n.json"
	status_is 200 "disaggregated completion $n"
	py "import json; a=json.load(open('$E2E_TMP/c$n.json')); b=json.load(open('$E2E_TMP/x$n.json')); assert a['choices'][0]['text'] == b['choices'][0]['text'], (a, b)" \
		"disaggregated text equals colocated text ($n)"
	curl -sS -N -d "$req, \"stream\": true, \"stream_options\": {\"include_usage\": true}}" \
		"http://127.0.0.1:$PORT_X/v1/completions" >"$E2E_TMP/x$n.sse" ||
		fail "disaggregated stream $n"
	python3 "$HERE/sse_check.py" "$E2E_TMP/c$n.json" "$E2E_TMP/x$n.sse" \
		text $((n * 4)) >/dev/null || fail "disaggregated stream vs colocated ($n)"
done
sleep 0.3
for e in P D; do
	PORT=$(eval echo "\$PORT_$e") get /metrics >"$E2E_TMP/m$e"
	python3 "$HERE/promcheck.py" "$E2E_TMP/m$e" \
		'pdx_engine_kv_blocks_used{model_name="tiny"}=0' ||
		fail "engine $e holds KV blocks after the requests"
done
PORT=$PORT_X get /metrics >"$E2E_TMP/mX"
python3 "$HERE/promcheck.py" "$E2E_TMP/mX" 'pdx_proxy_requests_total{code="200"}=8' ||
	fail "proxy metrics"
stop X
echo ok
