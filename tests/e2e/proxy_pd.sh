#!/usr/bin/env bash
# pdx-proxy in each of its three flows (concurrent, sequential,
# early-callback) in front of a real prefill engine and decode engine,
# each with its pdx-agent: the text must equal a colocated engine's, for
# completions and chat, streamed and not, and every KV block is free on
# both engines afterwards. Then the prefill engine dies: a concurrent
# request gets the prefill's error (and the waiting decode leg is
# cancelled, its blocks freed) or, under --on-prefill-failure local, the
# colocated text from D alone. The agents notify two proxies (each
# --notify): each counts its own transfers down as they end. An instance
# nobody listens at, or whose name does not resolve, is said as such.
#   proxy_pd.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
AGENT=$2
PROXY=$3

notify="tcp://127.0.0.1:$(free_port)" # the concurrent proxy's collector
notify2="tcp://127.0.0.1:$(free_port)" # the sequential one's: two proxies
AGENT_OPTS+=(--notify "$notify" --notify "$notify2")
# P's prefill takes modeled time (tiny's is a few ms at this scale), as a
# real one does: the early-callback flow's callback, posted as the prefill
# starts, then reaches the proxy before P's answer (at time scale 0 the two
# raced, and under ASan the answer could win every time)
pd_engine_start P prefill --time-scale 100000
pd_engine_start D decode --time-scale 0
named_engine_start C "$ENGINE" --time-scale 0
pools=(--prefill "127.0.0.1:$PORT_P" --decode "127.0.0.1:$PORT_D")
named_engine_start XC "$PROXY" "${pools[@]}" --flow concurrent \
	--notify-bind "$notify" --policy-p least-loaded
named_engine_start XS "$PROXY" "${pools[@]}" --flow sequential \
	--notify-bind "$notify2"
named_engine_start XE "$PROXY" "${pools[@]}" --flow early-callback --log-level debug

# same NAME ROUTE REQUEST KIND MAX_TOKENS: the proxy PORT_NAME answers as
# the colocated engine does, whole and streamed.
same() {
	local x=$1 route=$2 req=$3 kind=$4 n=$5 tag=$1_$((E2E_SEQ += 1))
	PORT=$PORT_C post "$route" "$req}" >"$E2E_TMP/c_$tag.json"
	PORT=$(eval echo "\$PORT_$x") post "$route" "$req}" >"$E2E_TMP/x_$tag.json"
	status_is 200 "$x: $req"
	py "import json; a=json.load(open('$E2E_TMP/c_$tag.json'))['choices'][0]; b=json.load(open('$E2E_TMP/x_$tag.json'))['choices'][0]; assert a.get('text', a.get('message')) == b.get('text', b.get('message')), (a, b)" \
		"$x: disaggregated equals colocated: $req"
	curl -sS -N -d "$req, \"stream\": true, \"stream_options\": {\"include_usage\": true}}" \
		"http://127.0.0.1:$(eval echo "\$PORT_$x")$route" >"$E2E_TMP/x_$tag.sse" ||
		fail "$x: stream $req"
	"$PY" "$HERE/sse_check.py" "$E2E_TMP/c_$tag.json" "$E2E_TMP/x_$tag.sse" \
		"$kind" "$n" >/dev/null || fail "$x: stream vs colocated: $req"
}

for x in XC XS XE; do
	n=0
	for p in '"Hello, world!"' '"The quick brown fox jumps over the lazy dog again and again"' \
		'[1, 2, 3, 4, 5, 6, 7, 8, 9]' '"a"'; do
		n=$((n + 1))
		same $x /v1/completions "{\"prompt\": $p, \"max_tokens\": $((n * 4))" text $((n * 4))
	done
	same $x /v1/chat/completions \
		'{"messages": [{"role": "user", "content": "Tell me about KV caches"}], "max_tokens": 7' chat 7
done
# the breakdown: D's Server-Timing (queue, kv, ttft), P's as p_*, the
# proxy's own; and the phase histograms
curl -sS -N -D "$E2E_TMP/head" -o /dev/null \
	-d '{"prompt": "where did the time go", "max_tokens": 3, "stream": true}' \
	"http://127.0.0.1:$PORT_XS/v1/completions" || fail "timing request"
grep -i "^server-timing: queue;dur=[0-9.]*, kv;dur=[0-9.]*, ttft;dur=[0-9.]*, p_queue;dur=[0-9.]*, p_prefill;dur=[0-9.]*, p_ttft;dur=[0-9.]*, proxy;dur=[0-9.]*" \
	"$E2E_TMP/head" >/dev/null || fail "Server-Timing: $(grep -i timing "$E2E_TMP/head")"
PORT=$PORT_XC get /metrics >"$E2E_TMP/mphase"
for ph in prefill_queue prefill decode_queue kv_wait first_token; do
	"$PY" -c "import sys, re
n = [float(v) for v in re.findall(r'^pdx_proxy_request_phase_seconds_count\{phase=\"$ph\"\} (\S+)', open(sys.argv[1]).read(), re.M)]
assert n and n[0] >= 10, n" "$E2E_TMP/mphase" || fail "phase histogram $ph"
done

# the concurrent proxy heard both agents report each of its 10 transfers
# (the other proxies' are unknown to it) and counts none as unfinished
for _ in $(seq 50); do
	PORT=$PORT_XC get /metrics >"$E2E_TMP/mxfer"
	grep -q '^pdx_proxy_transfer_notifications_total{about="counted"} 20$' \
		"$E2E_TMP/mxfer" && break
	sleep 0.1
done
"$PY" -c "import sys, re
t = open(sys.argv[1]).read()
assert re.search(r'^pdx_proxy_transfer_notifications_total\{about=\"counted\"\} 20$', t, re.M), t
g = re.findall(r'^pdx_proxy_instance_transfers\{.*\} (\d+)$', t, re.M)
assert g == ['0', '0'], g
assert re.search(r'^pdx_proxy_transfer_notifications_total\{about=\"bad\"\} 0$', t, re.M)
# same host, shared memory: every one moved by the ipc path
assert re.search(r'^pdx_proxy_transfers_sent_total\{path=\"ipc\"\} 10$', t, re.M), t
b = re.search(r'^pdx_proxy_transfer_sent_bytes_total\{path=\"ipc\"\} (\d+)$', t, re.M)
assert b and int(b.group(1)) > 0, b
assert re.search(r'^pdx_proxy_transfers_sent_total\{path=\"staged\"\} 0$', t, re.M), t" \
	"$E2E_TMP/mxfer" || fail "transfer notifications: $(grep transfer "$E2E_TMP/mxfer")"
# the second proxy in front of the same engines hears of its own transfers
# too (each agent's second --notify): they stop counting as they end, not
# 60 s later (an agent took one collector: the other's least-loaded saw
# every transfer it ever set up)
settle 5 "$PORT_XS/pdx_proxy_transfer_notifications_total{about=\"counted\"}>=20" \
	"$PORT_XS/pdx_proxy_instance_transfers{$(instance P)}=0" \
	"$PORT_XS/pdx_proxy_instance_transfers{$(instance D)}=0" ||
	fail "the second proxy's transfers: $(curl -s "http://127.0.0.1:$PORT_XS/metrics" | grep -E 'instance_transfers|notifications')"

grep -q "prefill started; decode dispatched" "$E2E_TMP/XE.log" ||
	fail "early-callback: no prefill engine called back"

# the early-callback route refuses what it cannot match
PORT=$PORT_XE post /v1/metaserver 'not json' >/dev/null
status_is 400 "metaserver: a body that is not JSON"
PORT=$PORT_XE post /v1/metaserver '{"xfer_id": "00112233445566778899aabbccddeeff"}' >/dev/null
status_is 404 "metaserver: an xfer_id nobody waits for"

# every KV block free again; valid /metrics, each proxy's requests
# counted
blocks_free "$PORT_P" "$PORT_D"
for x in P D XC XS XE; do
	want=()
	case $x in
	XS) want=("pdx_proxy_requests_total{code=\"200\"}=11") ;; # and the timing request
	X*) want=("pdx_proxy_requests_total{code=\"200\"}=10") ;;
	esac
	PORT=$(eval echo "\$PORT_$x") get /metrics >"$E2E_TMP/m$x"
	"$PY" "$HERE/promcheck.py" "$E2E_TMP/m$x" "${want[@]}" || fail "$x: metrics"
done

# the prefill engine dies: D, already waiting for the KV, is cancelled
named_stop P
req='{"prompt": "after the fall", "max_tokens": 5}'
PORT=$PORT_XC post /v1/completions "$req" >/dev/null
status_is 502 "concurrent flow, prefill engine gone"
named_engine_start XL "$PROXY" "${pools[@]}" --on-prefill-failure local \
	--retries 0 --health-interval 0 --breaker-failures 2
PORT=$PORT_C post /v1/completions "$req" >"$E2E_TMP/c_fall.json"
for _ in 1 2; do
	PORT=$PORT_XL post /v1/completions "$req" >"$E2E_TMP/x_fall.json"
	status_is 200 "concurrent flow, prefill gone, --on-prefill-failure local"
done
py "import json; a=json.load(open('$E2E_TMP/c_fall.json')); b=json.load(open('$E2E_TMP/x_fall.json')); assert a['choices'][0]['text'] == b['choices'][0]['text'], (a, b)" \
	"D alone gives the colocated text"
# D's answers, prefilled by D, vouch for no prefill instance: P's two
# failures in a row open its breaker (a D answer counted for P kept it
# shut while P failed every prefill)
settle 5 "$PORT_XL/pdx_proxy_instance_breaker_state{$(instance P)}=1" ||
	fail "the dead prefill instance's breaker: $(curl -s "http://127.0.0.1:$PORT_XL/metrics" | grep breaker_state)"
blocks_free "$PORT_D"

# D refuses (400) what P has already answered (a prompt whose max_tokens
# pass D's context; P's prefill is instant here, so its answer often
# comes first): the transfer stops counting at once. It counted against
# both instances until --transfer-timeout before, about 8 requests in 20.
named_stop XC
pd_engine_start PQ prefill --time-scale 0
named_engine_start XQ "$PROXY" --prefill "127.0.0.1:$PORT_PQ" \
	--decode "127.0.0.1:$PORT_D" --flow concurrent --notify-bind "$notify"
for _ in $(seq 20); do
	PORT=$PORT_XQ post /v1/completions '{"prompt": "a b c", "max_tokens": 8190}' >/dev/null
	status_is 400 "over D's context"
done
settle 5 "$PORT_XQ/pdx_proxy_instance_transfers{$(instance PQ)}=0" \
	"$PORT_XQ/pdx_proxy_instance_transfers{$(instance D)}=0" ||
	fail "refused transfers still count: $(curl -s "http://127.0.0.1:$PORT_XQ/metrics" | grep instance_transfers)"

# PQ's agent restarts at another peer address (agent_start picks a new
# port): PQ's engine registers again and gives out the new one, and the
# proxy asks again after the first failure. Before, the engine's
# /v1/pdx/info kept the old address, and so did the proxy: every
# transfer failed for as long as they ran.
old=$(PORT=$PORT_PQ get /v1/pdx/info)
named_stop agent_pq
agent_start pq
health_of() { curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/health"; }
for _ in $(seq 100); do [ "$(health_of "$PORT_PQ")" = 200 ] && break; sleep 0.1; done
new=$(PORT=$PORT_PQ get /v1/pdx/info)
py "import json; a=json.loads('''$old''')['peer_addr']; b=json.loads('''$new''')['peer_addr']; assert a != b, (a, b)" \
	"PQ's /v1/pdx/info gives its agent's new address"
sent() { val "$PORT_XQ" 'pdx_proxy_transfers_sent_total{path="ipc"}'; }
before=$(sent)
for _ in $(seq 4); do
	PORT=$PORT_XQ post /v1/completions '{"prompt": "a b c d", "max_tokens": 4}' >/dev/null
	settle 2 "$PORT_XQ/pdx_proxy_transfers_sent_total{path=\"ipc\"}>=$((before + 1))" 2>/dev/null && break
done
settle 1 "$PORT_XQ/pdx_proxy_transfers_sent_total{path=\"ipc\"}>=$((before + 1))" ||
	fail "no transfer by PQ's restarted agent through the proxy: $(grep -i agent "$E2E_TMP/XQ.log" | tail -3)"

# --prefill and --decode swapped, or a colocated engine in the pair: the
# engines' own /v1/pdx/info says so, and the proxy answers 502 with what
# to fix (the engine's 400 blamed the client: "this is a decode engine",
# "this engine has no --agent", while /ready said 200)
named_engine_start XW "$PROXY" --prefill "127.0.0.1:$PORT_D" --decode "127.0.0.1:$PORT_PQ"
named_engine_start XN "$PROXY" --prefill "127.0.0.1:$PORT_PQ" --decode "127.0.0.1:$PORT_C"
for case in "XW:are --prefill and --decode swapped" "XN:has no agent"; do
	PORT=$(eval echo "\$PORT_${case%%:*}") post /v1/completions '{"prompt": "a b", "max_tokens": 2}' >/dev/null
	status_is 502 "${case%%:*}"
	grep -q "${case#*:}" "$E2E_TMP/body" || fail "${case%%:*}: $(cat "$E2E_TMP/body")"
	grep -q "${case#*:}" "$E2E_TMP/${case%%:*}.log" || fail "${case%%:*}: not logged"
	# that instance is out of the picks now, the only one of its pool:
	# the 503 says why (not "unhealthy or with their circuit breaker
	# open", which it is not)
	PORT=$(eval echo "\$PORT_${case%%:*}") post /v1/completions '{"prompt": "a b", "max_tokens": 2}' >/dev/null
	status_is 503 "${case%%:*}, again"
	grep -q "in the wrong pool by their /v1/pdx/info" "$E2E_TMP/body" ||
		fail "${case%%:*}, again: $(cat "$E2E_TMP/body")"
done

# a decode engine listed among two --prefill instances: the request
# that finds it out starts over on the other one, and it leaves the
# prefill picks (before: it stayed in, healthy, and every other request
# got that 502 for good); it is asked again once its engine is seen
# started again
pd_engine_start D2 decode --time-scale 0
wait_healthy D2
named_engine_start XM "$PROXY" --prefill "127.0.0.1:$PORT_D2" \
	--prefill "127.0.0.1:$PORT_PQ" --decode "127.0.0.1:$PORT_D"
for k in $(seq 8); do
	PORT=$PORT_XM post /v1/completions "{\"prompt\": \"misplaced $k\", \"max_tokens\": 2}" >/dev/null
	status_is 200 "XM: request $k, a decode engine among the prefill instances"
done
[ "$(val "$PORT_XM" 'pdx_proxy_retries_total{leg="prefill"}')" = 1 ] ||
	fail "XM: prefill retries $(val "$PORT_XM" 'pdx_proxy_retries_total{leg="prefill"}'), want 1 (the request that found D2 out)"
[ "$(val "$PORT_XM" "pdx_proxy_instance_requests_total{role=\"prefill\",instance=\"http://127.0.0.1:$PORT_D2\"}")" = 1 ] ||
	fail "XM: D2 was picked again after it was found in the wrong pool"
grep -q "prefill instance http://127.0.0.1:$PORT_D2 is a decode engine" "$E2E_TMP/XM.log" ||
	fail "XM: not logged"
named_stop XM
named_stop D2

# an instance nobody listens at, and one whose host name does not
# resolve: the 502 says which (before: "no response", and "cannot
# connect" with nothing of the name), and the name is warned of at start
named_engine_start XR "$PROXY" --decode "127.0.0.1:$(free_port)" --health-interval 0
named_engine_start XU "$PROXY" --decode "no-such-host.invalid:8100" --health-interval 0
grep -q -- "--decode http://no-such-host.invalid:8100: its host name does not resolve here" \
	"$E2E_TMP/XU.log" || fail "no warning at start of a name that does not resolve"
for case in "XR:cannot connect (nothing listens there" "XU:cannot connect: its host name does not resolve here"; do
	PORT=$(eval echo "\$PORT_${case%%:*}") post /v1/completions '{"prompt": "a b", "max_tokens": 2}' >/dev/null
	status_is 502 "${case%%:*}"
	grep -qF "${case#*:}" "$E2E_TMP/body" || fail "${case%%:*}: $(cat "$E2E_TMP/body")"
done
for x in XW XN XR XU XQ PQ XS XE XL D C; do named_stop $x; done
echo ok
