#!/usr/bin/env bash
# Clients that leave before the end: mid-stream, during a non-streamed
# generation, and while queued behind a full engine. Afterwards every KV
# block is free, each left request counts as aborted, and the engine
# still answers.
#   disconnect.sh BUILD/engine/pdx-engine
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1

# tiny at scale 10000: ~10 ms per decode step, 1000 tokens take ~10 s
engine_start "$ENGINE" --time-scale 10000 --max-num-seqs 2
long='{"prompt": "tell me a long story", "max_tokens": 1000'

# two long requests fill both running slots; a third waits in the queue
curl -sS -N --max-time 1 -d "$long, \"stream\": true}" \
	"http://127.0.0.1:$PORT/v1/completions" >"$E2E_TMP/s1" 2>/dev/null &
c1=$!
curl -sS --max-time 1 -d "$long}" \
	"http://127.0.0.1:$PORT/v1/completions" >/dev/null 2>&1 &
c2=$!
sleep 0.3
curl -sS --max-time 0.7 -d "$long, \"stream\": true}" \
	"http://127.0.0.1:$PORT/v1/completions" >/dev/null 2>&1 &
c3=$!
sleep 0.2
get /metrics >"$E2E_TMP/busy"
"$PY" "$HERE/promcheck.py" "$E2E_TMP/busy" \
	'pdx_engine_num_requests_running{model_name="tiny"}=2' \
	'pdx_engine_num_requests_waiting{model_name="tiny"}=1' ||
	fail "/metrics while busy"
wait $c1 $c2 $c3
grep -q '^data: {' "$E2E_TMP/s1" || fail "the stream sent no token before the client left"
sleep 0.3
get /metrics >"$E2E_TMP/after"
"$PY" "$HERE/promcheck.py" "$E2E_TMP/after" \
	'pdx_engine_num_requests_running{model_name="tiny"}=0' \
	'pdx_engine_num_requests_waiting{model_name="tiny"}=0' \
	'pdx_engine_kv_blocks_used{model_name="tiny"}=0' \
	'pdx_engine_kv_blocks_free{model_name="tiny"}=4096' \
	'pdx_engine_requests_aborted_total{model_name="tiny"}=3' \
	'pdx_engine_requests_finished_total{model_name="tiny"}=0' ||
	fail "KV blocks still held after the clients left"
post /v1/completions '{"prompt": "still there?", "max_tokens": 3}' >/dev/null
status_is 200 "a request after the aborts"
engine_stop
echo ok
