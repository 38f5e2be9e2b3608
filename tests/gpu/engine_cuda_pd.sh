#!/usr/bin/env bash
# pdx-engine --kv-device cuda end to end: a prefill and a decode engine
# whose KV pools live in GPU memory, each with its pdx-agent (which opens
# the pool with CUDA IPC and waits on the engine's "layer computed"
# events), behind pdx-proxy in its sequential and concurrent flows. Short
# and multi-block prompts give the text of a colocated engine with its KV
# on the GPU, which is the text of a colocated host engine (the synthetic
# model's tokens do not depend on where the KV lives); the decode engine
# found every received position right (checked on the GPU); the agents
# moved the KV by DATA_PATH; every block is free afterwards and every
# process exits 0 on SIGTERM. Exits 77 (skipped) where there is no GPU.
#   engine_cuda_pd.sh PDX_ENGINE PDX_AGENT PDX_PROXY DATA_PATH MODEL TIME_SCALE
# DATA_PATH: the agents' --data-path (auto: their choice); MODEL: the
# engines' --model; TIME_SCALE: theirs (0: no modeled time; 1: layers are
# announced over a modeled forward pass).
HERE=$(cd "$(dirname "$0")" && pwd)
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
	echo "no GPU (nvidia-smi -L): skipped"
	exit 77
fi
. "$HERE/../e2e/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3
DATA_PATH=$4
MODEL=$5
SCALE=$6
opts=(--model "$MODEL" --time-scale "$SCALE" --kv-blocks 256)

# gpu_engine_start NAME ENGINE_OPTION...: an engine with its KV on the GPU
# (one that finds no CUDA device exits 77: the test is skipped).
gpu_engine_start() {
	local name=$1
	shift
	named_engine_start "$name" "$ENGINE" --kv-device cuda "$@"
}

notify="tcp://127.0.0.1:$(free_port)" # the concurrent proxy's collector
AGENT_OPTS+=(--notify "$notify" --data-path "$DATA_PATH")
gpu_engine_start G "${opts[@]}"
grep -q "kv blocks ([0-9.]* MiB) in cuda:0" "$E2E_TMP/G.log" ||
	fail "G: no pool on cuda:0: $(grep 'kv blocks' "$E2E_TMP/G.log")"
named_engine_start H "$ENGINE" "${opts[@]}"
agent_start p
gpu_engine_start P --role prefill --agent "ipc://$E2E_TMP/p.engine" "${opts[@]}"
agent_start d
gpu_engine_start D --role decode --agent "ipc://$E2E_TMP/d.engine" "${opts[@]}"
pools=(--prefill "127.0.0.1:$PORT_P" --decode "127.0.0.1:$PORT_D")
named_engine_start XS "$PROXY" "${pools[@]}" --flow sequential
named_engine_start XC "$PROXY" "${pools[@]}" --flow concurrent \
	--notify-bind "$notify"

long=$(for i in $(seq 300); do printf 'w%d ' $((i * 7 % 113)); done)
n=0
for p in "Hello, world!" "a" "The quick brown fox jumps over the lazy dog" \
	"$long"; do
	n=$((n + 1))
	want=$(text "$PORT_H" "$p" $((n * 9)))
	[ -n "$want" ] || fail "host engine: no text for '${p:0:40}'"
	got=$(text "$PORT_G" "$p" $((n * 9)))
	[ "$got" = "$want" ] ||
		fail "colocated GPU engine differs from the host one: '$got' != '$want'"
	for x in XS XC; do
		got=$(text "$(eval echo "\$PORT_$x")" "$p" $((n * 9)))
		[ "$got" = "$want" ] ||
			fail "$x: disaggregated on GPUs differs: '$got' != '$want'"
	done
done

# the agent names its paths in words ("cuda ipc ..."): '-' matches any one
by=$(sed -n 's/.*data by \([^ ]*\).*/\1/p' "$E2E_TMP/agent_p.log" | head -1)
[ -n "$by" ] || fail "the prefill agent logged no data path"
[ "$DATA_PATH" = auto ] || echo "$by" | grep -qi -- "${DATA_PATH//-/.}" ||
	fail "--data-path $DATA_PATH, but the prefill agent moved data by $by"
! grep -q "received KV differs\|checking received KV\|forward pass of" \
	"$E2E_TMP/D.log" "$E2E_TMP/P.log" ||
	fail "KV errors: $(grep -h 'received KV\|forward pass' "$E2E_TMP/D.log" "$E2E_TMP/P.log")"
checks=()
for p in "$PORT_P" "$PORT_D" "$PORT_G"; do
	checks+=("$p/pdx_engine_kv_blocks_used{model_name=\"$MODEL\"}=0")
done
settle 10 "${checks[@]}" || fail "KV blocks still held"
for x in XS XC P D G H; do named_stop $x; done
echo "ok: $MODEL, data by $by"
