#!/usr/bin/env bash
# Fault injection: SIGKILL each process of a disaggregated request — the
# prefill engine (P), the prefill agent (p), the decode engine (D), the
# decode agent (d) — at each phase, and the proxy mid-stream, in front of
# pdx-proxy (concurrent flow, the agents reporting to its --notify-bind):
#  * before the handshake: both agents freshly started, the process
#    killed just before the pair's first request, which meets it dead;
#  * mid-transfer: after P's agent pushed layer 1 of 4, before "done";
#  * after "done": while D streams the decode (two tokens out).
# For every case: the client's streamed request ends within BOUND_MS,
# either whole (200, [DONE], the colocated engine's text) or with a clear
# error (an HTTP error status with an error JSON, or an SSE error event);
# within SETTLE_S every survivor engine holds no KV block and runs or
# queues no request, and the proxy has nothing in flight and counts no
# transfer; the process restarted on the same address, a new request
# gets the colocated text. One line per case, a Markdown table row:
#   FAULT | P agent SIGKILL | mid-transfer | client: 502 error | ended after 1234 ms | blocks held: 0 | survivors: ok
#   faults.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3
T=$E2E_TMP
BOUND_MS=8000 # a request's end after the kill
SETTLE_S=8    # survivors idle after the request ended

export UCX_TLS=sm,self UCX_WARN_UNUSED_ENV_VARS=n
for v in P D C X p d n; do eval "PORT_$v=$(free_port)"; done
AOPTS=(--heartbeat-ms 200 --peer-timeout-ms 1000 --lease-ms 1500
	--layer-timeout-ms 3000 --xfer-timeout-ms 5000
	--notify "tcp://127.0.0.1:$PORT_n" --log-level debug)
# tiny (4 layers); P at scale 300000 computes the 1200-token prompt in one
# step of ~1.5 s and posts layer l at (l+1)/4 of it, so the transfer runs
# for about a second; D at scale 10000 decodes a token in ~10 ms. The
# blocks of a transfer whose agent died are quarantined 2 s (above the
# agents' --peer-timeout-ms, as agent_gone's; the default 6 s only made
# the survivors settle later)
EOPTS_P=(--role prefill --agent "ipc://$T/p.engine" --time-scale 300000
	--kv-timeout-ms 4000 --kv-quarantine-ms 2000)
EOPTS_D=(--role decode --agent "ipc://$T/d.engine" --time-scale 10000
	--kv-timeout-ms 4000 --kv-quarantine-ms 2000)
XOPTS=(--flow concurrent --prefill "127.0.0.1:$PORT_P" --decode "127.0.0.1:$PORT_D"
	--notify-bind "tcp://127.0.0.1:$PORT_n" --transfer-timeout 5
	--health-interval 200 --health-timeout 500 --unhealthy-after 2
	--healthy-after 1 --breaker-failures 0)

pid() { eval echo "\${PID_$1:-}"; }

# start_agent p|d: its engine (if it runs) registers again at once.
start_agent() {
	local n
	rm -f "$T/$1.engine"
	bg_start "$1" "$AGENT" --engine "ipc://$T/$1.engine" \
		--listen "tcp://127.0.0.1:$(eval echo "\$PORT_$1")" "${AOPTS[@]}"
	n=$(pid "$(echo "$1" | tr pd PD)")
	[ -n "$n" ] && kill -0 "$n" 2>/dev/null && n=1 || n=0
	for _ in $(seq 100); do
		if [ -S "$T/$1.engine" ] &&
			[ "$(sed -n '/^--- start/h; /^--- start/!H; ${x; p}' "$T/$1.log" |
				grep -c 'engine registered')" -ge $n ]; then
			# and its engine has the answer: it is ready again
			[ $n = 1 ] && wait_healthy "$(echo "$1" | tr pd PD)" 150
			return 0
		fi
		sleep 0.05
	done
	fail "agent $1 did not start (or its engine did not register again): $(tail -3 "$T/$1.log")"
}
start_engine() { # P, D or C
	case $1 in
	P) bg_start P "$ENGINE" --port "$PORT_P" "${EOPTS_P[@]}" ;;
	D) bg_start D "$ENGINE" --port "$PORT_D" "${EOPTS_D[@]}" ;;
	C) bg_start C "$ENGINE" --port "$PORT_C" --time-scale 0 ;;
	esac
	wait_healthy "$1" 150
}
start_proxy() {
	bg_start X "$PROXY" --port "$PORT_X" "${XOPTS[@]}"
	wait_healthy X 150
}
start_any() {
	case $1 in
	p | d) start_agent "$1" ;;
	X) start_proxy ;;
	*) start_engine "$1" ;;
	esac
}

# registered SIDE N: until agent SIDE's log has N "engine registered".
registered() {
	for _ in $(seq 100); do
		[ "$(grep -c 'engine registered' "$T/$1.log")" -ge "$2" ] && return 0
		sleep 0.05
	done
	fail "the engine did not register with agent $1: $(tail -5 "$T/$1.log")"
}

# idle NAME...: the checks that these survivors are idle; the proxy
# counts no transfer either.
idle() {
	local n i
	for n in "$@"; do
		case $n in
		X)
			proxy_idle X P D
			for i in P D; do
				echo "$PORT_X/pdx_proxy_instance_transfers{$(instance $i)}=0"
			done
			;;
		P | D) engine_idle "$n" ;;
		esac
	done
}
blocks_held() { # NAME...: the sum of their kv_blocks_used
	local n s=0
	for n in "$@"; do
		s=$((s + $(val "$(eval echo "\$PORT_$n")" "$(e kv_blocks_used)")))
	done
	echo $s
}

long=$($PY -c "print(' '.join('w%d' % i for i in range(1200)))")
short="after the fault, the pair serves again"
NTOK=100 # D streams them in ~1 s

for n in p d; do start_agent $n; done
for n in P D C; do start_engine $n; done
start_proxy
want_long=$(text "$PORT_C" "$long" $NTOK) || fail "colocated text"
want_short=$(text "$PORT_C" "$short" 12) || fail "colocated text"

# serves WHAT: a new request through the proxy gets the colocated text.
serves() {
	local got
	settle 10 "$PORT_X/pdx_proxy_instance_healthy{$(instance P)}=1" \
		"$PORT_X/pdx_proxy_instance_healthy{$(instance D)}=1" ||
		fail "$1: the proxy does not take P and D back"
	# (the known stale handshake: the first transfer to a restarted agent
	# from a peer that still held its predecessor's handshake may fail
	# "peer restarted", docs/reliability.md; one more request then)
	got=$(text "$PORT_X" "$short" 12 2>/dev/null) ||
		{ tail -3 "$T/D.log" | grep -q "peer restarted" &&
			got=$(text "$PORT_X" "$short" 12); } ||
		fail "$1: no answer through the proxy $(tail -3 "$T/X.log")
--- D: $(tail -8 "$T/D.log")
--- d: $(tail -8 "$T/d.log")
--- P: $(tail -5 "$T/P.log")"
	[ "$got" = "$want_short" ] || fail "$1: '$got', colocated '$want_short'"
}
serves "the first request"

# fault NAME LABEL PHASE: one case; prints its FAULT line.
fault() {
	local X=$1 label=$2 phase=$3 out=$T/r.json mark t0 ms outcome survivors end kp kd k
	local all="P D X" s
	rm -f "$out" "$out.tokens"
	survivors=${all/$X/}
	case $phase in
	before)
		# a fresh pair of agents: no handshake between them yet
		for s in p d; do
			[ "$X" = $s ] && continue
			kill -TERM "$(pid $s)"
			wait "$(pid $s)"
			start_agent $s
		done
		kp=$(grep -c '' "$T/p.log") kd=$(grep -c '' "$T/d.log")
		kill9 "$X"
		t0=$(date +%s%N)
		$PY "$E2E_DIR/client.py" stream "$PORT_X" "$long" $NTOK "$out" &
		;;
	mid)
		mark=$(grep -c . "$T/p.log")
		$PY "$E2E_DIR/client.py" stream "$PORT_X" "$long" $NTOK "$out" &
		end=$(($(date +%s%N) + 6000000000))
		until tail -n +"$((mark + 1))" "$T/p.log" | grep -q 'push layer 1'; do
			[ "$(date +%s%N)" -lt $end ] ||
				fail "$label mid-transfer: P's agent pushed no layer 1 in 6 s"
			sleep 0.02
		done
		! tail -n +"$((mark + 1))" "$T/p.log" | grep -q 'done sent' ||
			fail "$label mid-transfer: the transfer was over before the kill"
		kp=$(grep -c '' "$T/p.log") kd=$(grep -c '' "$T/d.log")
		kill9 "$X"
		t0=$(date +%s%N)
		;;
	after)
		$PY "$E2E_DIR/client.py" stream "$PORT_X" "$long" $NTOK "$out" &
		end=$(($(date +%s%N) + 6000000000))
		until [ "$(cat "$out.tokens" 2>/dev/null)" -ge 2 ] 2>/dev/null; do
			[ "$(date +%s%N)" -lt $end ] ||
				fail "$label after done: no token streamed in 6 s"
			sleep 0.02
		done
		kp=$(grep -c '' "$T/p.log") kd=$(grep -c '' "$T/d.log")
		kill9 "$X"
		t0=$(date +%s%N)
		;;
	esac
	until [ -f "$out" ]; do
		[ $((($(date +%s%N) - t0) / 1000000)) -lt $BOUND_MS ] ||
			fail "$label $phase: the request did not end within $BOUND_MS ms"
		sleep 0.05
	done
	ms=$((($(date +%s%N) - t0) / 1000000))
	outcome=$($PY - "$out" "$want_long" "$X" <<'PYEOF'
import json, sys
r, want, x = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
if x == "X" and r.get("transport"):
    print("connection reset after %d tokens" % r["tokens"])
elif r["status"] == 200 and r["done"] and not r["error"]:
    if r["text"].strip() != want:
        sys.exit("a whole answer with the wrong text: %r" % r["text"][:80])
    print("200 whole, colocated text")
elif r["status"] >= 400 and r["error"]:
    print("%d error (%s)" % (r["status"], r["error"][:60]))
elif r["status"] == 200 and r["error"] and not r["done"]:
    print("200 + SSE error event after %d tokens (%s)" % (r["tokens"], r["error"][:50]))
else:
    sys.exit("neither whole nor a clear error: %s" % json.dumps(r)[:300])
PYEOF
	) || fail "$label $phase: $outcome $(tail -3 "$T/X.log")"
	# an engine whose own agent went away answers 503 ("not now", as
	# while the agent is known away), not 500
	case $X$phase in
	pmid | dmid)
		case $outcome in 500*) fail "$label $phase: $outcome, want 503" ;; esac ;;
	esac
	# the survivors settle
	settle $SETTLE_S $(idle $survivors) ||
		fail "$label $phase: survivors not idle $(for s in $survivors p d; do echo "--- $s"; tail -4 "$T/$s.log"; done)"
	local held other
	held=$(blocks_held ${survivors/X/})
	start_any "$X"
	case $X$phase in
	pmid | pafter | dmid | dafter)
		# the other agent, which held a handshake with the killed
		# one, pings the restarted one and gets its hello, or dropped
		# the handshake after the silence ("peer P silent ...", or
		# "peer P: silent ...: its transfers fail" when a transfer was
		# on it; the hello it sends then may expire before the restart,
		# under load): no stale one is left
		other=$(echo "$X" | tr pd dp)
		k=$(eval echo "\$k$other")
		end=$(($(date +%s%N) + 5000000000))
		until tail -n +"$((k + 1))" "$T/$other.log" |
			grep -q "peer tcp://127.0.0.1:$(eval echo "\$PORT_$X"):\? \(ready\|silent\)"; do
			[ "$(date +%s%N)" -lt $end ] ||
				fail "$label $phase: agent $other did not meet the restarted $X again"
			sleep 0.05
		done
		;;
	esac
	serves "after $label $phase"
	settle $SETTLE_S $(idle P D X) || fail "after $label $phase and a new request: not idle"
	case $phase in
	before) phase="before the handshake" ;;
	mid) phase="mid-transfer" ;;
	after) phase="after done (D streams)" ;;
	esac
	[ "$X" = X ] && phase="mid-stream"
	printf 'FAULT | %s SIGKILL | %s | client: %s | ended after %d ms | blocks held: %s | survivors: ok\n' \
		"$label" "$phase" "$outcome" "$ms" "$held"
}

for phase in before mid after; do
	for X in P:"P engine" p:"P agent" D:"D engine" d:"D agent"; do
		fault "${X%%:*}" "${X#*:}" $phase
	done
done
fault X proxy after
for n in X P D C p d; do named_stop $n; done
echo ok
