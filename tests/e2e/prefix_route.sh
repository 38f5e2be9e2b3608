#!/usr/bin/env bash
# pdx-proxy's prefix-aware routing meets the decode engines' prefix
# caches: one prefill and two decode pdx-engines, each with its
# pdx-agent, behind a proxy with --policy-d prefix-aware. Requests that
# share their first --prefix-len bytes land on one decode engine, so
# every request of a group after its first finds the group's shared
# blocks cached there: the two engines' prefix hits add up to exactly
# that, and each answer equals a colocated engine's.
# pdx-bench's long-document set through the same proxy, given the decode
# engines (--engine-metrics), reports the tokens its repeats found cached
# and the KV bytes that saved, in its summary and its result JSON.
#   prefix_route.sh PDX_ENGINE PDX_AGENT PDX_PROXY PDX_BENCH
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3
BENCH=$4

GROUPS_N=4 PER_GROUP=3 SHARED=32 # tokens: 8 tiny blocks
pd_engine_start P prefill --time-scale 0
pd_engine_start D1 decode --time-scale 0
pd_engine_start D2 decode --time-scale 0
named_engine_start C "$ENGINE" --time-scale 0 --no-prefix-cache
# the key: the first 16 token ids (4 bytes each), inside the shared part
named_engine_start X "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D1" --decode "127.0.0.1:$PORT_D2" \
	--policy-d prefix-aware --prefix-len 64

for g in $(seq "$GROUPS_N"); do
	for r in $(seq "$PER_GROUP"); do
		# a group's shared tokens, then a tail of the request's own
		p="$(seq -s, $((g * 100)) $((g * 100 + SHARED - 1))),$(seq -s, $((r * 10 + 1)) $((r * 10 + 6)))"
		req="{\"prompt\": [$p], \"max_tokens\": 4}"
		PORT=$PORT_C post /v1/completions "$req" >"$E2E_TMP/c.json"
		status_is 200 "colocated: group $g request $r"
		PORT=$PORT_X post /v1/completions "$req" >"$E2E_TMP/x.json"
		status_is 200 "through the proxy: group $g request $r"
		py "import json; a=json.load(open('$E2E_TMP/c.json')); b=json.load(open('$E2E_TMP/x.json')); assert a['choices'][0]['text'] == b['choices'][0]['text'], (a, b)" \
			"group $g request $r: disaggregated equals colocated"
	done
done

want=$((GROUPS_N * (PER_GROUP - 1) * SHARED))
hits() { val "$(eval echo "\$PORT_$1")" "$(e prefix_hit_tokens_total)"; }
for _ in $(seq 50); do
	[ $(($(hits D1) + $(hits D2))) -eq "$want" ] && break
	sleep 0.1
done
got=$(($(hits D1) + $(hits D2)))
[ "$got" -eq "$want" ] ||
	fail "prefix hits on the decode engines: $got tokens (D1 $(hits D1), D2 $(hits D2)), want $want: each group's requests after its first on the group's engine"
echo "ok   each group's later requests hit its decode engine's cache ($(hits D1) + $(hits D2) tokens)"

# 3 documents of 64 tokens (16 blocks), each asked twice in a row
"$BENCH" --host 127.0.0.1 --port "$PORT_X" --model tiny \
	--dataset-name long-doc-qa --long-doc-num-documents 3 \
	--long-doc-len 64 --long-doc-repeat-count 2 \
	--long-doc-repeat-mode interleave --prompt-format ids --vocab-size 1024 --output-len 4 \
	--max-concurrency 1 --engine-metrics "127.0.0.1:$PORT_D1" \
	--engine-metrics "127.0.0.1:$PORT_D2" --save-result \
	--result-dir "$E2E_TMP" --result-filename bench.json \
	>"$E2E_TMP/bench.out" 2>&1 || { cat "$E2E_TMP/bench.out"; fail "pdx-bench"; }
grep -q "KV bytes saved by prefix hits: *$((3 * 64 * 512)) *$" "$E2E_TMP/bench.out" ||
	fail "pdx-bench's summary: $(grep -i prefix "$E2E_TMP/bench.out")"
py "import json; r = json.load(open('$E2E_TMP/bench.json')); assert r['completed'] == 6 and r['pdx_prefix_hit_tokens'] == 3 * 64 and r['pdx_prefix_saved_bytes'] == 3 * 64 * 512, r" \
	"pdx-bench's JSON: each document's second request found its 64 tokens cached (512 bytes a tiny token)"
echo "ok   pdx-bench reports the prefix hits and the bytes they saved"

blocks_free "$PORT_P" "$PORT_D1" "$PORT_D2"
for x in X C D2 D1 P; do named_stop $x; done
echo ok
