#!/usr/bin/env bash
# scripts/launch-xpyd with the binaries under test: 2 prefill + 2 decode
# instances behind the proxy answer completions and chat, whole, streamed
# and several at once, with a colocated engine's text; every engine served
# requests and holds no KV block afterwards; SIGTERM stops it all (exit
# 143, no process left). Then 1P1D with --netns, when root can make
# network namespaces: the agents meet over TCP, as separate hosts would,
# and the namespaces and links are gone afterwards.
#   xpyd.sh BUILD_DIR
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
BUILD=$(cd "$1" && pwd)
LAUNCH="$HERE/../../scripts/launch-xpyd"
ENGINE=$BUILD/engine/pdx-engine

left() { pgrep -f "^(ip netns exec [^ ]* )?$BUILD/(agent|engine|proxy)/pdx-" | grep -vx "${PID_C-}" || true; }
[ -z "$(left)" ] || fail "processes of $BUILD running before the test: $(left)"
named_engine_start C "$ENGINE" --time-scale 0

# launch TAG ARGS...: starts launch-xpyd in the background and waits for
# "ready"; its pid in XPID, the proxy's URL in XURL, the instances
# ("name role url" lines) in $E2E_TMP/TAG.inst.
launch() {
	local tag=$1
	shift
	"$LAUNCH" --build "$BUILD" --port 0 --time-scale 0 --out "$E2E_TMP/$tag" "$@" \
		>"$E2E_TMP/$tag.out" 2>"$E2E_TMP/$tag.err" &
	XPID=$!
	E2E_PIDS="$E2E_PIDS $XPID"
	for _ in $(seq 400); do
		grep -qx ready "$E2E_TMP/$tag.out" && break
		kill -0 $XPID 2>/dev/null || fail "$tag: launch-xpyd exited: $(tail -8 "$E2E_TMP/$tag.err")"
		sleep 0.1
	done
	grep -qx ready "$E2E_TMP/$tag.out" || fail "$tag: not ready in 40 s: $(cat "$E2E_TMP/$tag.err")"
	XURL=$(awk '$1 == "proxy" { print $3 }' "$E2E_TMP/$tag.out")
	awk '$2 == "prefill" || $2 == "decode" { print $1, $2, $3 }' "$E2E_TMP/$tag.out" \
		>"$E2E_TMP/$tag.inst"
	[ -n "$XURL" ] || fail "$tag: no proxy URL in the table: $(cat "$E2E_TMP/$tag.out")"
}

# colocated ROUTE BODY OUT: the colocated engine's answer.
colocated() {
	curl -sS -f -o "$3" -H 'Content-Type: application/json' --data-binary "$2" \
		"http://127.0.0.1:$PORT_C$1" || fail "colocated engine: $2"
}

# same TAG ROUTE REQUEST KIND MAX_TOKENS: the proxy answers as the
# colocated engine does, whole and streamed (REQUEST lacks its closing }).
same() {
	local tag=$1 route=$2 req=$3 kind=$4 n=$5 f=$E2E_TMP/$1_$RANDOM
	colocated "$route" "$req}" "$f.c.json"
	curl -sS -f -o "$f.x.json" -H 'Content-Type: application/json' \
		--data-binary "$req}" "$XURL$route" || fail "$tag: $req"
	py "import json; a=json.load(open('$f.c.json'))['choices'][0]; b=json.load(open('$f.x.json'))['choices'][0]; assert a.get('text', a.get('message')) == b.get('text', b.get('message')), (a, b)" \
		"$tag: disaggregated equals colocated: $req"
	curl -sS -f -N -H 'Content-Type: application/json' \
		-d "$req, \"stream\": true, \"stream_options\": {\"include_usage\": true}}" \
		"$XURL$route" >"$f.x.sse" || fail "$tag: stream $req"
	python3 "$HERE/sse_check.py" "$f.c.json" "$f.x.sse" "$kind" "$n" >/dev/null ||
		fail "$tag: stream vs colocated: $req"
	SENT=$((SENT + 2))
}

# at_once TAG N: N different completions through the proxy at once, each
# with the colocated text.
at_once() {
	local tag=$1 n=$2 i pids=""
	for i in $(seq "$n"); do
		echo "{\"prompt\": \"at once $i $RANDOM\", \"max_tokens\": $((i + 2))}" \
			>"$E2E_TMP/$tag.once$i.req"
		colocated /v1/completions "$(cat "$E2E_TMP/$tag.once$i.req")" "$E2E_TMP/$tag.once$i.c.json"
	done
	for i in $(seq "$n"); do
		curl -sS -f -o "$E2E_TMP/$tag.once$i.x.json" -H 'Content-Type: application/json' \
			--data-binary "$(cat "$E2E_TMP/$tag.once$i.req")" "$XURL/v1/completions" &
		pids="$pids $!"
	done
	for i in $pids; do wait "$i" || fail "$tag: a request sent at once failed"; done
	for i in $(seq "$n"); do
		py "import json; a=json.load(open('$E2E_TMP/$tag.once$i.c.json'))['choices'][0]['text']; b=json.load(open('$E2E_TMP/$tag.once$i.x.json'))['choices'][0]['text']; assert a == b, (a, b)" \
			"$tag: request $i of $n sent at once equals colocated"
	done
	SENT=$((SENT + n))
}

# requests TAG: the set of requests, each checked against the colocated
# engine; their number in SENT.
requests() {
	local tag=$1 k=0 p
	SENT=0
	for p in '"Hello, world!"' '"The quick brown fox jumps over the lazy dog again and again"' \
		'[1, 2, 3, 4, 5, 6, 7, 8, 9]' '"a"'; do
		k=$((k + 1))
		same "$tag" /v1/completions "{\"prompt\": $p, \"max_tokens\": $((k * 4))" text $((k * 4))
	done
	same "$tag" /v1/chat/completions \
		'{"messages": [{"role": "user", "content": "Tell me about KV caches"}], "max_tokens": 7' chat 7
	at_once "$tag" 6
}

# served TAG: every instance finished requests and, once they are done,
# holds no KV block; the proxy answered every request with 200.
served() {
	local tag=$1 name role url m
	while read -r name role url; do
		m=$E2E_TMP/$tag.$name.metrics
		for _ in $(seq 50); do
			curl -sS -f -o "$m" "$url/metrics" || fail "$tag: $name: GET $url/metrics"
			python3 "$HERE/promcheck.py" "$m" 'pdx_engine_kv_blocks_used{model_name="tiny"}=0' \
				2>/dev/null && break
			sleep 0.1
		done
		python3 "$HERE/promcheck.py" "$m" 'pdx_engine_kv_blocks_used{model_name="tiny"}=0' ||
			fail "$tag: $role engine $name holds KV blocks after the requests"
		py "import re; v = re.search(r'^pdx_engine_requests_finished_total\{model_name=\"tiny\"\} (\S+)$', open('$m').read(), re.M); assert v and float(v.group(1)) > 0, v" \
			"$tag: $role engine $name served requests"
	done <"$E2E_TMP/$tag.inst"
	curl -sS -f -o "$E2E_TMP/$tag.proxy.metrics" "$XURL/metrics" || fail "$tag: proxy metrics"
	python3 "$HERE/promcheck.py" "$E2E_TMP/$tag.proxy.metrics" \
		"pdx_proxy_requests_total{code=\"200\"}=$SENT" || fail "$tag: proxy metrics"
}

# stop TAG: SIGTERM: exit 143, every process it started gone, no process
# reported as failing (under ASan a leak is an exit status).
stop() {
	local tag=$1 kids rc p
	kids=$(pgrep -P "$XPID" | tr '\n' ' ')
	[ -n "$kids" ] || fail "$tag: launch-xpyd has no children"
	kill -TERM "$XPID"
	wait "$XPID"
	rc=$?
	[ $rc -eq 143 ] || fail "$tag: launch-xpyd exited $rc after SIGTERM, want 143: $(tail -5 "$E2E_TMP/$tag.err")"
	for p in $kids; do
		! kill -0 "$p" 2>/dev/null || fail "$tag: process $p ($(cat /proc/"$p"/cmdline | tr '\0' ' ')) left running"
	done
	[ -z "$(left)" ] || fail "$tag: processes left: $(left)"
	! grep -E "exited with|did not stop" "$E2E_TMP/$tag.err" ||
		fail "$tag: a process did not stop cleanly: $(cat "$E2E_TMP/$tag.err")"
}

launch xpyd --prefill 2 --decode 2
[ "$(grep -c ' prefill ' "$E2E_TMP/xpyd.inst")" = 2 ] &&
	[ "$(grep -c ' decode ' "$E2E_TMP/xpyd.inst")" = 2 ] ||
	fail "xpyd: want 2 prefill and 2 decode instances: $(cat "$E2E_TMP/xpyd.out")"
requests xpyd
served xpyd
stop xpyd

# --netns: only as root with ip netns that works
probe=pdxyprobe$$
if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null && ip netns add $probe 2>/dev/null; then
	ip netns del $probe
	launch netns --netns --prefill 1 --decode 1
	grep -q '^p0 .*http://10\.77\.[0-9]*\.1:[0-9]* *tcp://10\.77\.[0-9]*\.1:7100 ' "$E2E_TMP/netns.out" ||
		fail "netns: p0 is not in its namespace: $(cat "$E2E_TMP/netns.out")"
	requests netns
	served netns
	for s in p0 d0; do
		grep -q "peer tcp://10\.77\..*ready: .*data by ucx active messages" \
			"$E2E_TMP/netns/$s.agent.log" ||
			fail "netns: agent $s did not meet its peer over UCX tcp: $(grep peer "$E2E_TMP/netns/$s.agent.log")"
	done
	stop netns
	[ -z "$(ip netns list | grep "^pdxy$XPID-")" ] || fail "netns: namespaces left: $(ip netns list)"
	[ -z "$(ip -o link | grep "pdxy$XPID")" ] || fail "netns: links left: $(ip -o link | grep "pdxy$XPID")"
else
	echo "skip: --netns needs root and working ip netns"
fi
named_stop C
echo ok
