#!/usr/bin/env bash
# --on-transfer-failure: the decode agent dies; behind a proxy with
# `recompute` the decode engine prefills the request itself and the client
# gets the colocated engine's text (early-callback too, when P answers
# before its callback); behind one with the default `fail` the
# client gets a clear 503 (the decode engine refuses a transfer its agent
# cannot make, before any compute). The prefill side frees the KV it held for the
# dead agent once that agent is silent. A prefill agent nobody reaches
# fails decode's transfers with 502, counted against P, not D.
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
# early-callback whose callback never comes (its --metaserver-url leads
# nowhere): P's answer is D's request, and D must still get the proxy's
# policy (it got none, and failed what it should have recomputed)
named_engine_start XE "$PROXY" "${pools[@]}" --flow early-callback \
	--on-transfer-failure recompute \
	--metaserver-url "http://127.0.0.1:$(free_port)/v1/metaserver"

prompt="what happens when the decode agent dies"
want=$(text "$PORT_C" "$prompt" 9)
[ "$(text "$PORT_XR" "$prompt" 9)" = "$want" ] || fail "before the fault: not the colocated text"

kill9 agent_d
got=$(text "$PORT_XR" "$prompt" 9)
[ "$got" = "$want" ] || fail "recompute: '$got', want '$want'"
# a client's on_failure null is no choice: the proxy's policy (null went
# on to D, which read it as "fail")
PORT=$PORT_XR post /v1/completions "{\"prompt\": \"$prompt\", \"max_tokens\": 9, \"kv_transfer_params\": {\"on_failure\": null}}" >/dev/null
status_is 200 "recompute, the client's on_failure null"
got=$(text "$PORT_XE" "$prompt" 9)
[ "$got" = "$want" ] || fail "recompute, early-callback without its callback: '$got', want '$want'"
grep -q "prefill answered before its callback" "$E2E_TMP/XE.log" ||
	fail "XE's request did not go without its callback"
PORT=$PORT_XF post /v1/completions "{\"prompt\": \"$prompt\", \"max_tokens\": 9}" >/dev/null
status_is 503 "fail: the decode agent is dead"
grep -q "link to the agent was lost" "$E2E_TMP/body" || fail "fail: unclear error: $(cat "$E2E_TMP/body")"
# the prefill side frees what it held for the dead agent
blocks_free "$PORT_P" "$PORT_D"
for name in XR XF XE P D C agent_p; do
	named_stop "$name"
done

# A prefill instance whose agent gives out an address nobody answers at
# (a wrong --advertise): each decode request's transfer fails at the
# handshake bound, and D answers 502 kv_transfer_failed. The proxy counts
# that against P, not against D, which did nothing wrong (its breaker
# opened, and with several decode instances one bad prefill instance took
# them out one by one), and its breaker opens.
AGENT_OPTS+=(--handshake-timeout-ms 500)
agent_start p2 --advertise "tcp://127.0.0.1:$(free_port)"
named_engine_start P2 "$ENGINE" --role prefill --time-scale 0 \
	--agent "ipc://$E2E_TMP/p2.engine"
pd_engine_start D2 decode --time-scale 0
named_engine_start XB "$PROXY" --prefill "127.0.0.1:$PORT_P2" \
	--decode "127.0.0.1:$PORT_D2" --retries 0 --health-interval 0 \
	--breaker-failures 2 --admin-token s3cret
for _ in 1 2; do
	PORT=$PORT_XB post /v1/completions '{"prompt": "to nowhere", "max_tokens": 3}' >/dev/null
	status_is 502 "a transfer from a prefill agent nobody reaches"
	grep -q "kv_transfer_failed" "$E2E_TMP/body" || fail "not D's 502: $(cat "$E2E_TMP/body")"
done
curl -sS -H 'Authorization: Bearer s3cret' "http://127.0.0.1:$PORT_XB/admin/instances" >"$E2E_TMP/adm.json"
$PY - "$E2E_TMP/adm.json" <<'PY' || fail "breakers: $(cat "$E2E_TMP/adm.json")"
import json, sys
i = {x["role"]: x for x in json.load(open(sys.argv[1]))["instances"]}
assert i["decode"]["failures"] == 0 and i["decode"]["breaker"] == "closed", i
assert i["prefill"]["failures"] == 2, i
# P's own good answers (and its probes') did not reset its count between
# the two: its breaker opened (it stayed shut, at one failure in a row)
assert i["prefill"]["breaker"] == "open", i
# two requests each: the /v1/pdx/info probes (asked again after each
# failure) are no requests (they counted: 4 each)
assert i["prefill"]["requests"] == 2 and i["decode"]["requests"] == 2, i
PY
# a hung prefill engine met first by a proxy: its /v1/pdx/info probe
# times out and the request fails then (504), not after its real leg
# waited as long again (two --first-byte-timeout)
named_engine_start XH "$PROXY" --prefill "127.0.0.1:$PORT_P2" \
	--decode "127.0.0.1:$PORT_D2" --retries 0 --health-interval 0 \
	--first-byte-timeout 1500
kill -STOP "$PID_P2"
t0=$(date +%s%N)
PORT=$PORT_XH post /v1/completions '{"prompt": "hung", "max_tokens": 3}' >/dev/null
took=$((($(date +%s%N) - t0) / 1000000))
kill -CONT "$PID_P2"
status_is 504 "a hung prefill engine"
[ "$took" -lt 2500 ] || fail "a hung prefill engine: 504 after $took ms (first-byte timeout 1500 ms)"
for name in XH XB P2 D2 agent_p2 agent_d2; do
	named_stop "$name"
done
echo "ok: a dead decode agent: recompute gives the colocated text, fail a clear 500; a prefill agent nobody reaches is the prefill instance's failure"
