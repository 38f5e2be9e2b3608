#!/usr/bin/env bash
# An agent started again on ANOTHER address (docs/reliability.md, "Agents
# restarted elsewhere"). One prefill (P) and one decode (D) engine, each
# with its agent, behind pdx-proxy (concurrent flow, health checks every
# 200 ms, no retry). For P's agent, then D's:
#  * a request is served (the agents have met; the proxy knows both);
#  * the agent is SIGKILLed and at once started again on a new port, its
#    engine registers with it (/health 200 again);
#  * within a few health checks the proxy has noticed the new address, so
#    the next request gets the colocated engine's text at once: the
#    other side is not sent to the dead address (before: its agent waited
#    for the dead one to answer until --handshake-timeout-ms or
#    --peer-timeout-ms, then 502, and the prefill engine held the
#    prompt's KV for a lease nobody claimed);
#  * every engine is idle right after.
#   agent_moved.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3
T=$E2E_TMP
HEALTH_MS=200
BOUND_MS=1500 # a request of a few tokens, handshake included
LEASE_MS=5000 # the KV of a request nobody claims would be held this long

AGENT_OPTS+=(--heartbeat-ms 200 --peer-timeout-ms 2000
	--handshake-timeout-ms 2000 --lease-ms $LEASE_MS)
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

# agent_at SIDE PORT: SIDE's agent listening on PORT (the last --listen
# given is the one).
agent_at() { agent_start "$1" --listen "tcp://127.0.0.1:$2"; }
peer_of() { # NAME: the agent address its engine gives (/v1/pdx/info)
	curl -s "http://127.0.0.1:$(eval echo "\$PORT_$1")/v1/pdx/info" |
		$PY -c 'import json, sys; print(json.load(sys.stdin)["peer_addr"])'
}

PORT_p=$(free_port) PORT_d=$(free_port)
agent_at p "$PORT_p"
agent_at d "$PORT_d"
named_engine_start P "$ENGINE" --role prefill --agent "ipc://$T/p.engine" --time-scale 0
named_engine_start D "$ENGINE" --role decode --agent "ipc://$T/d.engine" --time-scale 0
named_engine_start C "$ENGINE" --time-scale 0
named_engine_start X "$PROXY" --flow concurrent --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D" --health-interval $HEALTH_MS \
	--unhealthy-after 1 --healthy-after 1 --retries 0
prompt="an agent that moved is found where it is now"
want=$(text "$PORT_C" "$prompt" 8)
got=$(text "$PORT_X" "$prompt" 8)
[ "$got" = "$want" ] || fail "before any move: '$got', want '$want'"

# moved NAME SIDE: SIDE's agent (of engine NAME) killed and started on a
# new port; then one request.
moved() {
	local n=$1 a=$2 old new t0 ms got
	old=$(peer_of "$n")
	new=$(free_port)
	kill9 "agent_$a"
	rm -f "$T/$a.engine"
	agent_at "$a" "$new"
	for _ in $(seq 100); do
		[ "$(peer_of "$n")" = "tcp://127.0.0.1:$new" ] && break
		sleep 0.05
	done
	[ "$(peer_of "$n")" = "tcp://127.0.0.1:$new" ] ||
		fail "$n's engine does not name its agent's new address: $(peer_of "$n")"
	settle 2 "$PORT_X/pdx_proxy_instance_healthy{$(instance "$n")}=1" ||
		fail "the proxy does not take $n back"
	sleep $((HEALTH_MS * 3 / 1000)).$((HEALTH_MS * 3 % 1000))
	t0=$(date +%s%N)
	got=$($PY "$E2E_DIR/client.py" text "$PORT_X" "$prompt" 8 2>&1) || got="(failed: $got)"
	ms=$(ms_since "$t0")
	[ "$got" = "$want" ] ||
		fail "$n's agent moved from $old to port $new: the next request got '$got' after $ms ms: $(tail -3 "$T/X.log")"
	[ "$ms" -le $BOUND_MS ] ||
		fail "$n's agent moved from $old to port $new: the next request took $ms ms (bound $BOUND_MS)"
	settle 2 $(engine_idle P D) ||
		fail "$n's agent moved: an engine still holds KV after the request"
	echo "MOVED | $n agent $old -> port $new | next request: 200 after $ms ms | blocks held: 0"
}

moved P p
moved D d
for n in X C P D agent_p agent_d; do named_stop $n; done
echo "agents restarted on another address: served at once"
