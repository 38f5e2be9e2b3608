#!/usr/bin/env bash
# MLA end to end: a prefill and a decode pdx-engine of deepseek-v3 (one
# latent KV tensor a layer, 64-token blocks), each with its pdx-agent,
# behind pdx-proxy. The text must equal a colocated deepseek-v3 engine's
# for prompts of one block, several, and a block and a bit; the decode
# engine checks the latent KV it receives as it checks K and V (a KV that
# differs fails the request), every block comes back free, and the bytes
# moved are those of the prompts' blocks: 61 layers x 1 tensor x 72 KiB.
#   mla_pd.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3

E2E_MODEL=deepseek-v3 # blocks_free's metrics
notify="tcp://127.0.0.1:$(free_port)"
AGENT_OPTS+=(--notify "$notify")
small=(--model deepseek-v3 --kv-blocks 8 --max-model-len 512 --time-scale 0)
pd_engine_start P prefill "${small[@]}"
pd_engine_start D decode "${small[@]}"
named_engine_start C "$ENGINE" "${small[@]}"
named_engine_start X "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D" --flow concurrent --notify-bind "$notify"

grep -q "engine registered: 61 layers x 1 tensors" "$E2E_TMP/agent_p.log" ||
	fail "the prefill agent did not register one tensor a layer: $(grep registered "$E2E_TMP/agent_p.log")"
PORT=$PORT_D get /v1/models >"$E2E_TMP/models"
py "import json; assert json.load(open('$E2E_TMP/models'))['data'][0]['id'] == 'deepseek-v3'" \
	"the decode engine serves deepseek-v3"

blocks=0 n=0
for p in '"Hello, world!"' "[$(seq -s, 1 64)]" "[$(seq -s, 100 229)]" \
	'"The quick brown fox jumps over the lazy dog again and again"'; do
	n=$((n + 1))
	req="{\"prompt\": $p, \"max_tokens\": $((n * 3))}"
	PORT=$PORT_C post /v1/completions "$req" >"$E2E_TMP/c$n.json"
	status_is 200 "colocated: $req"
	PORT=$PORT_X post /v1/completions "$req" >"$E2E_TMP/x$n.json"
	status_is 200 "disaggregated: $req"
	py "import json; a=json.load(open('$E2E_TMP/c$n.json')); b=json.load(open('$E2E_TMP/x$n.json')); assert a['choices'][0]['text'] == b['choices'][0]['text'] and a['usage'] == b['usage'], (a, b)" \
		"disaggregated equals colocated: $req"
	t=$("$PY" -c "import json; print(json.load(open('$E2E_TMP/x$n.json'))['usage']['prompt_tokens'])")
	blocks=$((blocks + (t + 63) / 64))
done
[ "$blocks" -ge 6 ] || fail "the prompts span only $blocks blocks"

# every transfer reported, its bytes the prompts' latent blocks
want=$((blocks * 61 * 64 * 576 * 2))
for _ in $(seq 50); do
	PORT=$PORT_X get /metrics >"$E2E_TMP/mx"
	grep -q "^pdx_proxy_transfer_sent_bytes_total{path=\"ipc\"} $want\$" \
		"$E2E_TMP/mx" && break
	sleep 0.1
done
grep -q "^pdx_proxy_transfer_sent_bytes_total{path=\"ipc\"} $want\$" "$E2E_TMP/mx" ||
	fail "bytes moved: want $want: $(grep sent_bytes "$E2E_TMP/mx")"
blocks_free "$PORT_P" "$PORT_D"
grep -q "received KV differs" "$E2E_TMP/D.log" && fail "the decode engine found KV that differs"
for x in X C D P; do named_stop $x; done
echo ok
