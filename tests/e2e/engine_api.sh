#!/usr/bin/env bash
# pdx-engine's OpenAI API as a client sees it: completions and chat,
# streamed and not (the stream joins to the same text, usage counts
# right), identical outputs across requests and restarts, text that
# encodes back to its tokens, the GET routes, valid /metrics, and errors;
# a warning at start under a descriptor limit short of its clients; a
# SIGTERM while it waits for its agent ends it at once.
#   engine_api.sh BUILD/engine/pdx-engine
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1

PROMPTS=('"Hello, world!"' '"The quick brown fox jumps over the lazy dog."'
	'[1, 2, 3, 4, 5, 6, 7, 8, 9]' '"x"')

# Runs every prompt non-streamed and streamed; prints one text per line.
run_all() {
	local i=0 p
	for p in "${PROMPTS[@]}"; do
		post /v1/completions "{\"model\": \"tiny\", \"prompt\": $p, \"max_tokens\": 12, \"temperature\": 0.7, \"top_p\": 0.9}" \
			>"$E2E_TMP/whole$i.json"
		status_is 200 "completion $i"
		curl -sS -N -H 'Content-Type: application/json' \
			-d "{\"prompt\": $p, \"max_tokens\": 12, \"stream\": true, \"stream_options\": {\"include_usage\": true}}" \
			"http://127.0.0.1:$PORT/v1/completions" >"$E2E_TMP/stream$i.sse" ||
			fail "stream $i"
		"$PY" "$HERE/sse_check.py" "$E2E_TMP/whole$i.json" \
			"$E2E_TMP/stream$i.sse" text 12 || fail "stream $i vs whole"
		i=$((i + 1))
	done
	post /v1/chat/completions '{"model": "tiny", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi there"}]}], "max_completion_tokens": 7}' \
		>"$E2E_TMP/chat.json"
	status_is 200 "chat"
	curl -sS -N -d '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}], "max_tokens": 7, "stream": true, "stream_options": {"include_usage": true}}' \
		"http://127.0.0.1:$PORT/v1/chat/completions" >"$E2E_TMP/chat.sse" ||
		fail "chat stream"
	"$PY" "$HERE/sse_check.py" "$E2E_TMP/chat.json" "$E2E_TMP/chat.sse" \
		chat 7 || fail "chat stream vs whole"
}

engine_start "$ENGINE" --time-scale 0

get /health >/dev/null
status_is 200 /health
get /v1/models | py 'import json,sys; m=json.load(sys.stdin); assert m["object"] == "list" and [d["id"] for d in m["data"]] == ["tiny"], m' /v1/models

run_all >"$E2E_TMP/texts1"
run_all >"$E2E_TMP/texts2"
cmp -s "$E2E_TMP/texts1" "$E2E_TMP/texts2" || fail "outputs differ between runs"
# the chat template: <|system|> Be brief . <|user|> Hi there <|assistant|>
py "import json; u=json.load(open('$E2E_TMP/chat.json'))['usage']; assert u['prompt_tokens'] == 20, u" "chat prompt tokens"
py "import json; u=json.load(open('$E2E_TMP/whole0.json'))['usage']; assert u['prompt_tokens'] == 4, u" "text prompt tokens"
py "import json; u=json.load(open('$E2E_TMP/whole2.json'))['usage']; assert u['prompt_tokens'] == 9, u" "id prompt tokens"

# generated text encodes back to as many tokens as were generated
text=$(head -1 "$E2E_TMP/texts1")
post /v1/completions "{\"prompt\": \"$text\", \"max_tokens\": 1}" |
	py 'import json,sys; u=json.load(sys.stdin)["usage"]; assert u["prompt_tokens"] == 12, u' "text round trip"

# the client's request id is kept
curl -sS -D "$E2E_TMP/headers" -o "$E2E_TMP/body" -H 'X-Request-Id: my-req-42' \
	-d '{"prompt": "hi", "max_tokens": 2}' "http://127.0.0.1:$PORT/v1/completions" ||
	fail "request id"
grep -qi '^x-request-id: my-req-42' "$E2E_TMP/headers" || fail "X-Request-Id not echoed"
py "import json; assert json.load(open('$E2E_TMP/body'))['id'] == 'cmpl-my-req-42'" "id from X-Request-Id"

# errors: status and an OpenAI error object
error_is() {
	local status=$1 path=$2 body=$3
	post "$path" "$body" | py 'import json,sys; e=json.load(sys.stdin)["error"]; assert isinstance(e["message"], str) and e["message"] and e["type"], e' "error body for $body"
	status_is "$status" "$body"
}
error_is 400 /v1/completions '{"prompt": "a", "max_tokens":'
error_is 400 /v1/completions '[1, 2]'
error_is 400 /v1/completions '{"max_tokens": 3}'
error_is 400 /v1/completions '{"prompt": "a", "n": 2}'
error_is 400 /v1/completions '{"prompt": "a", "max_tokens": 0}'
error_is 400 /v1/completions '{"prompt": "a", "stream": "yes"}'
error_is 400 /v1/completions '{"prompt": [1, 1024]}'
error_is 400 /v1/completions '{"prompt": ["a", "b"]}'
error_is 400 /v1/completions '{"prompt": ""}'
error_is 400 /v1/completions '{"prompt": "a b c", "max_tokens": 8190}'
error_is 404 /v1/completions '{"model": "llama3-8b", "prompt": "a"}'
error_is 400 /v1/chat/completions '{"messages": []}'
error_is 400 /v1/chat/completions '{"messages": [{"content": "no role"}]}'
error_is 404 /v1/nothing '{}'
get /v1/completions >/dev/null
status_is 405 "GET on a POST route"
# a body over 8 MiB and the room for a proxy's fields (client_errors.sh
# checks the JSON)
head -c $((9 << 20)) /dev/zero | tr '\0' 'a' >"$E2E_TMP/big"
code=$(curl -sS -o /dev/null -w '%{http_code}' --data-binary @"$E2E_TMP/big" \
	"http://127.0.0.1:$PORT/v1/completions")
[ "$code" = 413 ] || fail "9 MiB body: HTTP $code, want 413"

get /metrics >"$E2E_TMP/metrics"
status_is 200 /metrics
"$PY" "$HERE/promcheck.py" "$E2E_TMP/metrics" \
	'pdx_engine_num_requests_running{model_name="tiny"}=0' \
	'pdx_engine_num_requests_waiting{model_name="tiny"}=0' \
	'pdx_engine_kv_blocks_capacity{model_name="tiny"}=4096' \
	'pdx_engine_kv_blocks_free{model_name="tiny"}=4096' \
	'pdx_engine_kv_blocks_used{model_name="tiny"}=0' \
	'pdx_engine_requests_finished_total{model_name="tiny"}=22' \
	'pdx_engine_generation_tokens_total{model_name="tiny"}=223' \
	'pdx_engine_time_to_first_token_seconds_count{model_name="tiny"}=22' ||
	fail "/metrics"
engine_stop

# a fresh engine gives the same outputs
engine_start "$ENGINE" --time-scale 0
run_all >"$E2E_TMP/texts3"
cmp -s "$E2E_TMP/texts1" "$E2E_TMP/texts3" || fail "outputs differ after a restart"
engine_stop

# under a descriptor limit too low for the clients it takes, it says so
# at start (it went out of rotation under load, saying nothing)
# (and a pool smaller than --max-model-len, said too)
(ulimit -n 200 && exec "$ENGINE" --time-scale 0 --port 0 --max-waiting 100 \
	--kv-blocks 100) \
	>"$E2E_TMP/nofile.log" 2>&1 &
pid=$!
for _ in $(seq 50); do grep -q "listening on" "$E2E_TMP/nofile.log" && break; sleep 0.1; done
kill "$pid"
wait "$pid" || fail "the engine under ulimit -n 200: exit $?: $(tail -3 "$E2E_TMP/nofile.log")"
grep -q "file descriptors (ulimit -n): 200, short of the 420 that --max-num-seqs 256 and --max-waiting 100 clients take" \
	"$E2E_TMP/nofile.log" || fail "no warning under ulimit -n 200: $(head -3 "$E2E_TMP/nofile.log")"
grep -q -- "--kv-blocks 100 holds 400 tokens, fewer than --max-model-len 8192" \
	"$E2E_TMP/nofile.log" || fail "no warning of a pool under --max-model-len: $(head -3 "$E2E_TMP/nofile.log")"

# SIGTERM while it waits for an agent nobody runs (a wrong --agent) ends
# it at once, its KV pool unlinked (before: it waited the 10 s out)
"$ENGINE" --role decode --agent "ipc://$E2E_TMP/nobody.sock" --port 0 \
	>"$E2E_TMP/noagent.log" 2>&1 &
pid=$!
for _ in $(seq 100); do # its pool is made before the agent's wait
	ls /dev/shm | grep -q "^pdx-engine-$pid-" && break
	sleep 0.05
done
sleep 0.2 # into the wait
ls /dev/shm | grep -q "^pdx-engine-$pid-" ||
	fail "no KV pool of the waiting engine in /dev/shm: $(tail -3 "$E2E_TMP/noagent.log")"
t0=$(date +%s%N)
kill "$pid"
wait "$pid"
rc=$? ms=$((($(date +%s%N) - t0) / 1000000))
[ "$rc" = 143 ] && [ "$ms" -lt 2000 ] ||
	fail "SIGTERM while waiting for the agent: exit $rc after $ms ms: $(tail -3 "$E2E_TMP/noagent.log")"
! ls /dev/shm | grep -q "^pdx-engine-$pid-" || fail "its KV pool is left in /dev/shm"
grep -q "a signal while starting: exiting" "$E2E_TMP/noagent.log" ||
	fail "it did not say why it exited: $(tail -3 "$E2E_TMP/noagent.log")"
echo "ok"
