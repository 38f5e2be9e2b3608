#!/usr/bin/env bash
# Two deployments on one host, as two teams run them (docs/deployment.md,
# "Two deployments on one host"), one of them as another Unix user:
#  * engines that are each PID 1 of their own PID namespace, sharing
#    /dev/shm (containers run with --ipc=host): each keeps its own KV pool,
#    and an agent that registers its engine again maps that engine's pool.
#    The pools were all /pdx-engine-1: the second engine unlinked the
#    first one's live pool and took the name (the first's agent then
#    mapped the other's KV), or, as another user, could not start;
#  * another user's agent given the path of a running agent's engine link,
#    in a directory both may write, is refused and the first agent keeps
#    its socket (it took it); that user can neither connect to the socket
#    nor open the pool;
#  * a tensor-parallel leader or a proxy's --notify-bind given an ipc://
#    path another deployment serves is refused, not taken; an engine or a
#    proxy given another's HTTP port says why and names --port;
#  * a pool still being made (strace delays it) when another
#    deployment's engine starts is not swept as a dead one;
#  * one deployment killed with -9 and started again: its dead pool is
#    swept, the other deployments' live pools are not.
# Needs root (PID namespaces, user nobody); else skipped (77).
#   two_deployments.sh PDX_AGENT PDX_ENGINE PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
AGENT=$1 ENGINE=$2 PROXY=$3
OTHER=(setpriv --reuid=65534 --regid=65534 --clear-groups) # user nobody

[ "$(id -u)" = 0 ] || { echo "needs root (PID namespaces, a second user): skipped"; exit 77; }
command -v unshare >/dev/null && command -v setpriv >/dev/null ||
	{ echo "needs unshare and setpriv: skipped"; exit 77; }
unshare --pid --fork true 2>/dev/null || { echo "no PID namespaces here: skipped"; exit 77; }
chmod 0711 "$E2E_TMP" # nobody may pass through to the shared directory
# nobody runs copies (with libpdx beside them, as their RUNPATH
# $ORIGIN/../lib finds it): the build tree may lie where only root may
# enter, a CI clone in a 0700 temporary directory
NB=$E2E_TMP/nobody
mkdir -p "$NB/engine" "$NB/agent" "$NB/lib"
cp "$ENGINE" "$NB/engine/" && cp "$AGENT" "$NB/agent/" &&
	cp -L "$(dirname "$ENGINE")/../lib/libpdx.so.0" "$NB/lib/" ||
	fail "cannot copy the programs for user nobody"
chmod -R a+rX "$NB"
NB_ENGINE=$NB/engine/$(basename "$ENGINE") NB_AGENT=$NB/agent/$(basename "$AGENT")
"${OTHER[@]}" "$NB_ENGINE" --version >/dev/null 2>&1 ||
	{ echo "user nobody cannot run $NB_ENGINE: skipped"; exit 77; }
SHARED=$E2E_TMP/shared # both teams write here; not sticky
mkdir "$SHARED" && chmod 0777 "$SHARED"
export UCX_TLS=sm,self UCX_WARN_UNUSED_ENV_VARS=n
IN_NS=(unshare --pid --fork --kill-child) # the command is PID 1 there

# child PID: the process unshare forked (the engine, PID 1 inside).
child() {
	awk '{ print $1 }' "/proc/$1/task/$1/children"
}

# unshare --fork ignores SIGTERM (util-linux 2.38): lib.sh's cleanup,
# which sends it and waits, hung on a namespace's unshare until meson's
# timeout whenever a check failed (a TIMEOUT, not the failure). At exit
# the process inside each is sent it first.
ns_cleanup() {
	local p c
	for p in $E2E_PIDS; do
		c=$(child "$p" 2>/dev/null)
		[ -n "$c" ] && kill -TERM $c 2>/dev/null
	done
	cleanup
}
trap ns_cleanup EXIT

# ns_stop NAME: SIGTERM to the engine inside (unshare passes its exit
# status on), which must be 0.
ns_stop() {
	local pid rc
	pid=$(eval echo "\$PID_$1")
	kill -TERM "$(child "$pid")"
	wait "$pid"
	rc=$?
	[ $rc -eq 0 ] || fail "$1 exited with $rc after SIGTERM: $(tail -5 "$E2E_TMP/$1.log")"
}

# pool_ino PID: the inode of the KV pool PID maps; a pool whose name was
# unlinked shows as "(deleted)", which fails the test.
pool_ino() {
	local m
	m=$(grep '/dev/shm/pdx-engine-' "/proc/$1/maps" | head -1)
	[ -n "$m" ] || fail "pid $1 maps no KV pool"
	case $m in *"(deleted)"*) fail "pid $1's KV pool was unlinked: $m" ;; esac
	echo "$m" | awk '{ print $5 }'
}

# pool_path INO: the pool in /dev/shm of that inode; none: nothing.
pool_path() {
	local f
	for f in /dev/shm/pdx-engine-*; do
		[ "$(stat -c %i "$f" 2>/dev/null)" = "$1" ] && echo "$f"
	done
}

# --- KV pools: engines that are each PID 1, one /dev/shm
agent_start a
named_engine_start A "${IN_NS[@]}" "$ENGINE" --model tiny --kv-blocks 64 \
	--role prefill --agent "ipc://$E2E_TMP/a.engine"
wait_healthy A
ea=$(child "$PID_A")
ino_a=$(pool_ino "$ea")
named_engine_start C "${IN_NS[@]}" "${OTHER[@]}" "$NB_ENGINE" --model tiny --kv-blocks 64
named_engine_start B "${IN_NS[@]}" "$ENGINE" --model tiny --kv-blocks 64
[ "$(pool_ino "$ea")" = "$ino_a" ] || fail "engine A's pool changed"
ino_b=$(pool_ino "$(child "$PID_B")")
ino_c=$(pool_ino "$(child "$PID_C")")
[ "$ino_a" != "$ino_b" ] && [ "$ino_a" != "$ino_c" ] && [ "$ino_b" != "$ino_c" ] ||
	fail "two engines share a pool: $ino_a $ino_b $ino_c"
[ "$(stat -c %U "$(pool_path "$ino_c")")" = nobody ] || fail "engine C's pool is not nobody's"
# A's agent goes and comes back: A registers again and it maps A's pool
named_stop agent_a
agent_start a
wait_healthy A
ino=$(pool_ino "$PID_agent_a")
[ "$ino" = "$ino_a" ] || fail "A's agent maps pool $ino after A registered again, A's is $ino_a"
# B stops cleanly: A's pool keeps its name (B's exit unlinked it)
ns_stop B
[ "$(pool_ino "$ea")" = "$ino_a" ] || fail "engine A's pool changed when B stopped"

# --- another user against this one's sockets and pool
bg_start agent_s "$AGENT" --engine "ipc://$SHARED/p.sock" \
	--listen "tcp://127.0.0.1:$(free_port)"
for _ in $(seq 100); do [ -S "$SHARED/p.sock" ] && break; sleep 0.1; done
"${OTHER[@]}" timeout 10 "$NB_AGENT" --engine "ipc://$SHARED/p.sock" \
	--listen "tcp://127.0.0.1:$(free_port)" 2>"$E2E_TMP/other.log"
rc=$?
[ $rc = 1 ] || fail "nobody's agent at root's engine path: exit $rc, want 1: $(cat "$E2E_TMP/other.log")"
grep -q "another user's process serves it or left it" "$E2E_TMP/other.log" ||
	fail "nobody's agent at root's engine path: $(cat "$E2E_TMP/other.log")"
[ "$(stat -c %U "$SHARED/p.sock")" = root ] || fail "root's agent lost its socket file"
agent_ping "$SHARED/p.sock"
"${OTHER[@]}" $PY - "$SHARED/p.sock" "$(pool_path "$ino_a")" <<'EOF' || fail "nobody reached root's engine link or pool"
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
    sys.exit("connected to " + sys.argv[1])
except PermissionError:
    pass
try:
    open(sys.argv[2], "rb")
    sys.exit("opened " + sys.argv[2])
except PermissionError:
    pass
EOF
named_stop agent_s

# --- a TP leader's and a proxy's ipc:// paths, given twice
agent_start t1
agent_start t2
tp=(--model tiny --kv-blocks 64 --role prefill --tp-size 2 --tp-rank 0
	--tp-leader "ipc://$E2E_TMP/lead.tp")
named_engine_start T1 "$ENGINE" "${tp[@]}" --agent "ipc://$E2E_TMP/t1.engine"
timeout 20 "$ENGINE" "${tp[@]}" --agent "ipc://$E2E_TMP/t2.engine" --port 0 \
	2>"$E2E_TMP/t2.log"
rc=$?
[ $rc = 1 ] || fail "a second TP leader at one path: exit $rc, want 1: $(tail -3 "$E2E_TMP/t2.log")"
grep -q "cannot bind ipc://$E2E_TMP/lead.tp: another process serves it" "$E2E_TMP/t2.log" ||
	fail "a second TP leader at one path: $(tail -3 "$E2E_TMP/t2.log")"
[ -S "$E2E_TMP/lead.tp" ] || fail "the first TP leader's socket is gone"
bg_start X1 "$PROXY" --port 0 --decode 127.0.0.1:1 --notify-bind "ipc://$E2E_TMP/n.sock"
for _ in $(seq 100); do [ -S "$E2E_TMP/n.sock" ] && break; sleep 0.1; done
timeout 10 "$PROXY" --port 0 --decode 127.0.0.1:1 --notify-bind "ipc://$E2E_TMP/n.sock" \
	2>"$E2E_TMP/x2.log"
rc=$?
[ $rc = 1 ] || fail "a second proxy at one --notify-bind: exit $rc, want 1: $(cat "$E2E_TMP/x2.log")"
grep -q "another process serves it" "$E2E_TMP/x2.log" ||
	fail "a second proxy at one --notify-bind: $(cat "$E2E_TMP/x2.log")"
# the same defaults' ports: refused saying why and which option moves it
xport=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9]*\)$/\1/p' "$E2E_TMP/X1.log")
for second in "$PROXY --decode 127.0.0.1:1 --port $xport" \
	"$ENGINE --model tiny --kv-blocks 64 --port $PORT_T1"; do
	# shellcheck disable=SC2086 # the program and its options
	timeout 10 $second 2>"$E2E_TMP/port.log"
	rc=$?
	[ $rc = 1 ] || fail "$second: exit $rc, want 1: $(cat "$E2E_TMP/port.log")"
	grep -q "cannot listen on 127.0.0.1:[0-9]*: Address already in use (.*pick another --port)" \
		"$E2E_TMP/port.log" || fail "$second: $(cat "$E2E_TMP/port.log")"
done
named_stop X1
named_stop T1
[ ! -e "$E2E_TMP/lead.tp" ] || fail "the TP leader left its socket file at exit"
named_stop agent_t1
named_stop agent_t2

# --- a pool being made (a big one takes seconds to pre-fault; strace
# stretches it to 7 s, far past the sweep's 1 s) while another deployment's engine
# starts and sweeps: it is alive from its first moment (its lock came
# after the pre-fault, and the sweep unlinked it)
if strace -f -o /dev/null true 2>/dev/null; then
	# LeakSanitizer cannot run under ptrace (an ASan build's engine
	# would abort at its exit)
	bg_start S env ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
		strace -f -o /dev/null -e trace=ftruncate \
		-e inject=ftruncate:delay_exit=7000000 "$ENGINE" --model tiny --kv-blocks 64 --port 0
	sleep 6
	named_engine_start S2 "$ENGINE" --model tiny --kv-blocks 64
	for _ in $(seq 50); do grep -q "listening on" "$E2E_TMP/S.log" && break; sleep 0.1; done
	es=$(child "$PID_S")
	pool_ino "$es" >/dev/null
	kill -TERM "$es"
	wait "$PID_S" || fail "S exited with $? after SIGTERM: $(tail -3 "$E2E_TMP/S.log")"
	named_stop S2
else
	echo "no strace here: the pool being made is not checked"
fi

# --- deployment A killed with -9 and started again: its dead pool is
# swept (older than 1 s), C's live one (another user's) is not
kill -KILL "$PID_agent_a" "$(child "$PID_A")"
wait "$PID_agent_a" "$PID_A" 2>/dev/null
E2E_PIDS=${E2E_PIDS/ $PID_agent_a/}
E2E_PIDS=${E2E_PIDS/ $PID_A/}
sleep 2 # past the sweep's 1 s (whole seconds of its ctime)
agent_start a # the log says "--- start" again
named_engine_start A2 "${IN_NS[@]}" "$ENGINE" --model tiny --kv-blocks 64 \
	--role prefill --agent "ipc://$E2E_TMP/a.engine"
wait_healthy A2
# swept: by A2 (it says so), or by any other engine that started on this
# host since the kill (another deployment's, another test's: each sweeps
# every dead pool; A2 then finds none and says nothing)
[ -z "$(pool_path "$ino_a")" ] ||
	fail "A's dead pool was not swept: $(tail -3 "$E2E_TMP/A2.log")"
[ "$(pool_ino "$(child "$PID_C")")" = "$ino_c" ] || fail "C's pool changed"
ns_stop A2
ns_stop C
named_stop agent_a
echo ok
