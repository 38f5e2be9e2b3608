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

cleanup() {
	[ -n "$ENGINE_PID" ] && kill "$ENGINE_PID" 2>/dev/null
	[ -n "$ENGINE_PID" ] && wait "$ENGINE_PID" 2>/dev/null
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
