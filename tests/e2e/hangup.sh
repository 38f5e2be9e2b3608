#!/usr/bin/env bash
# A closed terminal or ssh session (SIGHUP) stops each program as SIGTERM
# does, where SIGHUP's default action killed pdx-engine and pdx-proxy on
# the spot (exit 129): the proxy cut a stream in flight with no error
# event, an engine left its KV pool in /dev/shm, and pdx-agent lived on
# with UCX's logging turned to DEBUG by UCX's own SIGHUP handler.
#  * the proxy drains: a stream through it runs to its [DONE], exit 0;
#  * the decode engine exits 0 and unlinks its pool;
#  * its agent exits 0, its log free of UCX's DEBUG lines.
#   hangup.sh PDX_ENGINE PDX_AGENT PDX_PROXY
# SIGHUP ignored when the test began (a run under nohup, or a CI agent or
# supervisor that ignores it): bash cannot undo that (a signal ignored at
# entry stays so for the shell and all it starts), so each program below
# would keep it ignored, as it must (common/hangup.h), and `named_stop X
# HUP` would wait for ever (meson's timeout, no message). Start again
# with SIGHUP at its default.
if [ -z "${PDX_HANGUP_HUP_RESET:-}" ] &&
	(($(printf '%d' "0x$(awk '/^SigIgn:/ { print $2 }' /proc/$$/status)") & 1)); then
	export PDX_HANGUP_HUP_RESET=1
	exec /usr/bin/python3 -c 'import os, signal, sys
signal.signal(signal.SIGHUP, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])' "$BASH" "$0" "$@"
fi
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
# shellcheck disable=SC2034 # agent_start (lib.sh) reads it
AGENT=$2
PROXY=$3

pd_engine_start P prefill --time-scale 0
pd_engine_start D decode --time-scale 10000
named_engine_start X "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D" --health-interval 0
wait_healthy P
wait_healthy D

stream_start X 100 "hang up"
# one started with SIGHUP ignored (nohup, `trap '' HUP` in a launcher)
# is left running by a hangup, as before the handler
(trap '' HUP; exec "$PROXY" --port 0 --decode "127.0.0.1:$PORT_D" \
	--health-interval 0) >"$E2E_TMP/nohup.log" 2>&1 &
np=$!
sleep 0.3
kill -HUP "$np"
sleep 0.3
kill -0 "$np" 2>/dev/null ||
	fail "a proxy started under nohup exited on SIGHUP: $(tail -1 "$E2E_TMP/nohup.log")"
kill "$np"
wait "$np"

named_stop X HUP
wait $c || fail "the stream did not finish while the proxy drained (curl $?)"
grep -q '^data: \[DONE\]' "$E2E_TMP/X.sse" ||
	fail "the stream has no [DONE]: $(tail -c 300 "$E2E_TMP/X.sse")"
grep -q 'signal 1' "$E2E_TMP/X.log" || fail "the proxy did not log SIGHUP: $(tail -3 "$E2E_TMP/X.log")"

pool=$(engine_pool "$PID_D")
[ -n "$pool" ] || fail "no pool of the decode engine in /dev/shm"
named_stop D HUP
[ ! -e "$pool" ] || fail "the decode engine left its pool $pool"

named_stop agent_d HUP
! grep -q 'UCX  DEBUG' "$E2E_TMP/agent_d.log" ||
	fail "UCX logs at DEBUG after the agent's SIGHUP: $(grep -c 'UCX  DEBUG' "$E2E_TMP/agent_d.log") lines"
echo ok
