# Shared by the e2e shell tests: start pdx-engine on a free port, talk to
# it with curl, check JSON with python3, stop it and require a clean exit
# (under ASan that includes no leaks).
#   . lib.sh; engine_start BIN [options...]; ...; engine_stop
set -u

E2E_TMP=$(mktemp -d)
ENGINE_PID=
PORT=

fail() {
	echo "FAIL: $*" >&2
	[ -f "$E2E_TMP/engine.log" ] && tail -20 "$E2E_TMP/engine.log" >&2
	exit 1
}

# Processes started by bg_start, killed at exit if still running.
E2E_PIDS=""

cleanup() {
	[ -n "$ENGINE_PID" ] && kill "$ENGINE_PID" 2>/dev/null
	[ -n "$ENGINE_PID" ] && wait "$ENGINE_PID" 2>/dev/null
	for p in $E2E_PIDS; do kill "$p" 2>/dev/null; done
	for p in $E2E_PIDS; do wait "$p" 2>/dev/null; done
	rm -rf "$E2E_TMP"
}
trap cleanup EXIT

# Starts the engine with --port 0 and reads its port from the log.
engine_start() {
	"$@" --port 0 2>"$E2E_TMP/engine.log" &
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

# SIGTERM, then the exit status must be 0.
engine_stop() {
	local rc
	kill -TERM "$ENGINE_PID"
	wait "$ENGINE_PID"
	rc=$?
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
	python3 -c "$1" || fail "check failed: $2"
}

# A TCP port nobody listens on now.
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# bg_start NAME CMD...: runs CMD in the background, stderr in
# $E2E_TMP/NAME.log; its pid in PID_NAME.
bg_start() {
	local name=$1
	shift
	"$@" 2>"$E2E_TMP/$name.log" >/dev/null &
	eval "PID_$name=$!"
	E2E_PIDS="$E2E_PIDS $!"
}

# named_engine_start NAME BIN [options...]: like engine_start for one of
# several engines; its port in PORT_NAME.
named_engine_start() {
	local name=$1 pid port
	shift
	bg_start "$name" "$@" --port 0
	pid=$(eval echo "\$PID_$name")
	for _ in $(seq 100); do
		port=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9]*\)$/\1/p' \
			"$E2E_TMP/$name.log")
		if [ -n "$port" ]; then
			eval "PORT_$name=$port"
			return 0
		fi
		kill -0 "$pid" 2>/dev/null ||
			fail "$name exited at start: $(tail -5 "$E2E_TMP/$name.log")"
		sleep 0.1
	done
	fail "$name did not start listening"
}

# named_stop NAME: SIGTERM, then the exit status must be 0.
named_stop() {
	local pid rc
	pid=$(eval echo "\$PID_$1")
	kill -TERM "$pid"
	wait "$pid"
	rc=$?
	[ $rc -eq 0 ] || fail "$1 exited with $rc after SIGTERM: $(tail -5 "$E2E_TMP/$1.log")"
}

# agent_start SIDE [AGENT_OPTION...]: a pdx-agent ($AGENT) for engine
# SIDE, its engine socket at $E2E_TMP/SIDE.engine, its peer link on a
# free loopback port.
agent_start() {
	local side=$1
	shift
	bg_start "agent_$side" "$AGENT" --engine "ipc://$E2E_TMP/$side.engine" \
		--listen "tcp://127.0.0.1:$(free_port)" --xfer-timeout-ms 5000 "$@"
	for _ in $(seq 100); do
		[ -S "$E2E_TMP/$side.engine" ] && return 0
		sleep 0.1
	done
	fail "agent $side did not start: $(tail -3 "$E2E_TMP/agent_$side.log")"
}
