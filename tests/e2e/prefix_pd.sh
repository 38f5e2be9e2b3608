#!/usr/bin/env bash
# Prefix hits on the decode side: a prefill and a decode pdx-engine, each
# with its pdx-agent, behind pdx-proxy; a colocated engine without a
# prefix cache gives the reference texts. A prompt that starts with the
# blocks of an earlier one asks the prefill side only for the rest: the
# decode agent receives just the tail's bytes, the decode engine counts
# the cached tokens (pdx_engine_prefix_hit_tokens_total) and checks the
# KV of the whole prompt, cached prefix and received tail (KV that
# differs fails the request); the text equals the colocated engine's. A
# prompt cached whole moves no byte and still completes with the prefill
# side's first token (a transfer of no block). A request with vLLM's
# cache_salt hits only blocks cached under the same salt. Under pressure (a decode
# pool of four requests' blocks, then four requests at once) cached
# blocks are evicted and no request fails; every block comes back free.
#   prefix_pd.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3

notify="tcp://127.0.0.1:$(free_port)"
AGENT_OPTS+=(--notify "$notify" --metrics 127.0.0.1:0)
pd_engine_start P prefill --time-scale 0
# a request of 40 prompt and 8 output tokens takes 12 tiny blocks
pd_engine_start D decode --time-scale 0 --kv-blocks 48
named_engine_start C "$ENGINE" --time-scale 0 --no-prefix-cache
named_engine_start X "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D" --flow concurrent --notify-bind "$notify"
PORT_Ad=$(agent_metrics_port d) || exit 1

BLOCK=2048 # tiny: 4 tokens x 4 layers x 2 tensors x 64 bytes
a() { echo "pdx_agent_$1"; }
RECV_BYTES=$(a 'transfer_bytes_total{role="recv",path="ipc"}')
RECEIVED=$(a 'transfers_total{outcome="received",path="ipc"}')
n=0 bytes=0 hits=0

ids() { seq -s, "$@"; }

# ask PROMPT_IDS WHAT [FIELDS]: one completion through the proxy, whose
# text must equal the colocated engine's
ask() {
	local req="{\"prompt\": [$1], \"max_tokens\": 8${3:+, $3}}"
	PORT=$PORT_C post /v1/completions "$req" >"$E2E_TMP/c.json"
	status_is 200 "colocated: $2"
	PORT=$PORT_X post /v1/completions "$req" >"$E2E_TMP/x.json"
	status_is 200 "disaggregated: $2"
	py "import json; a=json.load(open('$E2E_TMP/c.json')); b=json.load(open('$E2E_TMP/x.json')); assert a['choices'][0]['text'] == b['choices'][0]['text'] and a['usage'] == b['usage'], (a, b)" \
		"$2: disaggregated equals colocated"
	n=$((n + 1))
}

# moved TAIL_BLOCKS HIT_TOKENS WHAT: the decode agent received one more
# transfer of TAIL_BLOCKS blocks; the decode engine found HIT_TOKENS more
# prompt tokens cached
moved() {
	bytes=$((bytes + $1 * BLOCK))
	hits=$((hits + $2))
	settle 10 "$PORT_Ad/$RECEIVED=$n" "$PORT_Ad/$RECV_BYTES=$bytes" \
		"$PORT_D/$(e prefix_hit_tokens_total)=$hits" ||
		fail "$3: want $1 block(s) moved and $2 token(s) found cached"
	echo "ok   $3"
}

ask "$(ids 1 40)" "a prompt of 10 blocks"
moved 10 0 "a first prompt moves all its 10 blocks"
ask "$(ids 1 32),$(ids 500 511)" "8 blocks of it and 3 more"
moved 3 32 "a prompt sharing 8 full blocks asks only for its 3 others"
ask "$(ids 1 40)" "the first prompt again"
moved 0 40 "a prompt cached whole moves no byte and still completes"
ask "$(ids 1 42)" "the first prompt and 2 tokens"
moved 1 40 "a prompt cached but for a partial block moves that block"
ask "$(ids 1 40)" "the first prompt under a cache_salt" '"cache_salt": "tenant-a"'
moved 10 0 "a salted prompt finds none of the blocks cached without its salt"
ask "$(ids 1 40)" "the same under the same salt" '"cache_salt": "tenant-a"'
moved 0 40 "and all of them under its own salt"
settle 10 "$PORT_D/$(e prefix_cache_blocks)>=11" "$PORT_D/$(e kv_blocks_used)=0" ||
	fail "the decode engine keeps its blocks cached, none held"

# pressure: five more prompts of 12 blocks fill the 48-block pool ...
for s in 1 2 3 4 5; do
	ask "$(ids $((s * 100)) $((s * 100 + 39)))" "pressure prompt $s"
	moved 10 0 "pressure prompt $s moves all its blocks"
done
# ... and four at once need every block: all the cached ones go
pids=()
for s in 6 7 8 9; do
	curl -sS -o "$E2E_TMP/p$s.json" -w '%{http_code}' \
		-H 'Content-Type: application/json' \
		--data-binary "{\"prompt\": [$(ids $((s * 100)) $((s * 100 + 39)))], \"max_tokens\": 8}" \
		"http://127.0.0.1:$PORT_X/v1/completions" >"$E2E_TMP/p$s.status" &
	pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for s in 6 7 8 9; do
	[ "$(cat "$E2E_TMP/p$s.status")" = 200 ] ||
		fail "request $s of four at once in a pool full of cached blocks: HTTP $(cat "$E2E_TMP/p$s.status"): $(cat "$E2E_TMP/p$s.json")"
done
n=$((n + 4))
moved 40 0 "four requests at once take the blocks of the cache: none fails"
ask "$(ids 900 939)" "the newest prompt again"
moved 0 40 "after eviction the cache still serves"
[ "$(val "$PORT_D" "$(e prefix_cache_blocks)")" -le 48 ] || fail "more cached blocks than the pool"

blocks_free "$PORT_P" "$PORT_D"
grep -q "received KV differs" "$E2E_TMP/D.log" && fail "the decode engine found KV that differs"
for x in X C D P; do named_stop $x; done
echo ok
