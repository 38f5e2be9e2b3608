#!/usr/bin/env bash
# An engine started twice by mistake (the same --agent and --port, say
# by a second systemd unit or a shell's history): the second one exits 1
# on its port, and the first keeps its agent. The second used to register
# first and fail to bind after, leaving the agent to a dead engine: the
# live one answered 503 "another engine registered with this agent" to
# every request until it was restarted by hand.
#   engine_twice.sh PDX_ENGINE PDX_AGENT
. "$(dirname "$0")/lib.sh"
ENGINE=$1
AGENT=$2

pd_engine_start D decode --time-scale 0
PORT=$PORT_D get /health >/dev/null
status_is 200 "the first engine"
timeout 20 "$ENGINE" --role decode --agent "ipc://$E2E_TMP/d.engine" \
	--port "$PORT_D" --time-scale 0 >"$E2E_TMP/twice.log" 2>&1
rc=$?
[ $rc = 1 ] || fail "the second engine: exit $rc, want 1: $(tail -3 "$E2E_TMP/twice.log")"
grep -q "Address already in use" "$E2E_TMP/twice.log" ||
	fail "the second engine: $(tail -3 "$E2E_TMP/twice.log")"
sleep 0.5 # what the agent would have said to the first
PORT=$PORT_D get /health >/dev/null
status_is 200 "the first engine after the second exited"
PORT=$PORT_D post /v1/completions '{"prompt": "still here?", "max_tokens": 3}' >/dev/null
status_is 200 "a request to the first engine"
[ "$(grep -c "another engine registered" "$E2E_TMP/D.log")" = 0 ] ||
	fail "the first engine was displaced: $(grep "another engine" "$E2E_TMP/D.log" | head -2)"
echo ok
