#!/usr/bin/env bash
# pdx-agent's address options: a value ZeroMQ would take and bind
# somewhere else (a port past 65535, a negative one, none, a bare IPv6
# host) is refused at start, exit 2 with why; a good one is listened on
# exactly, and advertised as given; port 0 is the kernel's pick, and the
# agent advertises the port it got.
#   agent_options.sh PDX_AGENT
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
AGENT=$1
sock="ipc://$E2E_TMP/a.engine"

for bad in "--listen tcp://127.0.0.1:99999" "--listen tcp://127.0.0.1:-5" \
	"--listen tcp://127.0.0.1" \
	"--listen tcp://:5555" "--listen tcp://::1:5555" \
	"--listen tcp://[::1]:5555" "--listen tcp://127.0.0.1:00" \
	"--advertise tcp://nohost:abc" "--advertise tcp://*:5555" \
	"--notify tcp://127.0.0.1:65536"; do
	# shellcheck disable=SC2086 # the option and its value
	"$AGENT" --engine "$sock" --listen "tcp://127.0.0.1:$(free_port)" $bad \
		2>"$E2E_TMP/bad.log"
	rc=$?
	[ $rc -eq 2 ] || fail "$bad: exit $rc, want 2: $(cat "$E2E_TMP/bad.log")"
	grep -q -- "${bad%% *}" "$E2E_TMP/bad.log" ||
		fail "$bad: no reason naming the option: $(cat "$E2E_TMP/bad.log")"
done

port=$(free_port)
agent_start a --listen "tcp://127.0.0.1:$port"
for _ in $(seq 50); do
	grep -q "ready:" "$E2E_TMP/agent_a.log" && break
	sleep 0.1
done
grep -q "peer link tcp://127.0.0.1:$port (advertised tcp://127.0.0.1:$port)" \
	"$E2E_TMP/agent_a.log" || fail "ready line: $(cat "$E2E_TMP/agent_a.log")"
ss -ltn "sport = :$port" | grep -q ":$port" || fail "nothing listens on $port"
named_stop agent_a
rm -f "$E2E_TMP/b.engine"
agent_start b --listen "tcp://127.0.0.1:0"
for _ in $(seq 50); do
	grep -q "ready:" "$E2E_TMP/agent_b.log" && break
	sleep 0.1
done
got=$(sed -n 's/.*(advertised tcp:\/\/127\.0\.0\.1:\([0-9]*\))$/\1/p' "$E2E_TMP/agent_b.log")
[ -n "$got" ] && [ "$got" != 0 ] || fail "port 0 advertised: $(cat "$E2E_TMP/agent_b.log")"
ss -ltn "sport = :$got" | grep -q ":$got" || fail "nothing listens on $got, advertised"
named_stop agent_b
echo ok
