#!/usr/bin/env bash
# pdx-proxy's circuit breaker with no other instance to take requests: a
# lone prefill instance whose breaker opened gets its trial, a request
# whose decode leg runs ~1.5 s (the trial's result is the decode leg's
# answer: a whole generation when not streamed). The requests that come
# meanwhile go to it too, and are served (the first result decides the
# breaker): they all got 503 "no usable
# prefill instance" until the trial ended (a rolling restart's clients met
# it once the other prefill instance stopped), and /ready answered 503.
# Beside another usable instance, the one on trial takes nothing else
# (tests/unit/test_proxy_pool.c).
#   proxy_trial.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
# shellcheck disable=SC2034 # agent_start (lib.sh) reads it
AGENT=$2
PROXY=$3

pd_engine_start P prefill --time-scale 0
# ~5 ms a token: 300 tokens ~1.5 s
pd_engine_start D decode --time-scale 5000
named_engine_start X "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D" --flow sequential --retries 0 \
	--first-byte-timeout 4000 --breaker-failures 1 --breaker-open-ms 500 \
	--health-interval 0
state() { val "$PORT_X" "pdx_proxy_instance_breaker_state{$(instance P)}"; }
T=$E2E_TMP

# P stopped: its leg's first byte times out, and its breaker opens
kill -STOP "$PID_P"
to "$PORT_X" "$(prompt_body "the request that fails" 2)" "$T/failed"
kill -CONT "$PID_P"
[ "$(cat "$T/failed.code")" = 504 ] || fail "a request to the stopped prefill instance: $(cat "$T/failed.code")"
[ "$(state)" = 1 ] || fail "breaker state $(state) after the instance failed, want 1 (open)"

# past --breaker-open-ms the next request is the trial
sleep 0.6
to "$PORT_X" "$(prompt_body "the trial" 300)" "$T/trial" &
trial=$!
settle 5 "$PORT_X/pdx_proxy_instance_breaker_state{$(instance P)}=2" ||
	fail "no trial went"
pids=()
for k in 1 2 3; do
	to "$PORT_X" "$(prompt_body "a request during the trial, $k" 2)" "$T/during$k" &
	pids+=($!)
done
wait "${pids[@]}"
PORT=$PORT_X get /ready >/dev/null
# (the trial's code is written when it ends)
[ ! -s "$T/trial.code" ] ||
	fail "the trial ended before the requests beside it: nothing was checked"
for k in 1 2 3; do
	[ "$(cat "$T/during$k.code")" = 200 ] ||
		fail "request $k during the trial: $(cat "$T/during$k.code") $(cat "$T/during$k")"
done
status_is 200 "/ready while the lone prefill instance's trial ran"
wait $trial
[ "$(cat "$T/trial.code")" = 200 ] || fail "the trial: $(cat "$T/trial.code") $(cat "$T/trial")"
[ "$(state)" = 0 ] || fail "breaker state $(state) after the trial succeeded, want 0 (closed)"

named_stop X
named_stop D
named_stop P
named_stop agent_d
named_stop agent_p
echo "ok: proxy_trial"
