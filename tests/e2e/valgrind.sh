#!/usr/bin/env bash
# pdx-proxy and both pdx-agents under valgrind (memcheck) while they serve
# real disaggregated traffic: completions and chat, streamed and not, the
# text equal to a colocated engine's; clients that leave mid-stream; the
# admin API; /metrics, the agents' too. Then SIGTERM: any memory error or definite leak
# makes valgrind exit 99 instead of 0.
#   valgrind.sh PDX_ENGINE PDX_AGENT PDX_PROXY VALGRIND
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3
VG=("$4" --quiet --leak-check=full --errors-for-leak-kinds=definite
	--error-exitcode=99)

notify="tcp://127.0.0.1:$(free_port)"
# the agents under valgrind, with their default transfer bound and their
# /metrics served
AGENT_WRAP=("${VG[@]}")
AGENT_OPTS=(--notify "$notify" --metrics 127.0.0.1:0)
# (agents under memcheck answer the engine link's heartbeats slowly)
pd_engine_start P prefill --time-scale 0 --agent-liveness-ms 10000
pd_engine_start D decode --time-scale 0 --agent-liveness-ms 10000
named_engine_start C "$ENGINE" --time-scale 0
export PDX_PROXY_ADMIN_TOKEN=valgrind-test-token
named_engine_start X "${VG[@]}" "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D" --flow concurrent --notify-bind "$notify"

# same ROUTE REQUEST: the proxy answers as the colocated engine, whole
# and streamed.
same() {
	local route=$1 req=$2 tag=$((E2E_SEQ += 1))
	PORT=$PORT_C post "$route" "$req}" >"$E2E_TMP/c_$tag.json"
	PORT=$PORT_X post "$route" "$req}" >"$E2E_TMP/x_$tag.json"
	status_is 200 "proxy: $req"
	py "import json; a=json.load(open('$E2E_TMP/c_$tag.json'))['choices'][0]; b=json.load(open('$E2E_TMP/x_$tag.json'))['choices'][0]; assert a.get('text', a.get('message')) == b.get('text', b.get('message')), (a, b)" \
		"disaggregated equals colocated: $req"
	curl -sS -N -d "$req, \"stream\": true}" \
		"http://127.0.0.1:$PORT_X$route" >"$E2E_TMP/x_$tag.sse" ||
		fail "stream $req"
	grep -q '^data: \[DONE\]' "$E2E_TMP/x_$tag.sse" || fail "stream ends: $req"
}

for p in '"Hello, world!"' '[1, 2, 3, 4, 5, 6, 7, 8, 9]' \
	"\"$(seq -s ' ' 1 300)\""; do
	same /v1/completions "{\"prompt\": $p, \"max_tokens\": 12"
done
same /v1/chat/completions \
	'{"messages": [{"role": "user", "content": "Tell me about KV caches"}], "max_tokens": 7'

# clients that leave mid-stream
for _ in 1 2 3; do
	curl -sS -N -m 0.3 -o /dev/null -d '{"prompt": "a long story", "max_tokens": 2000, "stream": true}' \
		"http://127.0.0.1:$PORT_X/v1/completions" 2>/dev/null
done
# the admin API and metrics
auth=(-H "Authorization: Bearer $PDX_PROXY_ADMIN_TOKEN")
curl -sS -f "${auth[@]}" "http://127.0.0.1:$PORT_X/admin/instances" >/dev/null ||
	fail "admin list"
curl -sS -f "${auth[@]}" -d "{\"role\": \"decode\", \"url\": \"http://127.0.0.1:$PORT_C\"}" \
	"http://127.0.0.1:$PORT_X/admin/instances" >/dev/null || fail "admin add"
curl -sS -f "${auth[@]}" -X DELETE \
	"http://127.0.0.1:$PORT_X/admin/instances?url=http://127.0.0.1:$PORT_C&role=decode" \
	>/dev/null || fail "admin remove"
curl -sS -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT_X/admin/instances" |
	grep -q 401 || fail "admin without the token is not 401"
curl -sS -f "http://127.0.0.1:$PORT_X/metrics" >/dev/null || fail "proxy metrics"
for side in p d; do
	curl -sS -f "http://127.0.0.1:$(agent_metrics_port $side)/metrics" \
		>"$E2E_TMP/m_$side" || fail "agent $side: metrics"
	grep -q '^pdx_agent_transfers_total{outcome="[a-z]*",path="ipc"} [1-9]' \
		"$E2E_TMP/m_$side" || fail "agent $side counted no transfer"
done
same /v1/completions '{"prompt": "after the aborts", "max_tokens": 5'

# every block free again, then a clean stop under valgrind
blocks_free "$PORT_P" "$PORT_D"
for name in X agent_p agent_d P D C; do
	named_stop "$name"
done
echo "ok: proxy and agents clean under valgrind"
