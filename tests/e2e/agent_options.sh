#!/usr/bin/env bash
# pdx-agent's address options: a value ZeroMQ would take and bind
# somewhere else (a port past 65535, a negative one, none, a bare IPv6
# host; a wildcard host to advertise, given or implied by --listen
# 0.0.0.0 without --advertise: peers connected to themselves; an
# interface name without --advertise, or as --advertise: peers cannot
# connect to it) is refused
# at start, exit 2 with why; a good one is listened on
# exactly, and advertised as given; port 0 is the kernel's pick, and the
# agent advertises the port it got. A second agent given a running one's
# engine path or peer port fails saying why, and the first stays
# reachable; a stale socket file at the path is replaced, a file that is
# no socket is refused and kept; the socket is 0600 whatever the umask,
# and removed at exit only while it is the agent's own. A --notify
# address where no ZeroMQ collector listens is said once, and one where
# nothing listens at all within 3 s. GPU staging a
# dead agent left in /dev/shm is removed at start, a live one's is not.
# With /dev/shm full the agent's refusal to start says so. The soft
# descriptor limit is raised, a low hard one said, and accepts that fail
# for want of a descriptor are said.
#   agent_options.sh PDX_AGENT
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
AGENT=$1
sock="ipc://$E2E_TMP/a.engine"

# agent_ready NAME: waits (5 s at most) for agent NAME's "ready:" line
agent_ready() {
	for _ in $(seq 50); do
		grep -q "ready:" "$E2E_TMP/agent_$1.log" && return 0
		sleep 0.1
	done
}

for bad in "--listen tcp://127.0.0.1:99999" "--listen tcp://127.0.0.1:-5" \
	"--listen tcp://127.0.0.1" \
	"--listen tcp://:5555" "--listen tcp://::1:5555" \
	"--listen tcp://[::1]:5555" "--listen tcp://127.0.0.1:00" \
	"--advertise tcp://nohost:abc" "--advertise tcp://*:5555" \
	"--advertise tcp://0.0.0.0:5555" "--listen tcp://0.0.0.0:5555" \
	"--listen tcp://*:0" "--listen tcp://lo:5555" \
	"--advertise tcp://lo:5555" \
	"--notify tcp://127.0.0.1:65536" \
	"--xfer-timeout-ms 99999999999" "--heartbeat-ms 0" \
	"--metrics 127.0.0.1:99999"; do
	# shellcheck disable=SC2086 # the option and its value
	"$AGENT" --engine "$sock" --listen "tcp://127.0.0.1:$(free_port)" $bad \
		2>"$E2E_TMP/bad.log"
	rc=$?
	[ $rc -eq 2 ] || fail "$bad: exit $rc, want 2: $(cat "$E2E_TMP/bad.log")"
	grep -q -- "${bad%% *}" "$E2E_TMP/bad.log" ||
		fail "$bad: no reason naming the option: $(cat "$E2E_TMP/bad.log")"
done

# a host name to bind: ZeroMQ takes it for an interface ("No such
# device"); the agent says to give the address
"$AGENT" --engine "$sock" --listen "tcp://localhost:$(free_port)" \
	2>"$E2E_TMP/bad.log" && fail "--listen tcp://localhost:PORT: started"
grep -q "not a host name" "$E2E_TMP/bad.log" ||
	fail "--listen tcp://localhost:PORT: $(cat "$E2E_TMP/bad.log")"

# /dev/shm full (a mount namespace of its own, as root): UCX cannot
# start its shared-memory transports, and the agent says where the room
# is short (it said only "i/o failure")
if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
	timeout 20 unshare -m sh -c 'mount -t tmpfs -o size=8m tmpfs /dev/shm &&
		dd if=/dev/zero of=/dev/shm/fill bs=1M count=8 2>/dev/null;
		exec "$0" --engine "$1" --listen "tcp://127.0.0.1:$2"' \
		"$AGENT" "$sock" "$(free_port)" 2>"$E2E_TMP/shm.log" &&
		fail "an agent with /dev/shm full started"
	grep -q "ucx init failed: .*/dev/shm has 0 MiB free of 8 MiB" "$E2E_TMP/shm.log" ||
		fail "/dev/shm full: $(tail -2 "$E2E_TMP/shm.log")"
fi

port=$(free_port)
agent_start a --listen "tcp://127.0.0.1:$port"
agent_ready a
grep -q "peer link tcp://127.0.0.1:$port (advertised tcp://127.0.0.1:$port)" \
	"$E2E_TMP/agent_a.log" || fail "ready line: $(cat "$E2E_TMP/agent_a.log")"
# UCX_TLS=sm,self: no TCP setting of ours for UCX to call invalid
! grep -q "CONN_NB" "$E2E_TMP/agent_a.log" ||
	fail "UCX warns at start: $(grep "CONN_NB" "$E2E_TMP/agent_a.log")"
ss -ltn "sport = :$port" | grep -q ":$port" || fail "nothing listens on $port"
named_stop agent_a
rm -f "$E2E_TMP/b.engine"
# port 0 on an interface's name: the address bound is advertised (an
# interface name with a port is refused without --advertise, above)
agent_start b --listen "tcp://lo:0"
agent_ready b
got=$(sed -n 's/.*(advertised tcp:\/\/127\.0\.0\.1:\([0-9]*\))$/\1/p' "$E2E_TMP/agent_b.log")
[ -n "$got" ] && [ "$got" != 0 ] || fail "port 0 advertised: $(cat "$E2E_TMP/agent_b.log")"
ss -ltn "sport = :$got" | grep -q ":$got" || fail "nothing listens on $got, advertised"
named_stop agent_b

# file descriptors: the soft limit is raised to the hard one (the agent
# kept a shell's soft limit, where the engine and proxy raised theirs),
# a hard limit too low for its peers is said at start, and a peer's
# connection not accepted for want of a descriptor is said (ZeroMQ
# dropped it without a word: the peer's hello went unanswered)
port=$(free_port)
hard=$(ulimit -H -n) # only lowered here: raising it takes privilege
{ [ "$hard" = unlimited ] || [ "$hard" -gt 2000 ]; } && hard=2000
bg_start agent_f bash -c 'ulimit -S -n 100 && ulimit -H -n "$0" && exec "$@"' \
	"$hard" "$AGENT" --engine "ipc://$E2E_TMP/f.engine" --listen "tcp://127.0.0.1:$port"
agent_ready f
soft=$(awk '/Max open files/ {print $4}' "/proc/$PID_agent_f/limits")
[ "$soft" = "$hard" ] || fail "soft limit $soft, want the hard one, $hard"
[ "$hard" -lt 1600 ] || ! grep -q "peers fit" "$E2E_TMP/agent_f.log" ||
	fail "a limit that holds every peer said: $(grep 'peers fit' "$E2E_TMP/agent_f.log")"
named_stop agent_f
bg_start agent_g bash -c 'ulimit -n 128 && exec "$@"' \
	_ "$AGENT" --engine "ipc://$E2E_TMP/g.engine" --listen "tcp://127.0.0.1:$port"
agent_ready g
grep -q "the limit is 128 (ulimit -n, raised to its hard limit): about 21 peers fit of the 512" \
	"$E2E_TMP/agent_g.log" || fail "a low limit not said: $(head -3 "$E2E_TMP/agent_g.log")"
$PY - "$port" <<'PYEOF' || fail "connections to agent g"
import socket, sys, time
held = [socket.create_connection(("127.0.0.1", int(sys.argv[1])))
        for _ in range(150)]
time.sleep(1)
for s in held:
    s.close()
PYEOF
grep -q "a peer's connection not accepted: out of file descriptors (the limit is 128" \
	"$E2E_TMP/agent_g.log" || fail "accepts failing not said: $(tail -3 "$E2E_TMP/agent_g.log")"
named_stop agent_g

# ZeroMQ's ipc:// bind replaces the file at the path: a second agent on
# the same path once took the first one's engines, and unlinked the path
# when its own peer port then failed.
port=$(free_port)
agent_start c --listen "tcp://127.0.0.1:$port"
for clash in "ipc://$E2E_TMP/c.engine tcp://127.0.0.1:$(free_port) another process serves it" \
	"ipc://$E2E_TMP/d.engine tcp://127.0.0.1:$port Address already in use (another process listens there, another deployment.s perhaps: pick another port)"; do
	read -r eng lis why <<<"$clash"
	# bounded: the old agent took a running one's path and ran on
	timeout 10 "$AGENT" --engine "$eng" --listen "$lis" 2>"$E2E_TMP/clash.log"
	rc=$?
	[ $rc -ne 0 ] || fail "a second agent on $eng, $lis started"
	grep -q "cannot bind .*: $why" "$E2E_TMP/clash.log" ||
		fail "$eng, $lis: want \"$why\": $(cat "$E2E_TMP/clash.log")"
	[ -S "$E2E_TMP/c.engine" ] || fail "$eng, $lis: the first agent's path is gone"
	agent_ping "$E2E_TMP/c.engine"
done
[ ! -e "$E2E_TMP/d.engine" ] || fail "a failed agent left its own path behind"
named_stop agent_c

# a file that is no socket (a typo in --engine, another team's config
# file) is refused and kept: ZeroMQ's bind unlinked it, and the agent ran
echo "PDX_ROLE=decode" >"$E2E_TMP/d0.env"
timeout 10 "$AGENT" --engine "ipc://$E2E_TMP/d0.env" \
	--listen "tcp://127.0.0.1:$(free_port)" 2>"$E2E_TMP/file.log"
rc=$?
[ $rc -eq 1 ] || fail "--engine at a regular file: exit $rc, want 1: $(cat "$E2E_TMP/file.log")"
grep -q "cannot bind ipc://$E2E_TMP/d0.env: .* is a regular file, not a socket" \
	"$E2E_TMP/file.log" || fail "--engine at a regular file: $(cat "$E2E_TMP/file.log")"
[ "$(cat "$E2E_TMP/d0.env")" = "PDX_ROLE=decode" ] || fail "the file at --engine is gone"

# the engine link is the owner's alone whatever the umask (it was 0777
# under umask 0: any local user could register as the agent's engine)
old_umask=$(umask)
umask 000
agent_start m
umask "$old_umask"
mode=$(stat -c %a "$E2E_TMP/m.engine")
[ "$mode" = 600 ] || fail "engine link socket mode $mode under umask 000, want 600"

# an agent removes its socket file at exit only while it is its own: here
# it was removed and another agent serves the path since (it unlinked
# the other's, whose engines then could not reach it)
rm "$E2E_TMP/m.engine"
bg_start agent_n "$AGENT" --engine "ipc://$E2E_TMP/m.engine" \
	--listen "tcp://127.0.0.1:$(free_port)"
agent_ready n
named_stop agent_m
[ -S "$E2E_TMP/m.engine" ] || fail "the first agent's exit removed the second one's socket file"
agent_ping "$E2E_TMP/m.engine"
named_stop agent_n

# a socket file nobody listens on (an agent killed with -9) is replaced
$PY -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' \
	"$E2E_TMP/e.engine"
agent_start e
agent_ready e
agent_ping "$E2E_TMP/e.engine"
named_stop agent_e

# --notify at an HTTP port (not the proxy's --notify-bind): the agent
# says so once (it said nothing, and dropped every notification)
hp=$(free_port)
bg_start http $PY -m http.server "$hp" --bind 127.0.0.1
for _ in $(seq 50); do ss -ltn "sport = :$hp" | grep -q ":$hp" && break; sleep 0.1; done
agent_start f --notify "tcp://127.0.0.1:$hp"
for _ in $(seq 80); do # its handshake bound: 3 s
	grep -q "no ZeroMQ collector" "$E2E_TMP/agent_f.log" && break
	sleep 0.1
done
grep -q -- "--notify tcp://127.0.0.1:$hp: what listens there is no ZeroMQ collector" \
	"$E2E_TMP/agent_f.log" || fail "--notify at an HTTP port: $(tail -3 "$E2E_TMP/agent_f.log")"
[ "$(grep -c "no ZeroMQ collector" "$E2E_TMP/agent_f.log")" = 1 ] ||
	fail "said more than once: $(grep -c "no ZeroMQ collector" "$E2E_TMP/agent_f.log")"
! grep -q "no collector reached" "$E2E_TMP/agent_f.log" ||
	fail "an HTTP port at --notify also said as nobody there"
named_stop agent_f
kill "$PID_http"

# --notify where nothing listens (a loopback address copied to another
# host, a name only some hosts resolve): said once within 3 s (it said
# nothing, and the proxy counted each transfer until --transfer-timeout)
agent_start g --notify "tcp://127.0.0.1:$(free_port)"
logged agent_g "no collector reached in 3000 ms (nothing listens there" ||
	fail "--notify where nothing listens: $(tail -3 "$E2E_TMP/agent_g.log")"
named_stop agent_g

# GPU staging left in /dev/shm by an agent that died (kill -9: 256 MiB
# each) is removed by the next agent's start; one a live agent holds
# (its lock) is not. Named as agents name theirs (agent/staged.c).
# As root, in a /dev/shm of the test's own (a mount namespace, kept by
# the holder of the live one's lock; the agent entered into it): any
# agent that starts as root sweeps, and with the host's /dev/shm shared,
# those of tests run beside this one (another suite, another checkout)
# swept the dead one first, three tries in a row under load, and the
# agent here had nothing to say. Elsewhere, the host's /dev/shm, a dead
# one another swept first made again (3 tries).
ok=0
if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null && command -v nsenter >/dev/null; then
	# (the holder: the sleep itself (exec), holding the lock on fd 8)
	unshare -m sh -c 'mount -t tmpfs -o size=256m tmpfs /dev/shm &&
		head -c 4096 /dev/zero >/dev/shm/pdx-staging-1-dead &&
		exec 8<>/dev/shm/pdx-staging-1-live && flock 8 && exec sleep 60' \
		</dev/null >/dev/null 2>&1 &
	holder=$!
	ns() { nsenter -t "$holder" -m "$@"; }
	for _ in $(seq 50); do
		ns test -e /dev/shm/pdx-staging-1-live 2>/dev/null &&
			! ns flock -n /dev/shm/pdx-staging-1-live true 2>/dev/null && break
		sleep 0.1
	done
	ns test -e /dev/shm/pdx-staging-1-dead || fail "no /dev/shm of the test's own"
	sleep 1.2 # older than the sweep's bound
	AGENT_WRAP=(nsenter -t "$holder" -m --wd="$PWD") # (AGENT may be relative)
	agent_start g
	AGENT_WRAP=()
	agent_ready g
	named_stop agent_g
	ok=1
	! ns test -e /dev/shm/pdx-staging-1-dead ||
		{ ok=0; echo "FAIL: a dead agent's staging was not removed"; }
	grep -q "removed 1 staging buffer(s) left in /dev/shm" "$E2E_TMP/agent_g.log" ||
		{ ok=0; echo "FAIL: the sweep is not logged: $(tail -3 "$E2E_TMP/agent_g.log")"; }
	ns test -e /dev/shm/pdx-staging-1-live ||
		{ ok=0; echo "FAIL: a live agent's staging was removed"; }
	kill "$holder"
else
	dead=/dev/shm/pdx-staging-$$-dead live=/dev/shm/pdx-staging-$$-live
	head -c 4096 /dev/zero >"$live" || fail "cannot write in /dev/shm"
	# the holder is the sleep itself (exec), holding the lock on fd 8
	(exec 8<>"$live" && flock 8 && exec sleep 60) </dev/null >/dev/null 2>&1 &
	holder=$!
	for _ in 1 2 3; do
		head -c 4096 /dev/zero >"$dead" || fail "cannot write in /dev/shm"
		sleep 1.2 # older than the sweep's bound
		[ -e "$dead" ] || continue
		agent_start g
		agent_ready g
		named_stop agent_g
		[ ! -e "$dead" ] || { echo "FAIL: a dead agent's staging was not removed"; break; }
		grep -q "removed [1-9][0-9]* staging buffer(s) left in /dev/shm" "$E2E_TMP/agent_g.log" &&
			{ ok=1; break; }
	done
	[ $ok = 1 ] || echo "FAIL: the sweep is not logged: $(tail -3 "$E2E_TMP/agent_g.log")"
	[ -e "$live" ] || { ok=0; echo "FAIL: a live agent's staging was removed"; }
	kill "$holder"
	rm -f "$dead" "$live"
fi
[ $ok = 1 ] || fail "staging sweep"

# Stopped as soon as its engine link is there (what launchers wait for),
# an agent stops cleanly, exit 0: its signal handlers came only after it
# bound the link, and a SIGTERM in between killed it (4 in 30 here).
for i in $(seq 1 30); do
	d="$E2E_TMP/early$i"
	mkdir "$d"
	UCX_TLS=sm,self "$AGENT" --engine "ipc://$d/e" --listen tcp://127.0.0.1:0 \
		2>"$d/log" &
	pid=$!
	for _ in $(seq 1 5000); do [ -e "$d/e" ] && break; sleep 0.001; done
	kill -TERM "$pid"
	rc=0
	wait "$pid" || rc=$?
	[ $rc -eq 0 ] || fail "SIGTERM once the engine link was bound: exit $rc (try $i): $(tail -2 "$d/log")"
done
echo ok
