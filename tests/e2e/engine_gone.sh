#!/usr/bin/env bash
# An engine that exits (killed, or stopped cleanly) takes its KV memory
# with it: its own agent and the peer agent that mapped its pool (the ipc
# lane; the cuda-ipc lane with KV_DEVICE cuda) let go of it at once, and
# the next engine started in its place works. Agents used to keep a dead
# engine's pool mapped until an engine registered with them again, and
# peers until they met that agent again, so a restarted engine found
# /dev/shm (or the GPU memory open by CUDA IPC, which stays allocated
# while any process has it open) still holding the one before it.
#   engine_gone.sh PDX_ENGINE PDX_AGENT PDX_PROXY [KV_DEVICE]
# KV_DEVICE: host (the default: the agents' maps are read) or cuda (the
# GPU's used memory is; exits 77, skipped, where there is no GPU).
HERE=$(cd "$(dirname "$0")" && pwd)
KV=${4:-host}
if [ "$KV" = cuda ] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
	echo "no GPU (nvidia-smi -L): skipped"
	exit 77
fi
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3

opts=(--time-scale 0)
# a pool of 2 GiB on the GPU: well above what a process's CUDA context
# takes, which its death frees either way
[ "$KV" = cuda ] && opts+=(--kv-device cuda --model llama3-8b --kv-blocks 1024)
AGENT_OPTS+=(--metrics 127.0.0.1:0)
pd_engine_start P prefill "${opts[@]}"
pd_engine_start D decode "${opts[@]}"
named_engine_start X "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D" --flow concurrent
PORT_Ad=$(agent_metrics_port d) || exit 1

ask() {
	local code
	for _ in $(seq 150); do
		code=$(curl -s -o "$E2E_TMP/x.json" -w '%{http_code}' \
			-H 'Content-Type: application/json' \
			-d '{"prompt": "where did the memory go?", "max_tokens": 4}' \
			"http://127.0.0.1:$PORT_X/v1/completions")
		[ "$code" = 200 ] && return 0
		sleep 0.1
	done
	fail "$1: $code $(cat "$E2E_TMP/x.json")"
}

# maps AGENT_SIDE ENGINE_PID: how many of the agent's mappings are that
# engine's pool
maps() {
	local pid
	pid=$(eval echo "\$PID_agent_$1")
	grep -c "pdx-engine-$2-" "/proc/$pid/maps"
}

# gpu_used: MiB of GPU 0's memory in use
gpu_used() {
	nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0
}

# mark: the agents' logs so far (released reads what came after), and
# the GPU's memory in use
mark() {
	from_d=$(($(wc -l <"$E2E_TMP/agent_d.log") + 1))
	from_p=$(($(wc -l <"$E2E_TMP/agent_p.log") + 1))
	[ "$KV" = cuda ] && used=$(gpu_used)
	return 0
}

# freed PID: decode engine PID's pool is no longer held: by neither
# agent's maps (host), or its 2 GiB are back on the GPU
freed() {
	if [ "$KV" = cuda ]; then
		[ $((used - $(gpu_used))) -ge 1800 ]
	else
		[ "$(maps d "$1")" = 0 ] && [ "$(maps p "$1")" = 0 ]
	fi
}

# released PID HOW: after decode engine PID ended HOW, its pool is freed
# within 5 s, the decode agent has no engine, and both agents said why
released() {
	local d=$1 how=$2
	for _ in $(seq 50); do
		freed "$d" && break
		sleep 0.1
	done
	if [ "$KV" = cuda ]; then
		freed "$d" || fail "$how: $((used - $(gpu_used))) MiB of GPU memory freed, want the pool's 2048"
	else
		[ "$(maps d "$d")" = 0 ] ||
			fail "$how: the decode agent still maps its engine's pool"
		[ "$(maps p "$d")" = 0 ] ||
			fail "$how: the prefill agent still maps the decode engine's pool"
	fi
	settle 5 "$PORT_Ad/pdx_agent_engine_registered=0" ||
		fail "$how: the decode agent still counts an engine registered"
	tail -n "+$from_d" "$E2E_TMP/agent_d.log" |
		grep -q "the engine's connection closed" ||
		fail "$how: the decode agent did not say why"
	tail -n "+$from_p" "$E2E_TMP/agent_p.log" | grep -q "its engine is gone" ||
		fail "$how: the prefill agent did not say why"
}

ask "a request before"
d=$PID_D
if [ "$KV" = host ]; then
	[ "$(maps d "$d")" -gt 0 ] || fail "the decode agent does not map its engine's pool"
	[ "$(maps p "$d")" -gt 0 ] ||
		fail "the prefill agent does not map the decode engine's pool (ipc lane)"
fi

mark
kill9 D
released "$d" "killed"

bg_start D "$ENGINE" --role decode --agent "ipc://$E2E_TMP/d.engine" \
	--port "$PORT_D" "${opts[@]}"
wait_healthy D 300
ask "a request to the engine started in its place"
d=$PID_D
if [ "$KV" = host ]; then
	[ "$(maps p "$d")" -gt 0 ] ||
		fail "the prefill agent does not map the new decode engine's pool"
fi

# ucx_maps SIDE: agent SIDE's mappings of UCX's shared memory (its peers'
# FIFOs and buffers, SysV and POSIX)
ucx_maps() {
	local pid
	pid=$(eval echo "\$PID_agent_$1")
	grep -c "SYSV\|ucx_shm_posix" "/proc/$pid/maps"
}

# Restarts of the decode engine leave the agents' UCX shared memory as
# it was: each new registration's hello met the peer agent's endpoint
# again, and UCX (1.13) cannot close a same-host one, so both agents
# kept one more (three more mappings, 4 MiB) per restart until they
# exited. Host KV only (the GPU run has its own checks above).
if [ "$KV" = host ]; then
	before_p=$(ucx_maps p) before_d=$(ucx_maps d)
	for i in 1 2 3; do
		kill9 D
		bg_start D "$ENGINE" --role decode --agent "ipc://$E2E_TMP/d.engine" \
			--port "$PORT_D" "${opts[@]}"
		wait_healthy D 300
		ask "a request after restart $i"
	done
	[ "$(ucx_maps p)" = "$before_p" ] && [ "$(ucx_maps d)" = "$before_d" ] ||
		fail "3 restarts of the decode engine: the agents' UCX shared-memory mappings went from $before_p and $before_d to $(ucx_maps p) and $(ucx_maps d)"
	d=$PID_D
fi

mark
named_stop D
released "$d" "stopped (SIGTERM)"
echo ok
