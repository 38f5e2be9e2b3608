#!/usr/bin/env bash
# pdx-bench against pdx-engine: 20 random prompts at once all complete,
# the result JSON has a positive mean TTFT, and every KV block is free
# afterwards; a --request-timeout that is no bound is refused (exit 2),
# and so is --backend openai-chat with the completions endpoint; requests
# that fail (a refusing server under a low descriptor limit, a closed
# port) fail one by one, without a crash.
#   bench.sh BUILD/engine/pdx-engine BUILD/bench/pdx-bench
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1 BENCH=$2

# a small modeled time, so that requests overlap in batches
engine_start "$ENGINE" --time-scale 20
"$BENCH" --host 127.0.0.1 --port "$PORT" --model tiny --dataset-name random \
	--random-input-len 64 --random-output-len 16 --num-prompts 20 \
	--request-rate inf --save-result --result-dir "$E2E_TMP/res" \
	>"$E2E_TMP/bench.out" 2>&1 || { cat "$E2E_TMP/bench.out"; fail "pdx-bench"; }
f=$(ls "$E2E_TMP"/res/*.json) || fail "no result file"
py "import json; r=json.load(open('$f')); assert r['completed'] == 20 and r['mean_ttft_ms'] > 0 and r['total_output_tokens'] == 320, {k: r.get(k) for k in ('completed', 'mean_ttft_ms', 'total_output_tokens')}" "result JSON"
get /metrics >"$E2E_TMP/metrics"
"$PY" "$HERE/promcheck.py" "$E2E_TMP/metrics" \
	'pdx_engine_kv_blocks_used{model_name="tiny"}=0' \
	'pdx_engine_requests_finished_total{model_name="tiny"}=20' \
	'pdx_engine_prompt_tokens_total{model_name="tiny"}=1280' ||
	fail "/metrics after the run"
# a request timeout that is no bound is refused before anything is sent:
# inf failed every request at once, 0 and below ran without one
for t in inf 0 -5 1e8; do
	"$BENCH" --host 127.0.0.1 --port "$PORT" --model tiny --num-prompts 2 \
		--random-input-len 8 --random-output-len 2 --request-timeout "$t" \
		>"$E2E_TMP/to.out" 2>&1
	rc=$?
	[ $rc -eq 2 ] && grep -q -- '--request-timeout' "$E2E_TMP/to.out" ||
		{ cat "$E2E_TMP/to.out"; fail "--request-timeout $t: exit $rc, want 2 and why"; }
done
# chat requests to the completions endpoint (the default) failed every
# request: refused before anything is sent, as vLLM's bench does
"$BENCH" --host 127.0.0.1 --port "$PORT" --model tiny --num-prompts 2 \
	--backend openai-chat >"$E2E_TMP/chat.out" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q 'chat/completions' "$E2E_TMP/chat.out" ||
	{ cat "$E2E_TMP/chat.out"; fail "--backend openai-chat to /v1/completions: exit $rc, want 2 and why"; }
# requests the server refuses at once (prompts over --max-model-len)
# under a low descriptor limit: each failed request's connection is
# closed, so every request gets the server's answer (each was kept open
# to the end of the run, the bench ran out of descriptors after ~40 and
# crashed)
(
	ulimit -n 48
	exec "$BENCH" --host 127.0.0.1 --port "$PORT" --model tiny \
		--num-prompts 200 --max-concurrency 8 --random-input-len 9000 \
		--random-output-len 2 --save-detailed --result-dir "$E2E_TMP/ref" \
		--result-filename ref.json
) >"$E2E_TMP/ref.out" 2>&1
rc=$?
[ $rc -eq 1 ] || { tail -5 "$E2E_TMP/ref.out"; fail "refused requests under ulimit -n 48: exit $rc, want 1"; }
py "import json; e=json.load(open('$E2E_TMP/ref/ref.json'))['errors']; bad=[x for x in e if not x.startswith('HTTP 400')]; assert len(e) == 200 and not bad, (len(e), bad[:3])" \
	"every refused request has the engine's 400"
# a port where nobody listens: every request fails inside its send, and
# the next one was started one call deeper (20000: the stack overflowed)
"$BENCH" --host 127.0.0.1 --port "$(free_port)" --model tiny \
	--num-prompts 20000 --random-input-len 4 --random-output-len 2 \
	>"$E2E_TMP/closed.out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q 'Failed requests: *20000' "$E2E_TMP/closed.out" ||
	{ tail -5 "$E2E_TMP/closed.out"; fail "20000 requests to a closed port: exit $rc, want 1 and 20000 failed"; }
engine_stop
echo ok
