#!/usr/bin/env bash
# scripts/launch-xpyd with the binaries under test: 2 prefill + 2 decode
# instances behind the proxy answer completions and chat, whole, streamed
# and several at once, with a colocated engine's text; every engine served
# requests and holds no KV block afterwards, and the agents reported every
# transfer to the proxy; SIGTERM stops it all (exit 143, no process left).
# Prefix-aware routing keeps each prompt prefix on one prefill instance
# and spreads the prefixes. Then 1P1D with --netns, when root can make
# network namespaces: the agents meet over TCP, as separate hosts would,
# and the namespaces and links are gone afterwards. A second launch-xpyd
# given a running one's --out is refused. With --base-port the
# ports are N (notifications) and N+1.. (engines, agents) as its --help
# says; a decode agent killed (SIGKILL) is started again at its same
# address while every other process and the deployment stay up, and
# requests are served again. Then TP 2 -> 1 and 2 -> 2
# (--prefill-tp/--decode-tp): every rank its own engine and agent, served
# as above, a rank 1 agent restarted, and across namespaces; the last two
# end by a SIGKILL of launch-xpyd, which leaves no process, namespace or
# link behind.
#   xpyd.sh BUILD_DIR
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
BUILD=$(cd "$1" && pwd)
LAUNCH="$HERE/../../scripts/launch-xpyd"
ENGINE=$BUILD/engine/pdx-engine

left() { pgrep -f "^(ip netns exec [^ ]* )?$BUILD/(agent|engine|proxy)/pdx-" | grep -vx "${PID_C-}" || true; }
[ -z "$(left)" ] || fail "processes of $BUILD running before the test: $(left)"
named_engine_start C "$ENGINE" --time-scale 0
# an engine option it passes on (a bad model, time scale or pool size) is
# refused before anything starts, exit 2 with the engine's reason; it
# started every agent first and then exited 1
for bad in "--model nope" "--time-scale abc" "--kv-blocks 0"; do
	# shellcheck disable=SC2086
	"$LAUNCH" --build "$BUILD" --port 0 --out "$E2E_TMP/bad" $bad 2>"$E2E_TMP/bad.err" >/dev/null
	rc=$?
	[ $rc = 2 ] || fail "launch-xpyd $bad: exit $rc, want 2: $(tail -2 "$E2E_TMP/bad.err")"
	grep -q "launch-xpyd: pdx-engine: ${bad%% *}" "$E2E_TMP/bad.err" ||
		fail "launch-xpyd $bad: $(cat "$E2E_TMP/bad.err")"
	[ -z "$(ls "$E2E_TMP/bad" 2>/dev/null)" ] || fail "launch-xpyd $bad: started a run"
done

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
	XURL=$(awk '$1 == "proxy" { for (i = 2; i <= NF; i++) if ($i ~ /^http:/) print $i }' \
		"$E2E_TMP/$tag.out")
	awk '$2 == "prefill" || $2 == "decode" { print $1, $2, $3 }' "$E2E_TMP/$tag.out" \
		>"$E2E_TMP/$tag.inst"
	[ -n "$XURL" ] || fail "$tag: no proxy URL in the table: $(cat "$E2E_TMP/$tag.out")"
}

# colocated ROUTE BODY OUT: the colocated engine's answer.
colocated() {
	curl -sS -f -o "$3" -H 'Content-Type: application/json' --data-binary "$2" \
		"http://127.0.0.1:$PORT_C$1" || fail "colocated engine: $2"
}

# same TAG ROUTE REQUEST KIND MAX_TOKENS: the proxy's answer to REQUEST
# (without its closing }), whole and streamed, and the colocated engine's,
# listed in $E2E_TMP/TAG.pairs for check_pairs.
same() {
	local tag=$1 route=$2 req=$3 kind=$4 n=$5 f=$E2E_TMP/$1_$((E2E_SEQ += 1))
	colocated "$route" "$req}" "$f.c.json"
	curl -sS -f -o "$f.x.json" -H 'Content-Type: application/json' \
		--data-binary "$req}" "$XURL$route" || fail "$tag: $req"
	curl -sS -f -N -H 'Content-Type: application/json' \
		-d "$req, \"stream\": true, \"stream_options\": {\"include_usage\": true}}" \
		"$XURL$route" >"$f.x.sse" || fail "$tag: stream $req"
	echo "$f.c.json $f.x.json" >>"$E2E_TMP/$tag.pairs"
	echo "$f.c.json $f.x.sse $kind $n" >>"$E2E_TMP/$tag.pairs"
	SENT=$((SENT + 2))
}

# at_once TAG N: N different completions through the proxy at once.
at_once() {
	local tag=$1 n=$2 i pids="" f
	for i in $(seq "$n"); do
		f=$E2E_TMP/$tag.once$i
		echo "{\"prompt\": \"at once $i $RANDOM\", \"max_tokens\": $((i + 2))}" >"$f.req"
		colocated /v1/completions "$(cat "$f.req")" "$f.c.json"
		echo "$f.c.json $f.x.json" >>"$E2E_TMP/$tag.pairs"
	done
	for i in $(seq "$n"); do
		f=$E2E_TMP/$tag.once$i
		curl -sS -f -o "$f.x.json" -H 'Content-Type: application/json' \
			--data-binary "@$f.req" "$XURL/v1/completions" &
		pids="$pids $!"
	done
	for i in $pids; do wait "$i" || fail "$tag: a request sent at once failed"; done
	SENT=$((SENT + n))
}

# check_pairs TAG: each answer through the proxy has the colocated text
# (a stream: sse_check.py). One python3 for all: it can be slow to start.
check_pairs() {
	"$PY" - "$HERE/sse_check.py" "$E2E_TMP/$1.pairs" <<'PY' || fail "$1: disaggregated differs from colocated"
import contextlib, io, json, runpy, sys
sse, pairs = sys.argv[1:3]
for line in open(pairs):
    f = line.split()
    if len(f) == 2:
        a, b = (json.load(open(x))["choices"][0] for x in f)
        assert a.get("text", a.get("message")) == b.get("text", b.get("message")), (f, a, b)
    else:
        sys.argv = [sse] + f
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                runpy.run_path(sse, run_name="__main__")
        except AssertionError as e:
            sys.exit("%s: %r" % (f[1], e))
PY
}

# requests TAG: the set of requests; their number in SENT.
requests() {
	local tag=$1 k=0 p
	SENT=0
	: >"$E2E_TMP/$tag.pairs"
	for p in '"Hello, world!"' '"The quick brown fox jumps over the lazy dog again and again"' \
		'[1, 2, 3, 4, 5, 6, 7, 8, 9]' '"a"'; do
		k=$((k + 1))
		same "$tag" /v1/completions "{\"prompt\": $p, \"max_tokens\": $((k * 4))" text $((k * 4))
	done
	same "$tag" /v1/chat/completions \
		'{"messages": [{"role": "user", "content": "Tell me about KV caches"}], "max_tokens": 7' chat 7
	at_once "$tag" 6
	check_pairs "$tag"
}

# served TAG: every instance finished requests and, once they are done,
# holds no KV block (promcheck.py); the proxy answered every request
# with 200.
served() {
	"$PY" - "$HERE/promcheck.py" "$E2E_TMP/$1" "$XURL" "$SENT" <<'PY' ||
import re, runpy, sys, time, urllib.request
check, base, xurl, sent = sys.argv[1:5]
n = 0

def metrics(url, path, *want):
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        open(path, "wb").write(r.read())
    sys.argv = [check, path] + list(want)
    runpy.run_path(check, run_name="__main__")
    return open(path).read()

for line in open(base + ".inst"):
    name, role, url = line.split()
    n += 1
    for i in range(50):
        try:
            text = metrics(url, base + "." + name + ".metrics",
                           'pdx_engine_kv_blocks_used{model_name="tiny"}=0')
            break
        except AssertionError as e:
            if i == 49:
                sys.exit("%s engine %s holds KV blocks after the requests: %s" % (role, name, e))
            time.sleep(0.1)
    v = re.search(r'^pdx_engine_requests_finished_total\{model_name="tiny"\} (\S+)$', text, re.M)
    assert v and float(v.group(1)) > 0, "%s engine %s served no request" % (role, name)
assert n > 0, "no instances"
try:
    metrics(xurl, base + ".proxy.metrics", 'pdx_proxy_requests_total{code="200"}=' + sent)
except AssertionError as e:
    sys.exit("proxy: %s" % e)
# each transfer reported by both agents: none left counted
for i in range(50):
    text = metrics(xurl, base + ".proxy.metrics")
    left = [int(v) for v in re.findall(r'^pdx_proxy_instance_transfers\{.*\} (\d+)$', text, re.M)]
    heard = re.search(r'^pdx_proxy_transfer_notifications_total\{about="counted"\} (\d+)$', text, re.M)
    if left and not any(left) and heard and int(heard.group(1)) >= 2 * int(sent):
        break
    if i == 49:
        sys.exit("proxy: transfers not all reported: %s, %s" % (left, heard and heard.group(0)))
    time.sleep(0.1)
PY
		fail "$1: engines' and proxy's metrics"
}

# stop TAG: SIGTERM: exit 143, every process it started gone, no process
# reported as failing (under ASan a leak is an exit status).
stop() {
	local tag=$1 kids rc p
	kill -0 "$XPID" 2>/dev/null || { wait "$XPID"; fail "$tag: launch-xpyd exited early ($?): $(tail -8 "$E2E_TMP/$tag.err")"; }
	kids=$(pgrep -P "$XPID" | tr '\n' ' ')
	[ -n "$kids" ] || fail "$tag: launch-xpyd has no children"
	kill -TERM "$XPID"
	wait "$XPID"
	rc=$?
	[ $rc -eq 143 ] || fail "$tag: launch-xpyd exited $rc after SIGTERM, want 143: $(tail -5 "$E2E_TMP/$tag.err")"
	for p in $kids; do
		! kill -0 "$p" 2>/dev/null || fail "$tag: process $p ($(tr '\0' ' ' </proc/"$p"/cmdline)) left running"
	done
	[ -z "$(left)" ] || fail "$tag: processes left: $(left)"
	! grep -E "exited with|did not stop" "$E2E_TMP/$tag.err" ||
		fail "$tag: a process did not stop cleanly: $(cat "$E2E_TMP/$tag.err")"
}

# killed TAG: SIGKILL (no trap runs): within 10 s every process it
# started (an agent started again too) is gone, and its namespaces and
# links, as after a SIGTERM.
killed() {
	local tag=$1 kids p
	kids=$(pgrep -P "$XPID" | tr '\n' ' ')
	kill -KILL "$XPID"
	wait "$XPID" 2>/dev/null
	running() { # what is left: processes (not zombies), namespaces, links
		left
		for p in $kids; do
			grep -qs '^[0-9]* (.*) [^Z]' "/proc/$p/stat" && echo "$p ($(tr '\0' ' ' </proc/"$p"/cmdline))"
		done
		ip netns list 2>/dev/null | grep "^pdxy$XPID-"
		ip -o link 2>/dev/null | grep -E ": pdxy$XPID(br|[hn][0-9]+)[@:]"
	}
	for _ in $(seq 100); do
		[ -z "$(running)" ] && return
		sleep 0.1
	done
	fail "$tag: left 10 s after launch-xpyd's SIGKILL: $(running)"
}

launch xpyd --prefill 2 --decode 2
[ "$(grep -c ' prefill ' "$E2E_TMP/xpyd.inst")" = 2 ] &&
	[ "$(grep -c ' decode ' "$E2E_TMP/xpyd.inst")" = 2 ] ||
	fail "xpyd: want 2 prefill and 2 decode instances: $(cat "$E2E_TMP/xpyd.out")"
# a second deployment given this one's --out (both the default, say) is
# refused at once: it truncated and interleaved this one's logs
lines=$(wc -l <"$E2E_TMP/xpyd/proxy.log")
timeout 20 "$LAUNCH" --build "$BUILD" --port 0 --out "$E2E_TMP/xpyd" \
	>/dev/null 2>"$E2E_TMP/second.err"
rc=$?
[ $rc = 1 ] || fail "a second launch-xpyd with one --out: exit $rc, want 1: $(cat "$E2E_TMP/second.err")"
grep -q -- "--out $E2E_TMP/xpyd is in use by another run" "$E2E_TMP/second.err" ||
	fail "a second launch-xpyd with one --out: $(cat "$E2E_TMP/second.err")"
[ "$(wc -l <"$E2E_TMP/xpyd/proxy.log")" -ge "$lines" ] || fail "the first one's proxy log was truncated"
requests xpyd
served xpyd
stop xpyd

# --base-port: ports in the documented order; an agent killed is started
# again, the rest stay up
base=$("$PY" -c 'import random, socket
for _ in range(200):
    n = random.randrange(20000, 30000)
    ss = []
    try:
        for p in range(n, n + 7):
            s = socket.socket(); s.bind(("127.0.0.1", p)); ss.append(s)
    except OSError:
        continue
    print(n); break') || fail "no 7 free consecutive ports"
launch restart --prefill 1 --decode 2 --base-port "$base"
for want in "p0 http://127.0.0.1:$((base + 1)) tcp://127.0.0.1:$((base + 2))" \
	"d0 http://127.0.0.1:$((base + 3)) tcp://127.0.0.1:$((base + 4))" \
	"d1 http://127.0.0.1:$((base + 5)) tcp://127.0.0.1:$((base + 6))"; do
	awk '{ print $1, $3, $4 }' "$E2E_TMP/restart.out" | grep -qx "$want" ||
		fail "restart: --base-port $base: no \"$want\" in $(cat "$E2E_TMP/restart.out")"
done
grep -qx "notifications: tcp://127.0.0.1:$base" "$E2E_TMP/restart.out" ||
	fail "restart: notifications not at $base: $(cat "$E2E_TMP/restart.out")"
addr=tcp://127.0.0.1:$((base + 4))
agent() { pgrep -P "$XPID" -f "pdx-agent .*--listen $addr( |\$)" || true; }
old=$(agent)
[ -n "$old" ] || fail "restart: no agent listening at $addr among $(pgrep -aP "$XPID")"
# its programs (its loop's own sleeps come and go)
mine() { pgrep -P "$XPID" -f '/pdx-(agent|engine|proxy) ' | grep -vx "$1" | sort | tr '\n' ' '; }
others=$(mine "$old")
kill -9 "$old"
for _ in $(seq 100); do
	new=$(agent)
	[ -n "$new" ] && [ "$new" != "$old" ] && break
	kill -0 "$XPID" 2>/dev/null || fail "restart: launch-xpyd exited after the agent's kill: $(tail -8 "$E2E_TMP/restart.err")"
	sleep 0.1
done
[ -n "$new" ] && [ "$new" != "$old" ] ||
	fail "restart: the killed agent was not started again at $addr within 10 s: $(tail -5 "$E2E_TMP/restart.err")"
grep -q "agent_d0 (pid $old) died (status 137)" "$E2E_TMP/restart.err" ||
	fail "restart: the restart is not reported: $(cat "$E2E_TMP/restart.err")"
[ "$(mine "$new")" = "$others" ] ||
	fail "restart: other processes changed: $others -> $(mine "$new")"
curl -sf -o /dev/null --max-time 5 "$XURL/ready" || fail "restart: the proxy is not ready"
# served again: once the engine has registered with its new agent
ok=0
for _ in $(seq 100); do
	curl -sf -o /dev/null --max-time 10 -H 'Content-Type: application/json' \
		-d '{"prompt": "after the restart", "max_tokens": 4}' "$XURL/v1/completions" &&
		{ ok=$((ok + 1)); [ $ok -ge 4 ] && break; }
	sleep 0.1
done
[ $ok -ge 4 ] || fail "restart: requests fail after the agent's restart: $(tail -5 "$E2E_TMP/restart/d0.agent.log")"
# two agents killed 0.3 s apart, the second during the first's backoff:
# both started again (before: the second's death, reaped while the
# script slept, was never seen, "wait: no such job", and its engine
# stayed without an agent for good)
a1=$(agent) addr=tcp://127.0.0.1:$((base + 6)) a2=$(agent)
[ -n "$a1" ] && [ -n "$a2" ] || fail "restart: d0's or d1's agent not found"
kill -9 "$a1"
sleep 0.3
kill -9 "$a2"
for _ in $(seq 100); do
	n2=$(agent)
	addr=tcp://127.0.0.1:$((base + 4)) n1=$(agent)
	addr=tcp://127.0.0.1:$((base + 6))
	[ -n "$n1" ] && [ "$n1" != "$a1" ] && [ -n "$n2" ] && [ "$n2" != "$a2" ] && break
	sleep 0.1
done
[ -n "$n1" ] && [ "$n1" != "$a1" ] && [ -n "$n2" ] && [ "$n2" != "$a2" ] ||
	fail "restart: of two agents killed 0.3 s apart, not both started again within 10 s: $(tail -5 "$E2E_TMP/restart.err")"
stop restart

# prefix-aware: 12 prefixes (longer than the proxy's 1024-byte key), 3
# requests each with different endings, one at a time; which prefill
# instance served a request is read from its finished-requests counter
launch prefix --prefill 2 --decode 1 --policy-p prefix-aware
"$PY" - "$XURL" "$E2E_TMP/prefix.inst" <<'PY' || fail "prefix-aware routing"
import json, re, sys, time, urllib.request
xurl, inst = sys.argv[1:3]
ps = [l.split()[2] for l in open(inst) if l.split()[1] == "prefill"]

def finished(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return float(re.search(r'^pdx_engine_requests_finished_total\{[^}]*\} (\S+)$', text, re.M).group(1))

def proxy_idle():
    """No request in flight and every transfer reported: the proxy's
    load is 0 everywhere, so the choice is the prefix's alone (under load
    unreported transfers could make it spill to its second choice)."""
    text = urllib.request.urlopen(xurl + "/metrics", timeout=5).read().decode()
    return all(float(v) == 0 for v in re.findall(
        r'^pdx_proxy_instance_(?:inflight|transfers)\{[^}]*\} (\S+)$', text, re.M))

used = set()
for k in range(12):
    prefix = ("system prompt %d: " % k) + "be brief and exact. " * 60
    where = set()
    for j in range(3):
        deadline = time.monotonic() + 5
        while not proxy_idle() and time.monotonic() < deadline:
            time.sleep(0.02)
        before = [finished(u) for u in ps]
        body = json.dumps({"prompt": prefix + "question %d" % j, "max_tokens": 2}).encode()
        urllib.request.urlopen(urllib.request.Request(xurl + "/v1/completions", body,
            {"Content-Type": "application/json"}), timeout=10).read()
        # the client's answer comes from the decode side: the prefill
        # engine may count its request finished a little later
        deadline = time.monotonic() + 5
        while sum(finished(u) for u in ps) <= sum(before) and time.monotonic() < deadline:
            time.sleep(0.02)
        grew = [i for i, u in enumerate(ps) if finished(u) > before[i]]
        assert len(grew) == 1, grew
        where.add(grew[0])
    assert len(where) == 1, "prefix %d went to %s" % (k, where)
    used |= where
assert used == {0, 1}, "every prefix on one instance: %s" % used
PY
stop prefix

# tensor parallelism: one prefill and one decode instance of two ranks
# each, every rank a pdx-engine with its own agent; the proxy knows rank
# 0 only. A rank 1 agent killed is started again, and requests are
# served again. Different TP sizes serve too (the agents reshard).
launch tp21 --prefill-tp 2 --decode-tp 1
requests tp21
served tp21
stop tp21
launch tp --prefill-tp 2 --decode-tp 2
for r in "p0r1 rank1-of-p0" "d0r1 rank1-of-d0"; do
	awk '$3 == "-" && $4 ~ /^tcp:/ { print $1, $2 }' "$E2E_TMP/tp.out" | grep -qx "$r" ||
		fail "tp: no row \"$r\" in $(cat "$E2E_TMP/tp.out")"
done
[ "$(wc -l <"$E2E_TMP/tp.inst")" = 2 ] || fail "tp: want 2 instances: $(cat "$E2E_TMP/tp.inst")"
grep -q "tensor-parallel rank 1 of 2" "$E2E_TMP/tp/d0r1.engine.log" ||
	fail "tp: d0r1 is no rank 1: $(tail -3 "$E2E_TMP/tp/d0r1.engine.log")"
requests tp
served tp
addr=$(awk '$1 == "d0r1" { print $4 }' "$E2E_TMP/tp.out")
old=$(agent)
[ -n "$old" ] || fail "tp: no agent listening at $addr"
kill -9 "$old"
for _ in $(seq 100); do
	new=$(agent)
	[ -n "$new" ] && [ "$new" != "$old" ] && break
	sleep 0.1
done
[ -n "$new" ] && [ "$new" != "$old" ] || fail "tp: d0r1's agent was not started again: $(tail -5 "$E2E_TMP/tp.err")"
ok=0
for _ in $(seq 100); do
	curl -sf -o /dev/null --max-time 10 -H 'Content-Type: application/json' \
		-d '{"prompt": "after the rank 1 agent restart", "max_tokens": 4}' "$XURL/v1/completions" &&
		{ ok=$((ok + 1)); [ $ok -ge 4 ] && break; }
	sleep 0.1
done
[ $ok -ge 4 ] || fail "tp: requests fail after d0r1's agent restart: $(tail -5 "$E2E_TMP/tp/d0r1.engine.log")"
killed tp

# --netns: only as root where ip netns works
netns_works() {
	local probe=pdxyprobe$$ rc
	[ "$(id -u)" -eq 0 ] && command -v ip >/dev/null || return 1
	ip netns add $probe 2>/dev/null || return 1
	ip netns exec $probe true 2>/dev/null
	rc=$?
	ip netns del $probe
	return $rc
}
if netns_works; then
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
	! ip netns list | grep -q "^pdxy$XPID-" || fail "netns: namespaces left: $(ip netns list)"
	! ip -o link | grep -q "pdxy$XPID" || fail "netns: links left: $(ip -o link | grep "pdxy$XPID")"
	# TP 2 -> 2 across namespaces: rank r's agents meet on port 7100+r
	launch netnstp --netns --prefill-tp 2 --decode-tp 2
	grep -q '^d0r1 .*tcp://10\.77\.[0-9]*\.2:7101 ' "$E2E_TMP/netnstp.out" ||
		fail "netnstp: d0r1's agent: $(cat "$E2E_TMP/netnstp.out")"
	requests netnstp
	served netnstp
	grep -q "peer tcp://10\.77\.[0-9]*\.1:7101 ready" "$E2E_TMP/netnstp/d0r1.agent.log" ||
		fail "netnstp: d0r1's agent did not meet p0r1's: $(grep peer "$E2E_TMP/netnstp/d0r1.agent.log")"
	# another deployment's, whose pid begins with this one's: its
	# watchdog leaves them be
	ip netns add "pdxy${XPID}0-p0" && ip link add "pdxy${XPID}0br" type bridge ||
		fail "netnstp: cannot make the other deployment's namespace and bridge"
	killed netnstp
	sleep 1 # its link loop, which may reach the other's last, is over
	other=$(ip netns list | grep -c "^pdxy${XPID}0-p0")$(ip -o link | grep -c ": pdxy${XPID}0br:")
	ip netns del "pdxy${XPID}0-p0"
	ip link del "pdxy${XPID}0br"
	[ "$other" = 11 ] || fail "netnstp: launch-xpyd's watchdog removed pdxy${XPID}0's namespace or bridge ($other)"
else
	echo "skip: --netns needs root and working ip netns"
fi
named_stop C
echo ok
