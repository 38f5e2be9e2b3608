#!/usr/bin/env bash
# Every process's /metrics as a monitoring stack reads it: a prefill and
# a decode engine, each with its pdx-agent serving /metrics (--metrics),
# and pdx-proxy, after real traffic (completions whole and streamed, chat,
# a client error, a transfer whose lease runs out), each passes
# Prometheus's own `promtool check metrics` (its lint included: a gauge
# named _total fails it) and tests/e2e/promcheck.py. One request first:
# the agents count it, sent 1 by P's agent and received 1 by D's, with
# its bytes and its duration in the histograms. An agent whose --metrics
# cannot be bound says so and exits 1. Every family each process serves
# is the one its doc's table says, with its type and labels, and every
# family there is served (tests/e2e/docs_metrics.py). Without promtool
# all but its lint runs, then the test says skipped.
#   promtool.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
DOCS=$HERE/../../docs
PROMTOOL=$(command -v promtool)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3

notify="tcp://127.0.0.1:$(free_port)"
AGENT_OPTS+=(--notify "$notify" --metrics 127.0.0.1:0 --lease-ms 500)
pd_engine_start P prefill --time-scale 0
pd_engine_start D decode --time-scale 0
named_engine_start X "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D" --flow concurrent --notify-bind "$notify"
PORT_Ap=$(agent_metrics_port p) || exit 1
PORT_Ad=$(agent_metrics_port d) || exit 1
# --metrics on a port taken (the proxy's): the agent says so and exits 1
UCX_TLS=sm,self "$AGENT" --engine "ipc://$E2E_TMP/taken.engine" \
	--listen "tcp://127.0.0.1:$(free_port)" --metrics "127.0.0.1:$PORT_X" \
	2>"$E2E_TMP/taken.log"
rc=$?
[ $rc -eq 1 ] && grep -q "cannot listen on 127.0.0.1:$PORT_X" "$E2E_TMP/taken.log" ||
	fail "--metrics on a port in use: exit $rc, $(tail -3 "$E2E_TMP/taken.log")"
"$AGENT" --engine "ipc://$E2E_TMP/bad.engine" --listen tcp://127.0.0.1:1 \
	--metrics 9100 2>/dev/null
[ $? -eq 2 ] || fail "--metrics without a host is not a bad command line"

# one request: each agent counts its side of the one transfer
text "$PORT_X" "count me once" 5 >/dev/null
a() { echo "pdx_agent_$1"; }
settle 10 \
	"$PORT_Ap/$(a 'transfers_total{outcome="sent",path="ipc"}')=1" \
	"$PORT_Ap/$(a 'transfers_total{outcome="failed",path="ipc"}')=0" \
	"$PORT_Ap/$(a 'transfer_bytes_total{role="send",path="ipc"}')>=1" \
	"$PORT_Ap/$(a 'transfer_duration_seconds_count{outcome="sent"}')=1" \
	"$PORT_Ap/$(a 'transfer_duration_seconds_bucket{outcome="sent",le="+Inf"}')=1" \
	"$PORT_Ap/$(a 'transfers_live{role="send"}')=0" \
	"$PORT_Ap/$(a 'handshakes_total{result="ok"}')>=1" \
	"$PORT_Ap/$(a 'peers{state="ready"}')=1" \
	"$PORT_Ap/$(a engine_registered)=1" \
	"$PORT_Ad/$(a 'transfers_total{outcome="received",path="ipc"}')=1" \
	"$PORT_Ad/$(a 'transfers_total{outcome="sent",path="ipc"}')=0" \
	"$PORT_Ad/$(a 'transfer_bytes_total{role="recv",path="ipc"}')>=1" \
	"$PORT_Ad/$(a 'transfer_duration_seconds_count{outcome="received"}')=1" \
	"$PORT_Ad/$(a 'transfers_live{role="recv"}')=0" \
	"$PORT_Ad/$(a 'handshakes_total{result="refused"}')=0" ||
	fail "the agents' counts after one transfer"
# the bytes both sides counted are the same
[ "$(val "$PORT_Ap" "$(a 'transfer_bytes_total{role="send",path="ipc"}')")" = \
	"$(val "$PORT_Ad" "$(a 'transfer_bytes_total{role="recv",path="ipc"}')")" ] ||
	fail "sent and received bytes differ"

# more traffic: streamed, chat, a client's error
curl -sS -N -o "$E2E_TMP/sse" -d '{"prompt": "a stream", "max_tokens": 6, "stream": true}' \
	"http://127.0.0.1:$PORT_X/v1/completions" || fail "stream"
grep -q '^data: \[DONE\]' "$E2E_TMP/sse" || fail "the stream did not end"
PORT=$PORT_X post /v1/chat/completions \
	'{"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}' >/dev/null
status_is 200 "chat"
PORT=$PORT_X post /v1/completions 'not json' >/dev/null
status_is 400 "a body that is not JSON"

# a prefill nobody asks for: its lease (500 ms) runs out on P's agent
xid=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
peer_d=$(curl -sS "http://127.0.0.1:$PORT_D/v1/pdx/info" |
	sed -n 's/.*"peer_addr": *"\([^"]*\)".*/\1/p')
PORT=$PORT_P post /v1/completions "{\"prompt\": \"nobody asks\", \"max_tokens\": 4,
	\"kv_transfer_params\": {\"xfer_id\": \"$xid\", \"remote_agent\": \"$peer_d\",
	\"do_remote_decode\": true}}" >/dev/null
status_is 200 "a prefill for a decode side that never asks"
settle 10 "$PORT_Ap/$(a 'transfers_total{outcome="failed",path="ipc"}')=1" \
	"$PORT_Ap/$(a 'transfers_total{outcome="sent",path="ipc"}')=3" \
	"$PORT_Ap/$(a 'transfers_live{role="send"}')=0" ||
	fail "the expired lease is a failed transfer"
blocks_free "$PORT_P" "$PORT_D"

# every process's /metrics passes promtool and promcheck.py, and is what
# its doc says: P and D engines with an agent, X the proxy, A* agents
doc_of() {
	case $1 in
	P | D) echo "$DOCS/engine.md|### Metrics" ;;
	X) echo "$DOCS/proxy.md|## Metrics" ;;
	A*) echo "$DOCS/architecture.md|### Metrics" ;;
	esac
}
for n in P D X Ap Ad; do
	curl -sS -f "http://127.0.0.1:$(eval echo "\$PORT_$n")/metrics" \
		>"$E2E_TMP/m$n" || fail "$n: GET /metrics"
	if [ -n "$PROMTOOL" ]; then
		"$PROMTOOL" check metrics <"$E2E_TMP/m$n" >"$E2E_TMP/lint$n" 2>&1 ||
			fail "$n: promtool check metrics: $(cat "$E2E_TMP/lint$n")"
	fi
	$PY "$HERE/promcheck.py" "$E2E_TMP/m$n" || fail "$n: promcheck.py"
	d=$(doc_of $n)
	$PY "$HERE/docs_metrics.py" "$E2E_TMP/m$n" "${d%|*}" "${d#*|}" ||
		fail "$n: /metrics against ${d%|*}"
done
curl -sS -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT_Ap/other" |
	grep -q 404 || fail "an agent's other paths are not 404"
for n in X agent_p agent_d P D; do named_stop $n; done
if [ -z "$PROMTOOL" ]; then
	echo "promtool not found: it comes with Debian's prometheus package (scripts/deps installs it); its lint skipped"
	exit 77
fi
echo "ok: every /metrics passes promtool and is as documented"
