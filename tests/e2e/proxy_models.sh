#!/usr/bin/env bash
# pdx-proxy in front of instances of two models, A (tiny) and B
# (qwen2-7b), least-loaded: it learns what each serves (GET /v1/models
# after a passed health check, shown by /admin/instances), and a request
# naming a model goes only to an instance serving it, and the proxy's
# GET /v1/models names both. Before, B answered
# every request for tiny 404 at once; a 404 is no breaker's business, and
# B, always the least loaded, got half of them or more. A request naming
# no model (or "") goes to either; one naming a model nobody serves is answered
# by an engine (404), as before. While B is down, a request for qwen2-7b
# gets 503 saying so (it got A's 404). B started again serving tiny is
# asked again once its checks pass, and serves tiny. In front of P/D pairs: a
# prefill instance of another model gets no request for tiny, and with
# none of tiny's left, a request for it gets 503 saying so rather than
# that instance's 404.
#   proxy_models.sh PDX_ENGINE PDX_PROXY PDX_AGENT
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
PROXY=$2
AGENT=$3

named_engine_start A "$ENGINE" --model tiny --time-scale 0
named_engine_start B "$ENGINE" --model qwen2-7b --kv-blocks 16 --time-scale 0
named_engine_start X "$PROXY" --decode "127.0.0.1:$PORT_A" \
	--decode "127.0.0.1:$PORT_B" --policy-d least-loaded \
	--health-interval 100 --admin-token t

# admin JSON -> "url=models url=models" (models comma-joined, or null)
models() {
	curl -sS -H 'Authorization: Bearer t' "http://127.0.0.1:$PORT_X/admin/instances" |
		$PY -c "import json, sys
print(' '.join('%s=%s' % (i['url'][7:], ','.join(i['models']) if i['models'] else None)
               for i in json.load(sys.stdin)['instances']))"
}
requests_of() {
	curl -sS -H 'Authorization: Bearer t' "http://127.0.0.1:$PORT_X/admin/instances" |
		$PY -c "import json, sys
print([i['requests'] for i in json.load(sys.stdin)['instances'] if i['url'].endswith(':$1')][0])"
}
healthy_of() {
	curl -sS -H 'Authorization: Bearer t' "http://127.0.0.1:$PORT_X/admin/instances" |
		$PY -c "import json, sys
print([i['healthy'] for i in json.load(sys.stdin)['instances'] if i['url'].endswith(':$1')][0])"
}
# models_become WANT TRIES WHAT: until models says WANT (0.1 s apart)
models_become() {
	for _ in $(seq "$2"); do
		[ "$(models)" = "$1" ] && return 0
		sleep 0.1
	done
	fail "$3: $(models), want $1"
}
models_become "127.0.0.1:$PORT_A=tiny 127.0.0.1:$PORT_B=qwen2-7b" 50 \
	"the models learned"
grep -q "decode instance http://127.0.0.1:$PORT_B serves qwen2-7b" "$E2E_TMP/X.log" ||
	fail "not logged: $(grep serves "$E2E_TMP/X.log")"
# GET /v1/models through the proxy: both models, each as its engine
# described it (it relayed one instance's list, which named one model)
PORT=$PORT_X get /v1/models | py "import json, sys
m = json.load(sys.stdin)
assert m['object'] == 'list', m
assert sorted(e['id'] for e in m['data']) == ['qwen2-7b', 'tiny'], m
assert all(e['owned_by'] == 'pdx' and e['max_model_len'] > 0 for e in m['data']), m" \
	"the proxy's /v1/models: $(cat "$E2E_TMP/body")"
status_is 200 "the proxy's /v1/models"

for k in $(seq 12); do
	PORT=$PORT_X post /v1/completions "{\"model\": \"tiny\", \"prompt\": \"hello $k\", \"max_tokens\": 2}" >/dev/null
	status_is 200 "request $k for tiny"
done
[ "$(requests_of "$PORT_B")" = 0 ] || fail "B (qwen2-7b) got $(requests_of "$PORT_B") requests for tiny"
for k in $(seq 3); do
	PORT=$PORT_X post /v1/chat/completions "{\"model\": \"qwen2-7b\", \"messages\": [{\"role\": \"user\", \"content\": \"hi $k\"}], \"max_tokens\": 2}" >/dev/null
	status_is 200 "request $k for qwen2-7b"
	grep -q '"model":"qwen2-7b"' "$E2E_TMP/body" || fail "answered by: $(cat "$E2E_TMP/body")"
done
[ "$(requests_of "$PORT_B")" = 3 ] || fail "B got $(requests_of "$PORT_B") requests for qwen2-7b, want 3"
for k in $(seq 4); do
	PORT=$PORT_X post /v1/completions "{\"prompt\": \"no model $k\", \"max_tokens\": 2}" >/dev/null
	status_is 200 "request $k naming no model"
done
# "model": "" names none, as vLLM reads it (it was a 404 at either
# engine, "The model `` does not exist")
for k in $(seq 2); do
	PORT=$PORT_X post /v1/completions "{\"model\": \"\", \"prompt\": \"empty model $k\", \"max_tokens\": 2}" >/dev/null
	status_is 200 "request $k naming the model \"\""
done
PORT=$PORT_X post /v1/completions '{"model": "nope", "prompt": "x", "max_tokens": 2}' >/dev/null
status_is 404 "a model nobody serves"
grep -q 'The model `nope` does not exist' "$E2E_TMP/body" || fail "404 body: $(cat "$E2E_TMP/body")"

# B again, serving tiny now, at its address: its checks fail while it is
# down, then pass, and its models are asked again
portb=$PORT_B
named_stop B
models_become "127.0.0.1:$PORT_A=tiny 127.0.0.1:$portb=None" 50 \
	"B's models forgotten once its checks failed"
# qwen2-7b's one instance down (unhealthy): 503 saying so (A answered
# 404, "does not exist")
for _ in $(seq 50); do
	[ "$(healthy_of "$portb")" = False ] && break
	sleep 0.1
done
[ "$(healthy_of "$portb")" = False ] || fail "B stopped, still healthy"
PORT=$PORT_X post /v1/completions '{"model": "qwen2-7b", "prompt": "x", "max_tokens": 2}' >/dev/null
status_is 503 "qwen2-7b with its one instance down"
grep -q "no usable decode instance serves model qwen2-7b" "$E2E_TMP/body" ||
	fail "503 body: $(cat "$E2E_TMP/body")"
bg_start B2 "$ENGINE" --model tiny --time-scale 0 --port "$portb"
models_become "127.0.0.1:$PORT_A=tiny 127.0.0.1:$portb=tiny" 100 \
	"after B served tiny"
before=$(requests_of "$portb")
for k in $(seq 8); do
	PORT=$PORT_X post /v1/completions "{\"model\": \"tiny\", \"prompt\": \"again $k\", \"max_tokens\": 2}" >/dev/null
	status_is 200 "request $k for tiny, B serving it"
done
[ "$(requests_of "$portb")" -gt "$before" ] || fail "B, serving tiny now, got none of them"
PORT=$PORT_X post /v1/completions '{"model": "qwen2-7b", "prompt": "x", "max_tokens": 2}' >/dev/null
status_is 404 "qwen2-7b once nobody serves it"

# B started again at once, serving qwen2-7b, with no check of the proxy's
# between (it is stopped meanwhile): its next check sees another
# X-PDX-Engine-Id, and its models are asked again (before: only a failed
# check did that, and the proxy kept B as tiny's for good, listing a
# model nobody served and sending tiny's requests to B's 404)
kill -STOP "$PID_X"
named_stop B2
bg_start B3 "$ENGINE" --model qwen2-7b --kv-blocks 16 --time-scale 0 \
	--port "$portb"
PORT_B3=$portb
wait_healthy B3
kill -CONT "$PID_X"
models_become "127.0.0.1:$PORT_A=tiny 127.0.0.1:$portb=qwen2-7b" 50 \
	"after B was started again serving qwen2-7b"
logged X "decode instance http://127.0.0.1:$portb: its engine started again" ||
	fail "the proxy did not say B started again"
for k in $(seq 4); do
	PORT=$PORT_X post /v1/completions "{\"model\": \"tiny\", \"prompt\": \"after $k\", \"max_tokens\": 2}" >/dev/null
	status_is 200 "request $k for tiny after B serves qwen2-7b again"
done
named_stop B3
named_stop X

# P/D: P (tiny) and Q (qwen2-7b) prefill, D (tiny) decodes
pd_engine_start P prefill --model tiny --time-scale 0
pd_engine_start Q prefill --model qwen2-7b --kv-blocks 16 --time-scale 0
pd_engine_start D decode --model tiny --time-scale 0
named_engine_start Y "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--prefill "127.0.0.1:$PORT_Q" --decode "127.0.0.1:$PORT_D" \
	--policy-p least-loaded --health-interval 100 --admin-token t
PORT_X=$PORT_Y
models_become "127.0.0.1:$PORT_P=tiny 127.0.0.1:$PORT_Q=qwen2-7b 127.0.0.1:$PORT_D=tiny" 50 \
	"the P/D instances' models"
for k in $(seq 6); do
	PORT=$PORT_Y post /v1/completions "{\"model\": \"tiny\", \"prompt\": \"pd $k\", \"max_tokens\": 3}" >/dev/null
	status_is 200 "P/D request $k for tiny"
done
[ "$(requests_of "$PORT_Q")" = 0 ] || fail "Q (qwen2-7b) got $(requests_of "$PORT_Q") prefills for tiny"
curl -sS -H 'Authorization: Bearer t' -X DELETE \
	"http://127.0.0.1:$PORT_Y/admin/instances?url=127.0.0.1:$PORT_P" >/dev/null
PORT=$PORT_Y post /v1/completions '{"model": "tiny", "prompt": "none left", "max_tokens": 3}' >/dev/null
status_is 503 "tiny with only a prefill instance of another model"
grep -q "no usable prefill instance serves model tiny" "$E2E_TMP/body" ||
	fail "503 body: $(cat "$E2E_TMP/body")"
[ "$(requests_of "$PORT_Q")" = 0 ] || fail "Q got the request for tiny"
named_stop Y
echo ok
