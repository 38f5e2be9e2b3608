# Shared by the e2e shell tests: start pdx-engine on a free port, talk to
# it with curl, check JSON with python3, stop it and require a clean exit
# (under ASan that includes no leaks); several engines, agents and proxies
# by name; waits on their /health, and on their /metrics (client.py).
#   . lib.sh; engine_start BIN [options...]; ...; engine_stop
set -u

E2E_TMP=$(mktemp -d)
E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=/usr/bin/python3 # python3 on PATH may be a slow shim
[ -x $PY ] || PY=python3
ENGINE_PID=
PORT=

fail() {
	echo "FAIL: $*" >&2
	[ -f "$E2E_TMP/engine.log" ] && tail -20 "$E2E_TMP/engine.log" >&2
	exit 1
}

# Processes started by bg_start, killed at exit if still running.
E2E_PIDS=""
# a request's files are named $((E2E_SEQ += 1)): unique in the test, where
# $RANDOM (15 bits) once gave two requests one name
E2E_SEQ=0

cleanup() {
	local end p
	[ -n "$ENGINE_PID" ] && kill "$ENGINE_PID" 2>/dev/null
	# (a process the test had stopped, SIGSTOP, takes its SIGTERM only
	# once it runs again: a check that failed while one was stopped
	# hung here until meson's timeout) It is resumed before its SIGTERM,
	# and only if stopped: a SIGCONT sent after the SIGTERM could reach
	# a process already exiting, where LeakSanitizer (ASan builds) stops
	# it for its leak scan (ptrace attach: a SIGSTOP), and discard that
	# SIGSTOP: its tracer waited for a stop that never came, the process
	# for its tracer, both for ever (proxy_models, meson's timeout, under
	# load)
	for p in $E2E_PIDS; do
		[ "$(sed 's/.*) \(.\).*/\1/' "/proc/$p/stat" 2>/dev/null)" = T ] &&
			kill -CONT "$p" 2>/dev/null
		kill "$p" 2>/dev/null
	done
	# bounded as stopped() is: one that ignores its signal is killed (a
	# test that failed beside one waited here until meson's timeout)
	end=$((SECONDS + ${E2E_STOP_S:-20}))
	for p in $ENGINE_PID $E2E_PIDS; do
		pid_exited_by "$p" "$end" || kill -KILL "$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
	# E2E_KEEP=1: the logs stay, for a failure's post-mortem
	if [ -n "${E2E_KEEP:-}" ]; then
		echo "logs kept in $E2E_TMP" >&2
	else
		rm -rf "$E2E_TMP"
	fi
}
trap cleanup EXIT

# Starts the engine with --port 0 and reads its port from the log.
engine_start() {
	# emptied here, not by the child's redirection: read below before
	# the child opened it, an engine started again had the old one's
	# port read (engine_api, under load: "Failed to connect")
	: >"$E2E_TMP/engine.log"
	"$@" --port 0 2>>"$E2E_TMP/engine.log" &
	ENGINE_PID=$!
	for _ in $(seq 100); do
		PORT=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9]*\)$/\1/p' \
			"$E2E_TMP/engine.log")
		[ -n "$PORT" ] && return 0
		kill -0 "$ENGINE_PID" 2>/dev/null || fail "engine exited at start"
		sleep 0.1
	done
	fail "engine did not start listening"
}

# stopped NAME PID SIG: waits for our child PID, SIG sent to it, at most
# E2E_STOP_S seconds (meson.build gives each test a third of its timeout;
# 20 without: an ASan build's leak scan takes some), and sets rc to its
# exit status. Past that it is killed and the test fails saying which (a
# process that ignored its signal showed only as meson's timeout). The
# bound is in seconds (SECONDS), whatever the load; no fork per turn.
stopped() {
	if ! pid_exited_by "$2" $((SECONDS + ${E2E_STOP_S:-20})); then
		kill -KILL "$2" 2>/dev/null
		wait "$2" 2>/dev/null
		fail "$1 did not exit within ${E2E_STOP_S:-20} s of SIG$3"
	fi
	wait "$2"
	rc=$?
}

# pid_running PID: whether PID is there, and no zombie (a child of ours not
# waited for yet, which kill -0 still finds).
pid_running() {
	local state=
	{ read -r state <"/proc/$1/stat"; } 2>/dev/null
	state=${state##*) }
	state=${state%% *}
	[ -n "$state" ] && [ "$state" != Z ]
}

# pid_exited_by PID END: waits until PID no longer runs, or SECONDS reaches
# END (then false).
pid_exited_by() {
	while pid_running "$1"; do
		((SECONDS < $2)) || return 1
		sleep 0.05
	done
}

# SIGTERM, then the exit status must be 0.
engine_stop() {
	local rc
	kill -TERM "$ENGINE_PID"
	stopped engine "$ENGINE_PID" TERM
	ENGINE_PID=
	[ $rc -eq 0 ] || fail "engine exited with $rc after SIGTERM"
}

# post PATH JSON: prints the body; HTTP status in $E2E_TMP/status.
post() {
	curl -sS -o "$E2E_TMP/body" -w '%{http_code}' -H 'Content-Type: application/json' \
		--data-binary "$2" "http://127.0.0.1:$PORT$1" >"$E2E_TMP/status" ||
		fail "curl POST $1"
	cat "$E2E_TMP/body"
}

get() {
	curl -sS -o "$E2E_TMP/body" -w '%{http_code}' \
		"http://127.0.0.1:$PORT$1" >"$E2E_TMP/status" || fail "curl GET $1"
	cat "$E2E_TMP/body"
}

status_is() {
	[ "$(cat "$E2E_TMP/status")" = "$1" ] ||
		fail "$2: HTTP $(cat "$E2E_TMP/status"), want $1: $(cat "$E2E_TMP/body")"
}

# py CODE: runs python3 with stdin; the code asserts.
py() {
	"$PY" -c "$1" || fail "check failed: $2"
}

# A TCP port nobody listens on now, below the kernel's ephemeral range
# where it can (scripts/free-ports says why).
free_port() {
	$PY "$(dirname "${BASH_SOURCE[0]}")/../../scripts/free-ports"
}

# bg_start NAME CMD...: runs CMD in the background, stderr appended to
# $E2E_TMP/NAME.log after a line "--- start" (a name started again keeps
# one log); its pid in PID_NAME.
bg_start() {
	local name=$1
	shift
	echo "--- start" >>"$E2E_TMP/$name.log"
	"$@" 2>>"$E2E_TMP/$name.log" >/dev/null &
	eval "PID_$name=$!"
	E2E_PIDS="$E2E_PIDS $!"
}

# named_engine_start NAME BIN [options...]: like engine_start for one of
# several engines; its port in PORT_NAME. An engine that exits 77 at start
# (e.g. --kv-device cuda finding no CUDA device) skips the test.
named_engine_start() {
	local name=$1 pid port rc
	shift
	bg_start "$name" "$@" --port 0
	pid=$(eval echo "\$PID_$name")
	for _ in $(seq 300); do
		# since the last start (a name started again keeps one log)
		port=$(awk '/^--- start$/ { p = "" }
			/listening on http:\/\/[^ ]*:[0-9]+$/ { n = split($0, f, ":"); p = f[n] }
			END { print p }' "$E2E_TMP/$name.log")
		if [ -n "$port" ]; then
			eval "PORT_$name=$port"
			return 0
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			wait "$pid"
			rc=$?
			if [ $rc -eq 77 ]; then
				echo "$name: $(tail -1 "$E2E_TMP/$name.log"): skipped"
				exit 77
			fi
			fail "$name exited with $rc at start: $(tail -5 "$E2E_TMP/$name.log")"
		fi
		sleep 0.1
	done
	fail "$name did not start listening"
}

# named_stop NAME [SIGNAL]: SIGTERM (or SIGNAL), then the exit status
# must be 0.
named_stop() {
	local pid rc sig=${2:-TERM}
	pid=$(eval echo "\$PID_$1")
	kill -"$sig" "$pid"
	stopped "$1" "$pid" "$sig"
	E2E_PIDS=${E2E_PIDS/ $pid/}
	[ $rc -eq 0 ] || fail "$1 exited with $rc after SIG$sig: $(tail -5 "$E2E_TMP/$1.log")"
}

# engine_pool PID: the path of the KV pool of the engine of that pid
# (/dev/shm/pdx-engine-PID-RANDOM: the pid alone is not unique).
engine_pool() {
	local f
	for f in "/dev/shm/pdx-engine-$1-"*; do
		[ -e "$f" ] && echo "$f"
	done
}

# kill9 NAME: SIGKILL; an engine's KV pool, left behind, is removed.
kill9() {
	local p
	p=$(eval echo "\$PID_$1")
	kill -KILL "$p"
	wait "$p" 2>/dev/null
	E2E_PIDS=${E2E_PIDS/ $p/}
	rm -f "/dev/shm/pdx-engine-$p-"*
}

# agent_start SIDE [AGENT_OPTION...]: a pdx-agent ($AGENT, run by the
# words in AGENT_WRAP, e.g. valgrind, if any) for engine SIDE, its engine
# socket at $E2E_TMP/SIDE.engine, its peer link on a free loopback port,
# the options in AGENT_OPTS before the others. UCX stays on this host.
AGENT_WRAP=()
AGENT_OPTS=(--xfer-timeout-ms 5000)
agent_start() {
	local side=$1
	shift
	export UCX_TLS=sm,self UCX_WARN_UNUSED_ENV_VARS=n
	bg_start "agent_$side" "${AGENT_WRAP[@]}" "$AGENT" \
		--engine "ipc://$E2E_TMP/$side.engine" \
		--listen "tcp://127.0.0.1:$(free_port)" "${AGENT_OPTS[@]}" "$@"
	for _ in $(seq 300); do
		[ -S "$E2E_TMP/$side.engine" ] && return 0
		sleep 0.1
	done
	fail "agent $side did not start: $(tail -5 "$E2E_TMP/agent_$side.log")"
}

# agent_ping IPC_PATH: the agent there answers an engine's ping with a pong
agent_ping() {
	$PY - "$1" <<'EOF' || fail "no pong from the agent at $1"
import sys, msgpack, zmq
s = zmq.Context().socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.connect("ipc://" + sys.argv[1])
s.send(msgpack.packb({"op": "ping", "seq": 7}))
sys.exit(not (s.poll(3000) and
	      msgpack.unpackb(s.recv()) == {"op": "pong", "seq": 7}))
EOF
}

# agent_metrics_port SIDE: the port of agent SIDE's /metrics (started
# with --metrics HOST:0), from its log; none fails the test.
agent_metrics_port() {
	local port
	for _ in $(seq 100); do
		port=$(sed -n 's/.*metrics on http:\/\/[^ ]*:\([0-9]*\)\/metrics$/\1/p' \
			"$E2E_TMP/agent_$1.log" | tail -1)
		[ -n "$port" ] && echo "$port" && return 0
		sleep 0.1
	done
	fail "agent $1: no metrics address in its log"
}

# pd_engine_start NAME ROLE [ENGINE_OPTION...]: engine NAME ($ENGINE
# --role ROLE) with a pdx-agent of its own (agent_start: NAME in lower
# case).
pd_engine_start() {
	local name=$1 role=$2 side
	side=$(echo "$1" | tr '[:upper:]' '[:lower:]')
	shift 2
	agent_start "$side"
	named_engine_start "$name" "$ENGINE" --role "$role" \
		--agent "ipc://$E2E_TMP/$side.engine" "$@"
}

# tp_engine_start NAME ROLE SIZE ARGS...: a pdx-engine instance of SIZE
# tensor-parallel ranks, each with its agent (agents SIDE0, SIDE1, ...,
# SIDE the name in lower case; engines NAME, NAME1, ...; HTTP on
# PORT_NAME); waits until it is ready (/health 200).
tp_engine_start() {
	local name=$1 role=$2 size=$3 side r
	shift 3
	side=$(echo "$name" | tr '[:upper:]' '[:lower:]')
	for r in $(seq 0 $((size - 1))); do agent_start "$side$r"; done
	local tp=(--tp-size "$size" --tp-leader "ipc://$E2E_TMP/$side.tp")
	[ "$size" = 1 ] && tp=()
	named_engine_start "$name" "$ENGINE" --role "$role" "${tp[@]}" \
		--agent "ipc://$E2E_TMP/${side}0.engine" "$@"
	for r in $(seq 1 $((size - 1))); do
		bg_start "$name$r" "$ENGINE" --role "$role" "${tp[@]}" \
			--tp-rank "$r" --agent "ipc://$E2E_TMP/$side$r.engine" "$@"
	done
	wait_healthy "$name"
}

# wait_healthy NAME [TRIES]: until the server on PORT_NAME answers /health
# with 200 (ready: an engine's agent registered it), tried every 0.1 s,
# TRIES times (100 by default). Its exit (PID_NAME, where set) or the last
# try fails the test, with its last answer and its log's tail.
wait_healthy() {
	local name=$1 tries=${2:-100} port pid
	port=$(eval echo "\$PORT_$name")
	pid=$(eval echo "\${PID_$name:-}")
	for _ in $(seq "$tries"); do
		[ "$(curl -s -o "$E2E_TMP/$name.health" -w '%{http_code}' \
			"http://127.0.0.1:$port/health")" = 200 ] && return 0
		[ -z "$pid" ] || kill -0 "$pid" 2>/dev/null ||
			fail "$name exited at start: $(tail -5 "$E2E_TMP/$name.log")"
		sleep 0.1
	done
	fail "$name does not answer /health with 200: $(cat "$E2E_TMP/$name.health" 2>/dev/null): $(tail -3 "$E2E_TMP/$name.log")"
}

# stream_start NAME MAX_TOKENS PROMPT: a streamed completion of PROMPT
# from the server on PORT_NAME, in the background (curl's pid in $c, the
# SSE in $E2E_TMP/NAME.sse); returns once its first token came (4 s at
# most, else the test fails).
stream_start() {
	local port
	port=$(eval echo "\$PORT_$1")
	curl -sS -N -d "{\"prompt\": \"$3\", \"max_tokens\": $2, \"stream\": true}" \
		"http://127.0.0.1:$port/v1/completions" >"$E2E_TMP/$1.sse" 2>/dev/null &
	c=$!
	for _ in $(seq 200); do
		grep -q '^data: {' "$E2E_TMP/$1.sse" && return 0
		sleep 0.02
	done
	fail "$1: no first token: $(tail -c 300 "$E2E_TMP/$1.sse")"
}

# Requests to engines by hand, their kv_transfer_params as a proxy would
# write them. agent_peer PORT: the agent peer address of the engine on
# PORT (/v1/pdx/info); xid: a random xfer_id; prompt_body PROMPT MAX
# [KV_JSON]: a completion's body (prompts hold no JSON specials); kv XID
# AGENT prefill|decode [MORE]: kv_transfer_params (MORE: more fields,
# each after a comma); to PORT BODY OUT: POSTs it, body in OUT, status in
# OUT.code (000: no answer).
agent_peer() {
	curl -sS "http://127.0.0.1:$1/v1/pdx/info" |
		sed -n 's/.*"peer_addr": *"\([^"]*\)".*/\1/p'
}
xid() { od -An -tx1 -N16 /dev/urandom | tr -d ' \n'; }
prompt_body() {
	printf '{"prompt": "%s", "max_tokens": %s, "stream": false%s}' "$1" "$2" \
		"${3:+, \"kv_transfer_params\": $3}"
}
kv() { printf '{"xfer_id": "%s", "remote_agent": "%s", "do_remote_%s": true%s}' "$@"; }
to() {
	curl -sS -N -o "$3" -w '%{http_code}' -H 'Content-Type: application/json' \
		--data-binary "$2" "http://127.0.0.1:$1/v1/completions" >"$3.code" ||
		echo 000 >"$3.code"
}

# e NAME: an engine's sample NAME (the model E2E_MODEL, tiny by default).
e() { echo "pdx_engine_$1{model_name=\"${E2E_MODEL:-tiny}\"}"; }

# val PORT NAME: one sample of PORT's /metrics, 0 when absent.
val() {
	curl -sS "http://127.0.0.1:$1/metrics" |
		awk -v n="$2" '$1 == n { v = $2 } END { print v == "" ? 0 : v }'
}

# settle SECONDS PORT/NAME=VALUE...: until each sample has its value
# (PORT/NAME>=VALUE: at least it); after SECONDS says which do not and
# returns 1.
settle() {
	$PY "$E2E_DIR/client.py" settle "$@"
}

# logged NAME PATTERN: until $E2E_TMP/NAME.log has a line matching the
# grep PATTERN (5 s at most; then returns 1).
logged() {
	for _ in $(seq 50); do
		grep -q -- "$2" "$E2E_TMP/$1.log" && return 0
		sleep 0.1
	done
	return 1
}

# text PORT PROMPT MAX_TOKENS: the text of a whole completion through
# PORT; none fails the test.
text() {
	$PY "$E2E_DIR/client.py" text "$@" || fail "no text through $1 for '${2:0:40}...'"
}

# blocks_free PORT...: until none of the engines on these ports holds a
# KV block (10 s at most).
blocks_free() {
	local p checks=()
	for p in "$@"; do checks+=("$p/$(e kv_blocks_used)=0"); done
	settle 10 "${checks[@]}" || fail "KV blocks still held on port(s) $*"
}

# instance NAME: the labels by which a proxy's metrics name the instance
# on PORT_NAME: prefill when NAME starts with P, else decode.
instance() {
	local role=decode
	case $1 in P*) role=prefill ;; esac
	echo "role=\"$role\",instance=\"http://127.0.0.1:$(eval echo "\$PORT_$1")\""
}

# engine_idle NAME...: settle's checks that the engines on PORT_NAME hold
# no KV block and run or queue no request.
engine_idle() {
	local n p
	for n in "$@"; do
		p=$(eval echo "\$PORT_$n")
		echo "$p/$(e kv_blocks_used)=0 $p/$(e num_requests_running)=0 $p/$(e num_requests_waiting)=0"
	done
}

# proxy_idle PROXY INSTANCE...: settle's checks that the proxy on
# PORT_PROXY has no request in flight, none on these instances.
proxy_idle() {
	local x n
	x=$(eval echo "\$PORT_$1")
	shift
	echo "$x/pdx_proxy_requests_inflight=0"
	for n in "$@"; do
		echo "$x/pdx_proxy_instance_inflight{$(instance "$n")}=0"
	done
}
