#!/usr/bin/env bash
# Agents and engines killed and NOT restarted (docs/reliability.md, the
# fault matrix's "killed and not restarted" rows). Two prefill (P0, P1)
# and two decode (D0, D1) engines, each with its agent, behind pdx-proxy
# (concurrent flow, health checks every 200 ms, one retry). For the agent
# of a prefill and of a decode instance, then for the engines themselves:
#  * a long streamed request is under way (P's agent pushed layer 1), and
#    the agent (or the engine) of the instance that holds its KV is
#    SIGKILLed;
#  * within DETECT_MS that engine's /health says 503 with the reason (a
#    dead agent), or the proxy has taken the instance out of rotation (a
#    dead engine);
#  * the request in flight ends within BOUND_MS (its text, or a clear
#    error);
#  * within SETTLE_MS of that request's end no surviving engine holds a
#    KV block or runs a request;
#  * from DETECT_MS after the kill on, every request through the proxy
#    gets the colocated engine's text (the others serve them);
#  * the agent (engine) started again on the same address: the engine is
#    ready again by itself (after an agent's death, without a restart of
#    the engine), the proxy takes it back within a health interval, and
#    it serves requests again.
# One Markdown table row per case:
#   GONE | D agent SIGKILL | detected 12 ms | in flight: 200 after 2100 ms | after the bound: 0 of 6 failed | blocks held: 0 (idle after 410 ms) | back: ready 220 ms, serving
#   agent_gone.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3
T=$E2E_TMP
DETECT_MS=1000 # the engine link's liveness bound (docs/protocol.md)
BOUND_MS=8000  # the request in flight ends
QUARANTINE_MS=2000 # the engines' --kv-quarantine-ms
SETTLE_MS=$((QUARANTINE_MS + 2000)) # every engine idle after the request in flight ended
AFTER=6        # requests sent once the bound has passed

export UCX_TLS=sm,self UCX_WARN_UNUSED_ENV_VARS=n
for v in P0 P1 D0 D1 C X p0 p1 d0 d1; do eval "PORT_$v=$(free_port)"; done
AOPTS=(--heartbeat-ms 200 --peer-timeout-ms 1000 --lease-ms 1500
	--layer-timeout-ms 3000 --xfer-timeout-ms 5000 --log-level debug)
XOPTS=(--flow concurrent
	--prefill "127.0.0.1:$PORT_P0" --prefill "127.0.0.1:$PORT_P1"
	--decode "127.0.0.1:$PORT_D0" --decode "127.0.0.1:$PORT_D1"
	--health-interval 200 --health-timeout 500 --unhealthy-after 1
	--healthy-after 1 --retries 1)

pid() { eval echo "\${PID_$1:-}"; }
port() { eval echo "\$PORT_$1"; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
health() { curl -s -o "$T/health.body" -w '%{http_code}' "http://127.0.0.1:$(port "$1")/health"; }

start_agent() { # p0, p1, d0 or d1
	rm -f "$T/$1.engine"
	bg_start "$1" "$AGENT" --engine "ipc://$T/$1.engine" \
		--listen "tcp://127.0.0.1:$(port "$1")" "${AOPTS[@]}"
	for _ in $(seq 100); do
		[ -S "$T/$1.engine" ] && return 0
		sleep 0.05
	done
	fail "agent $1 did not start: $(tail -3 "$T/$1.log")"
}
# start_engine NAME ROLE: P at scale 300000 computes the 1200-token prompt
# in ~1.5 s, posting its 4 layers through it; D decodes a token in ~10 ms.
start_engine() {
	local a scale=10000
	a=$(echo "$1" | tr PD pd)
	[ "$2" = prefill ] && scale=300000
	bg_start "$1" "$ENGINE" --port "$(port "$1")" --role "$2" \
		--agent "ipc://$T/$a.engine" --time-scale $scale --kv-timeout-ms 4000 \
		--kv-quarantine-ms $QUARANTINE_MS
	wait_healthy "$1" 150
}

for a in p0 p1 d0 d1; do start_agent $a; done
for n in P0 P1; do start_engine $n prefill; done
for n in D0 D1; do start_engine $n decode; done
bg_start C "$ENGINE" --port "$PORT_C" --time-scale 0
wait_healthy C 150
bg_start X "$PROXY" --port "$PORT_X" "${XOPTS[@]}"
wait_healthy X 150

long=$($PY -c "print(' '.join('w%d' % i for i in range(1200)))")
short="after the agent is gone, the others serve"
want_long=$(text "$PORT_C" "$long" 100) || fail "colocated text"
want_short=$(text "$PORT_C" "$short" 12) || fail "colocated text"
ENGINES="P0 P1 D0 D1"

idle_checks() { # [NAME]: every engine but NAME
	local n
	for n in $ENGINES; do [ "$n" != "${1:-}" ] && engine_idle "$n"; done
}
healthy() { val "$PORT_X" "pdx_proxy_instance_healthy{$(instance "$1")}"; }
# holder P|D: the instance of that role holding KV blocks now, if any.
holder() {
	local n
	for n in ${1}0 ${1}1; do
		[ "$(val "$(port $n)" "$(e kv_blocks_used)")" != 0 ] && echo $n && return
	done
}

# wrong N: N requests of the short prompt through the proxy at once; the
# number that did not get the colocated text
wrong() {
	local i pids=() bad=0
	for i in $(seq "$1"); do
		$PY "$E2E_DIR/client.py" text "$PORT_X" "$short" 12 >"$T/short$i" 2>&1 &
		pids+=($!)
	done
	for i in $(seq "$1"); do
		wait "${pids[i - 1]}" && [ "$(cat "$T/short$i")" = "$want_short" ] ||
			bad=$((bad + 1))
	done
	echo $bad
}

# gone ROLE agent|engine: one case (P or D); prints its GONE row.
gone() {
	local role=$1 what=$2 out=$T/r.json marks=() t0 n a detect end outcome bad=0 k
	local idle_ms ready_ms served0 client ended_ms survivors_of= xmark nmark retry_ms bound
	rm -f "$out" "$out.tokens"
	for k in p0 p1; do marks+=("$(grep -c '' "$T/$k.log")"); done
	$PY "$E2E_DIR/client.py" stream "$PORT_X" "$long" 100 "$out" &
	client=$!
	end=$(($(date +%s%N) + 6000000000))
	until tail -n +"$((${marks[0]} + 1))" "$T/p0.log" | grep -q 'push layer 1' ||
		tail -n +"$((${marks[1]} + 1))" "$T/p1.log" | grep -q 'push layer 1'; do
		[ "$(date +%s%N)" -lt $end ] || fail "$role: no prefill agent pushed layer 1 in 6 s"
		sleep 0.02
	done
	n=$(holder "$role")
	[ -n "$n" ] || fail "$role: no $role instance holds the request's KV"
	a=$(echo "$n" | tr PD pd)
	xmark=$(grep -c '' "$T/X.log")
	nmark=$(grep -c '' "$T/$n.log")
	if [ "$what" = agent ]; then
		t0=$(date +%s%N)
		kill9 "$a"
		# its engine says so
		until [ "$(health "$n")" = 503 ]; do
			[ "$(ms_since "$t0")" -lt 5000 ] || fail "$n's /health still 200 5 s after its agent died"
			sleep 0.01
		done
		detect=$(ms_since "$t0")
		grep -q 'link to the agent was lost' "$T/health.body" ||
			fail "$n's /health 503 does not say why: $(cat "$T/health.body")"
		[ "$(val "$(port "$n")" "$(e agent_up)")" = 0 ] ||
			fail "$n's pdx_engine_agent_up is not 0 with its agent dead"
	else
		t0=$(date +%s%N)
		kill9 "$n"
		survivors_of=$n
		# the proxy's health checks say so
		until [ "$(healthy "$n")" = 0 ]; do
			[ "$(ms_since "$t0")" -lt 5000 ] || fail "the proxy still takes $n 5 s after it died"
			sleep 0.01
		done
		detect=$(ms_since "$t0")
	fi
	[ "$detect" -le $DETECT_MS ] ||
		fail "$n's $what: its death noticed after $detect ms (bound $DETECT_MS)"

	# the request in flight ends, whole or with a clear error
	until [ -f "$out" ]; do
		[ "$(ms_since "$t0")" -lt $BOUND_MS ] || fail "$role: the request in flight did not end in $BOUND_MS ms"
		sleep 0.02
	done
	wait $client
	ended_ms=$(ms_since "$t0")
	# the proxy heard of it at once: its retry (or the error) came within
	# the bound, not at a transfer timeout
	retry_ms=$(tail -n +"$((xmark + 1))" "$T/X.log" | awk -v t0="$t0" \
		'/retry 1 of/ { printf "%d\n", ($1 * 1000) - (t0 / 1000000); exit }')
	[ -n "$retry_ms" ] || fail "$role $what: the proxy did not retry the request in flight: $(tail -3 "$T/X.log")"
	# (a prefill engine whose agent died fails its request once the step
	# under way, the whole 1.5 s prefill here, is over)
	bound=$DETECT_MS
	[ "$role $what" = "P agent" ] && bound=$((DETECT_MS + 1500))
	[ "$retry_ms" -le $bound ] ||
		fail "$role $what: the proxy retried $retry_ms ms after the kill (bound $bound ms)"
	outcome=$($PY - "$out" "$want_long" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
if r["status"] == 200 and r["done"] and not r["error"]:
    print("200" if r["text"] == sys.argv[2] else "WRONG TEXT")
else:
    print("%d error" % r["status"] if r["error"] else "UNCLEAR %r" % r)
EOF
)
	case $outcome in 200 | *error) ;; *) fail "$role: the request in flight ended $outcome" ;; esac

	# no block held anywhere once it ended, but for the quarantine of
	# the failed transfer's blocks after an agent's death
	settle $((SETTLE_MS / 1000)) $(idle_checks $survivors_of) ||
		fail "$role: engines not idle $SETTLE_MS ms after the request in flight ended"
	idle_ms=$(ms_since "$t0")
	# (a prefill request the proxy cancels mid-prefill, on D's 502 before
	# P's step ends, has its blocks freed at once, rightly: its transfer
	# lacks layers and can never complete, and only a receive's blocks
	# are written by others)
	[ "$what" = engine ] || grep -q "its KV blocks are held $QUARANTINE_MS ms more" "$T/$n.log" ||
		{ [ "$role" = P ] && ! tail -n +"$((nmark + 1))" "$T/$n.log" | grep -q "the engine's agent went away"; } ||
		fail "$n did not quarantine the blocks of the transfer its agent left"

	# past the bound, nobody notices
	while [ "$(ms_since "$t0")" -lt $DETECT_MS ]; do sleep 0.02; done
	bad=$(wrong $AFTER)
	[ $bad -eq 0 ] || fail "$role: $bad of $AFTER requests failed after the detection bound: $(tail -5 "$T/X.log")"

	# the proxy's log says why it left rotation
	[ "$what" = engine ] || grep -q "instance http://127.0.0.1:$(port "$n") unhealthy: .*503: the link to the agent was lost" "$T/X.log" ||
		fail "the proxy's log does not say why $n is unhealthy: $(grep unhealthy "$T/X.log" | tail -2)"

	# back, by itself
	t0=$(date +%s%N)
	if [ "$what" = agent ]; then
		served0=$(val "$(port "$n")" "$(e requests_finished_total)")
		start_agent "$a"
		until [ "$(health "$n")" = 200 ]; do
			[ "$(ms_since "$t0")" -lt 5000 ] || fail "$n not ready 5 s after its agent came back: $(cat "$T/health.body")"
			sleep 0.01
		done
	else
		served0=0
		start_engine "$n" "$([ "$role" = P ] && echo prefill || echo decode)"
	fi
	ready_ms=$(ms_since "$t0")
	[ "$(val "$(port "$n")" "$(e agent_up)")" = 1 ] ||
		fail "$n's pdx_engine_agent_up is not 1 with its agent back"
	settle 2 "$PORT_X/pdx_proxy_instance_healthy{$(instance "$n")}=1" ||
		fail "the proxy does not take $n back"
	[ "$(wrong 4)" = 0 ] ||
		fail "$role: after the $what came back: $(cat "$T"/short[1-4])"
	[ "$(val "$(port "$n")" "$(e requests_finished_total)")" -gt "$served0" ] ||
		fail "$n served nothing after its $what came back"
	echo "GONE | $role $what SIGKILL | detected $detect ms | in flight: $outcome after $ended_ms ms (retried after $retry_ms ms) | after the bound: $bad of $AFTER failed | blocks held: 0 (idle after $idle_ms ms) | back: ready $ready_ms ms, serving"
}

gone P agent
gone D agent
gone P engine
gone D engine
settle 5 $(idle_checks) || fail "engines not idle at the end"
for n in X C P0 P1 D0 D1 p0 p1 d0 d1; do named_stop $n; done
echo "all killed-and-not-restarted cases passed"
