#!/usr/bin/env bash
# pdx-xferbench --mem cuda with the agents' data path forced: two engines
# with KV pools in GPU memory (CUDA IPC handles, per-layer CUDA events),
# a model (tiny unless MODEL says) moved and every byte checked on the GPU. --layer-ms makes
# the prefill side write each layer's bytes only when it "computes" it, so
# a path that reads a layer before its event fired fails verification.
# Also checks that the prefill agent logged the forced path, not a fallback.
# With TP P:D, P prefill ranks and D decode ranks reshard the KV heads
# (each decode rank's heads checked through a host image of its pool).
# Exits 77 (skipped) where there is no CUDA device, as pdx-xferbench does.
#
#   xferbench_cuda.sh PDX-XFERBENCH PDX-AGENT DATA-PATH [MODEL [P:D]]
set -u
xb=$1 agent=$2 path=$3 model=${4:-tiny} tp=${5:-1:1}

out=$("$xb" --mem cuda --model "$model" --tokens 256 --concurrency 2 \
	--random-blocks --iters 2 --layer-ms 1 --data-path "$path" --json \
	--prefill-tp "${tp%:*}" --decode-tp "${tp#*:}" --agent-bin "$agent")
rc=$?
[ "$rc" -eq 0 ] || exit "$rc"
echo "$out"

# the agent names its paths in words ("cuda ipc ..."): '-' matches any one
by=$(printf '%s\n' "$out" | sed -n 's/.*"data_by": "\([^"]*\)".*/\1/p')
if ! printf '%s\n' "$by" | grep -qi -- "${path//-/.}"; then
	echo "FAIL: --data-path $path, but the prefill agent logged" \
	     "\"data by ${by:-(nothing)}\"" >&2
	exit 1
fi
for key in d2d_gbps d2h_gbps; do
	if ! printf '%s\n' "$out" | grep -q "\"$key\": [0-9]"; then
		echo "FAIL: no $key in the report" >&2
		exit 1
	fi
done
echo "ok: --data-path $path: data by $by"
