#!/usr/bin/env bash
# The proxy killed (SIGKILL) and restarted on the same port: before any
# request reached the engines (their agents have not shaken hands yet),
# and mid-transfer (while the prefill engine computes and the decode
# engine waits for its KV). The client's request ends at once with a
# broken connection (within ENDED_MAX_MS of the kill; a client left
# hanging gives up after 10 s and fails the bound); both engines see
# their client leave, abort the request and free every block; the restarted proxy serves the colocated
# engine's text.
#   proxy_restart.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3

# tiny's prefill scaled to about a second, so "mid-transfer" is wide
pd_engine_start P prefill --time-scale 300000
pd_engine_start D decode --time-scale 0
named_engine_start C "$ENGINE" --time-scale 0
XPORT=$(free_port)
proxy_up() {
	bg_start X "$PROXY" --prefill "127.0.0.1:$PORT_P" --decode "127.0.0.1:$PORT_D" \
		--port "$XPORT"
	for _ in $(seq 100); do
		curl -sS -f -o /dev/null "http://127.0.0.1:$XPORT/ready" 2>/dev/null && return 0
		sleep 0.1
	done
	fail "the proxy did not come up on $XPORT: $(tail -5 "$E2E_TMP/X.log")"
}
proxy_kill() {
	kill -9 "$PID_X"
	wait "$PID_X" 2>/dev/null
}
prompt="the proxy goes away and comes back"
want=$(text "$PORT_C" "$prompt" 6)
served() {
	[ "$(text "$XPORT" "$prompt" 6)" = "$want" ] || fail "$1: not the colocated text"
}
# idle WHAT: both engines hold no block and run or queue no request.
idle() {
	# shellcheck disable=SC2046
	settle 10 $(engine_idle P D) || fail "$1: the engines are not idle"
}

# before the handshake: killed with nothing sent, restarted
proxy_up
proxy_kill
proxy_up
served "restarted before any request"

# mid-transfer
ENDED_MAX_MS=1000
proxy_kill
proxy_up
long="{\"prompt\": \"$(seq -s ' ' 1 400)\", \"max_tokens\": 6}"
curl -sS --max-time 10 -o /dev/null -d "$long" "http://127.0.0.1:$XPORT/v1/completions" 2>/dev/null &
cpid=$!
# the prefill is under way (P runs it), the decode waits (D queues it)
for _ in $(seq 200); do
	curl -sS "http://127.0.0.1:$PORT_P/metrics" |
		grep -q '^pdx_engine_num_requests_running\({[^}]*}\)\? [1-9]' && break
	sleep 0.02
done
sleep 0.2
curl -sS "http://127.0.0.1:$PORT_P/metrics" |
	grep -q '^pdx_engine_num_requests_running\({[^}]*}\)\? [1-9]' ||
	fail "mid-transfer: the prefill ended before the kill (make it longer)"
tk=$(date +%s%N)
proxy_kill
wait $cpid && fail "mid-transfer: the client's request succeeded through a killed proxy"
ended=$((($(date +%s%N) - tk) / 1000000))
[ "$ended" -le $ENDED_MAX_MS ] ||
	fail "mid-transfer: the client's request ended $ended ms after the kill, not at once (bound $ENDED_MAX_MS ms)"
idle "mid-transfer"
echo "proxy SIGKILL mid-transfer: the client's request ended $ended ms after the kill; both engines idle, no block held"
proxy_up
served "restarted mid-transfer"

for name in X P D C agent_p agent_d; do
	named_stop "$name"
done
echo "ok: proxy killed before any request and mid-transfer; engines idle; restarted proxy serves"
