#!/usr/bin/env bash
# --on-transfer-failure: the decode agent dies; behind a proxy with
# `recompute` the decode engine prefills the request itself and the client
# gets the colocated engine's text; behind one with the default `fail` the
# client gets a clear 503 (the decode engine refuses a transfer its agent
# cannot make, before any compute). The prefill side frees the KV it held for the
# dead agent once that agent is silent.
#   proxy_recompute.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3

AGENT_OPTS+=(--heartbeat-ms 200 --peer-timeout-ms 1000 --lease-ms 2000)
pd_engine_start P prefill --time-scale 0
pd_engine_start D decode --time-scale 0
named_engine_start C "$ENGINE" --time-scale 0
pools=(--prefill "127.0.0.1:$PORT_P" --decode "127.0.0.1:$PORT_D" --retries 0
	--health-interval 0)
named_engine_start XR "$PROXY" "${pools[@]}" --on-transfer-failure recompute
named_engine_start XF "$PROXY" "${pools[@]}"

prompt="what happens when the decode agent dies"
want=$(text "$PORT_C" "$prompt" 9)
[ "$(text "$PORT_XR" "$prompt" 9)" = "$want" ] || fail "before the fault: not the colocated text"

kill9 agent_d
got=$(text "$PORT_XR" "$prompt" 9)
[ "$got" = "$want" ] || fail "recompute: '$got', want '$want'"
PORT=$PORT_XF post /v1/completions "{\"prompt\": \"$prompt\", \"max_tokens\": 9}" >/dev/null
status_is 503 "fail: the decode agent is dead"
grep -q "link to the agent was lost" "$E2E_TMP/body" || fail "fail: unclear error: $(cat "$E2E_TMP/body")"
# the prefill side frees what it held for the dead agent
blocks_free "$PORT_P" "$PORT_D"
for name in XR XF P D C agent_p; do
	named_stop "$name"
done
echo "ok: a dead decode agent: recompute gives the colocated text, fail a clear 500"
