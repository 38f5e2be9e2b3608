#!/usr/bin/env bash
# Tensor parallelism across sizes, through pdx-engine: a prefill instance
# of TP 1 (Q) feeds a decode instance of TP 2 (D), and one of TP 2 (P) a
# decode instance of TP 1 (E); each pdx-agent per rank. The agents
# reshard the KV heads (docs/protocol.md, "TP legs"): each decode rank
# receives exactly its heads from the prefill ranks that hold them. Driven
# directly (vLLM's sequential shape: the prefill answer goes into the
# decode request) and through pdx-proxy (concurrent and sequential
# flows). Checked: the text equals a TP 1 colocated engine's; every
# decode rank's pool holds exactly its heads of the whole model's KV
# (tp_kv_check.py, from docs/engine.md's formula); no rank logs KV that
# differs; every block comes back free.
#   tp_mixed.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3

small=(--model tiny --kv-blocks 64 --max-model-len 256 --time-scale 0
	--kv-timeout-ms 30000 --no-prefix-cache)
tp_engine_start Q prefill 1 "${small[@]}"
tp_engine_start D decode 2 "${small[@]}"
tp_engine_start P prefill 2 "${small[@]}"
tp_engine_start E decode 1 "${small[@]}"
named_engine_start C "$ENGINE" "${small[@]}"

toks=$(seq -s, 7 36) # 30 tokens: 8 blocks of 4, the last one partial

# direct PREFILL DECODE WHAT: the prefill answer into the decode request;
# the text must be the colocated engine's
direct() {
	PORT=$(eval echo "\$PORT_$1") post /v1/completions "{\"prompt\": [$toks],
		\"max_tokens\": 1, \"kv_transfer_params\": {\"do_remote_decode\": true}}" \
		>"$E2E_TMP/p.json"
	status_is 200 "$3: prefill"
	kv=$($PY -c "import json; print(json.dumps(json.load(open('$E2E_TMP/p.json'))['kv_transfer_params']))")
	PORT=$(eval echo "\$PORT_$2") post /v1/completions "{\"prompt\": [$toks],
		\"max_tokens\": 5, \"kv_transfer_params\": $kv}" >"$E2E_TMP/d.json"
	status_is 200 "$3: decode"
	py "import json; a=json.load(open('$E2E_TMP/c.json')); b=json.load(open('$E2E_TMP/d.json')); assert a['choices'][0]['text'] == b['choices'][0]['text'], (a, b)" \
		"$3 equals TP 1 colocated"
	echo "ok   $3"
}
PORT=$PORT_C post /v1/completions "{\"prompt\": [$toks], \"max_tokens\": 5}" >"$E2E_TMP/c.json"
status_is 200 "colocated"

direct Q D "TP 1 -> 2"
# each decode rank's first request filled blocks 0..7: exactly its heads
for r in "D:0" "D1:1"; do
	pid=$(eval echo "\$PID_${r%%:*}")
	$PY "$HERE/tp_kv_check.py" "$(engine_pool "$pid")" 4 2 2 16 2 4 64 2 \
		"${r##*:}" "$toks" || fail "TP 1 -> 2: ${r%%:*}'s KV is not its heads' exactly"
done
direct P E "TP 2 -> 1"
$PY "$HERE/tp_kv_check.py" "$(engine_pool "$PID_E")" 4 2 2 16 2 4 64 1 0 \
	"$toks" || fail "TP 2 -> 1: E's KV is not the whole model's"

# through pdx-proxy: it names each side's every rank to the other
n=0
for pair in "Q D concurrent" "P E concurrent" "Q D sequential" "P E sequential"; do
	set -- $pair
	n=$((n + 1)) # a name per proxy: its log holds its own port only
	named_engine_start "X$n" "$PROXY" --prefill "127.0.0.1:$(eval echo "\$PORT_$1")" \
		--decode "127.0.0.1:$(eval echo "\$PORT_$2")" --flow "$3"
	req="{\"prompt\": \"The quick brown fox jumps over the lazy dog\", \"max_tokens\": 6}"
	PORT=$PORT_C post /v1/completions "$req" >"$E2E_TMP/c2.json"
	PORT=$(eval echo "\$PORT_X$n") post /v1/completions "$req" >"$E2E_TMP/x2.json"
	status_is 200 "$1 -> $2 through pdx-proxy ($3)"
	py "import json; a=json.load(open('$E2E_TMP/c2.json')); b=json.load(open('$E2E_TMP/x2.json')); assert a['choices'][0]['text'] == b['choices'][0]['text'], (a, b)" \
		"$1 -> $2 through pdx-proxy ($3) equals colocated"
	echo "ok   $1 -> $2 through pdx-proxy ($3)"
	named_stop "X$n"
done

blocks_free "$PORT_Q" "$PORT_D" "$PORT_P" "$PORT_E"
for x in D D1 E P P1 Q; do
	grep -q "differs" "$E2E_TMP/$x.log" && fail "$x found KV that differs"
done
for x in C P Q D E; do named_stop $x; done
echo ok
