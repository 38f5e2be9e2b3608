#!/usr/bin/env bash
# Request validation over HTTP (validate.py's table): pdx-engine answers
# every body vLLM's rules refuse, and every parameter it does not
# implement, with 400 naming the parameter, and good bodies with 200.
# pdx-proxy, in front of a prefill and a decode engine with their agents,
# refuses the bodies vLLM's rules refuse itself — no engine sees them
# (their refusal counters do not move) — in the concurrent and the
# sequential flow; what only pdx-engine refuses comes back as the
# engine's 400, and no KV block stays held.
#   validate.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3

named_engine_start E "$ENGINE" --time-scale 0
$PY "$HERE/validate.py" "$PORT_E" all || fail "pdx-engine's answers"
grep -q "fields present in the request but ignored: unknown_field" \
	"$E2E_TMP/E.log" || fail "no warning about an unknown field"
named_stop E

notify="tcp://127.0.0.1:$(free_port)"
AGENT_OPTS+=(--notify "$notify")
pd_engine_start P prefill --time-scale 0
pd_engine_start D decode --time-scale 0
pools=(--prefill "127.0.0.1:$PORT_P" --decode "127.0.0.1:$PORT_D")
named_engine_start XC "$PROXY" "${pools[@]}" --flow concurrent \
	--notify-bind "$notify"
named_engine_start XS "$PROXY" "${pools[@]}" --flow sequential

rejected() { echo "$(val "$PORT_P" "$(e requests_rejected_total)") $(val "$PORT_D" "$(e requests_rejected_total)")"; }
for x in XC XS; do
	before=$(rejected)
	$PY "$HERE/validate.py" "$(eval echo "\$PORT_$x")" vllm ||
		fail "$x: pdx-proxy's answers"
	[ "$(rejected)" = "$before" ] ||
		fail "$x: engines saw requests vLLM refuses (rejected P D: $before -> $(rejected))"
	$PY "$HERE/validate.py" "$(eval echo "\$PORT_$x")" all ||
		fail "$x: pdx-engine's refusals through pdx-proxy"
done
blocks_free "$PORT_P" "$PORT_D"
for x in XC XS P D; do named_stop $x; done
echo "PASS"
