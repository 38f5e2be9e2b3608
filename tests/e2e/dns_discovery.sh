#!/usr/bin/env bash
# pdx-proxy finding its decode instances through DNS (--decode-dns), as
# behind a Kubernetes headless Service: dnsmasq on a free loopback port
# serves A records of one name (TTL 1 s) for pdx-engines on 127.0.0.2,
# .3, .4, all on one port. While pdx-bench drives load through the proxy:
#  * the instances of the records are in the pool at start; one added
#    through the admin API stays beside them, untouched by DNS;
#  * an address added to the records gets requests within one
#    --dns-interval (here sooner: the records' TTL);
#  * an address removed from the records while it has requests running
#    is drained: those finish, no new ones go there, no request fails;
#  * a name that stops resolving (NXDOMAIN) keeps the last instances,
#    counts pdx_proxy_dns_resolve_failures_total and logs it once; when
#    it resolves again its records rule again.
# A second proxy finds its instances through SRV records (a name without
# a port): one whose target is that name (on the engines' port), one
# whose target is another host on a port of its own; it follows the same
# changes. A third follows an SRV name one of whose targets is served by
# another nameserver (dnsmasq forwards flaky.test there): once that
# server is gone the target's queries go unanswered, and the round keeps
# its instances rather than draining them.
# Skips (77) where dnsmasq is missing or cannot run.
#   dns_discovery.sh PDX_ENGINE PDX_PROXY PDX_BENCH
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
PROXY=$2
BENCH=$3

# bad names and nameservers are bad command lines (exit 2)
for bad in "--decode-dns a:b:c" "--prefill-dns a..b" "--dns-server ns.example" \
	"--dns-server 127.0.0.1:99999"; do
	# shellcheck disable=SC2086 # the option and its value
	timeout 10 "$PROXY" --port 0 $bad >/dev/null 2>"$E2E_TMP/bad.log"
	rc=$?
	[ $rc = 2 ] && grep -q want "$E2E_TMP/bad.log" ||
		fail "'$bad': exit $rc, want 2 with the reason: $(cat "$E2E_TMP/bad.log")"
done

DNSMASQ=$(command -v dnsmasq || echo /usr/sbin/dnsmasq)
if [ ! -x "$DNSMASQ" ]; then
	echo "dnsmasq is not installed (Debian: dnsmasq-base): skipped"
	exit 77
fi

# dnsmasq on a free port, local names only, every answer with TTL 1 s;
# it re-reads the hosts file on SIGHUP. The engines' port (A records
# carry no port), and another one for the SRV record of other.pdx.test.
hosts=$E2E_TMP/hosts
dp=$(free_port)
ep=$(free_port)
op=$(free_port)
srv=_http._tcp.srv.pdx.test
records() {
	local ip
	: >"$hosts.new"
	echo "127.0.0.6 other.pdx.test" >>"$hosts.new"
	for ip in "$@"; do echo "$ip decode.pdx.test" >>"$hosts.new"; done
	mv "$hosts.new" "$hosts"
	[ -n "${PID_DNS:-}" ] && kill -HUP "$PID_DNS"
	return 0
}
chmod 755 "$E2E_TMP" # dnsmasq may read it as another user
records 127.0.0.2 127.0.0.3
# the flaky nameserver: x.flaky.test's one A record
fp=$(free_port)
flaky=_http._tcp.flaky.pdx.test
bg_start FL "$DNSMASQ" --no-daemon --conf-file=/dev/null --pid-file= \
	--user="$(id -un)" --port="$fp" --listen-address=127.0.0.1 \
	--bind-interfaces --no-resolv --no-hosts --local=/flaky.test/ \
	--host-record=x.flaky.test,127.0.0.7 --local-ttl=1
bg_start DNS "$DNSMASQ" --no-daemon --conf-file=/dev/null --pid-file= \
	--user="$(id -un)" --port="$dp" --listen-address=127.0.0.1 \
	--bind-interfaces --no-resolv --no-hosts --local=/pdx.test/ \
	--addn-hosts="$hosts" --local-ttl=1 \
	--srv-host="$srv,decode.pdx.test,$ep" --srv-host="$srv,other.pdx.test,$op" \
	--srv-host="$flaky,other.pdx.test,$op" --srv-host="$flaky,x.flaky.test,$op" \
	--server="/flaky.test/127.0.0.1#$fp"
for _ in $(seq 100); do
	grep -q "read $hosts" "$E2E_TMP/DNS.log" && break
	if ! kill -0 "$PID_DNS" 2>/dev/null; then
		echo "dnsmasq cannot run here: $(tail -1 "$E2E_TMP/DNS.log"): skipped"
		exit 77
	fi
	sleep 0.1
done
grep -q "read $hosts" "$E2E_TMP/DNS.log" || fail "dnsmasq did not read $hosts"

# the engines: one port for all, one loopback address each; tiny at
# scale 10000: a decode step takes ~10 ms
at() { echo "http://$1:$ep"; }
# mval IP NAME: engine IP's sample NAME
mval() {
	curl -sS "$(at "$1")/metrics" |
		awk -v n="$(e "$2")" '$1 == n { v = $2 } END { print v == "" ? 0 : v }'
}
for d in D1:127.0.0.2 D2:127.0.0.3 D3:127.0.0.4 DA:127.0.0.5; do
	bg_start "${d%%:*}" "$ENGINE" --host "${d#*:}" --port "$ep" --time-scale 10000
done
for ip in 127.0.0.2 127.0.0.3 127.0.0.4 127.0.0.5; do
	for _ in $(seq 100); do
		[ "$(curl -s -o /dev/null -w '%{http_code}' "$(at $ip)/health")" = 200 ] && break
		sleep 0.1
	done
	[ "$(curl -s -o /dev/null -w '%{http_code}' "$(at $ip)/health")" = 200 ] ||
		fail "the engine on $ip:$ep did not start: $(tail -3 "$E2E_TMP"/D*.log)"
done

name="decode.pdx.test:$ep"
named_engine_start X "$PROXY" --decode-dns "$name" --dns-server "127.0.0.1:$dp" \
	--dns-interval 5 --admin-token s3cret
x=$PORT_X
dns_n="$x/pdx_proxy_dns_instances{role=\"decode\",name=\"$name\"}"
pool_n="$x/pdx_proxy_instances{role=\"decode\"}"
fails="pdx_proxy_dns_resolve_failures_total{role=\"decode\",name=\"$name\"}"
# served IP: the proxy's count of requests sent to the instance on IP
served() { val "$x" "pdx_proxy_instance_requests_total{role=\"decode\",instance=\"$(at "$1")\"}"; }

settle 5 "$dns_n=2" "$pool_n=2" || fail "the records' instances are not in the pool"
# the SRV proxy: no requests go through it, so no health checks either
named_engine_start Y "$PROXY" --decode-dns "$srv" --dns-server "127.0.0.1:$dp" \
	--health-interval 0
srv_n="$PORT_Y/pdx_proxy_dns_instances{role=\"decode\",name=\"$srv\"}"
settle 5 "$srv_n=3" \
	"$PORT_Y/pdx_proxy_instance_requests_total{role=\"decode\",instance=\"http://127.0.0.6:$op\"}=0" \
	"$PORT_Y/pdx_proxy_instance_requests_total{role=\"decode\",instance=\"$(at 127.0.0.3)\"}=0" ||
	fail "the SRV records' instances are not in the pool"
named_engine_start Z "$PROXY" --decode-dns "$flaky" --dns-server "127.0.0.1:$dp" \
	--health-interval 0 --dns-interval 1
flaky_n="$PORT_Z/pdx_proxy_dns_instances{role=\"decode\",name=\"$flaky\"}"
settle 5 "$flaky_n=2" \
	"$PORT_Z/pdx_proxy_instance_requests_total{role=\"decode\",instance=\"http://127.0.0.7:$op\"}=0" ||
	fail "the instance of the target on the other nameserver is not in the pool"
# A short name through resolv.conf's search list, as in a pod
# (docs/kubernetes.md: --decode-dns pdx-decode:8100 with `search
# NS.svc.cluster.local svc.cluster.local cluster.local`, ndots:5): the
# records of decode.pdx.test under "decode", none under the first
# domain; no AAAA records, and the name as given is refused (this
# dnsmasq forwards nowhere, as a cluster DNS whose upstream refuses).
# The A records rule, every round (the AAAA query went on to the name as
# given, refused: every round failed, no instance was ever added).
if [ "$(id -u)" -eq 0 ] && unshare -m true 2>/dev/null; then
	printf 'nameserver 127.0.0.1:%s\nsearch svc.pdx.test pdx.test\noptions ndots:5\n' \
		"$dp" >"$E2E_TMP/resolv.conf"
	# shellcheck disable=SC2016 # for the inner sh
	named_engine_start K unshare -m sh -c 'mount --bind "$0" /etc/resolv.conf && exec "$@"' \
		"$E2E_TMP/resolv.conf" "$PROXY" --decode-dns "decode:$ep" --health-interval 0 \
		--dns-interval 1
	short="decode:$ep"
	settle 5 "$PORT_K/pdx_proxy_dns_instances{role=\"decode\",name=\"$short\"}=2" ||
		fail "decode:$ep through the search list: $(grep dns "$E2E_TMP/K.log" | tail -2)"
	sleep 2 # two rounds more
	[ "$(val "$PORT_K" "pdx_proxy_dns_resolve_failures_total{role=\"decode\",name=\"$short\"}")" = 0 ] ||
		fail "rounds of decode:$ep failed: $(grep dns "$E2E_TMP/K.log" | tail -2)"
	named_stop K
else
	echo "not root, or no unshare -m: the search list of resolv.conf not checked"
fi
curl -sS -o "$E2E_TMP/body" -w '%{http_code}' -H 'Authorization: Bearer s3cret' \
	--data-binary "{\"role\": \"decode\", \"url\": \"$(at 127.0.0.5)\"}" \
	"http://127.0.0.1:$x/admin/instances" >"$E2E_TMP/status" || fail "admin add"
status_is 201 "the admin API adds an instance beside DNS"
settle 3 "$pool_n=3" || fail "the admin API's instance is not in the pool"

n=300
"$BENCH" --host 127.0.0.1 --port "$x" --model tiny --dataset-name random \
	--random-input-len 32 --random-output-len 16 --num-prompts $n \
	--request-rate 40 --max-concurrency 16 --disable-tqdm \
	--save-result --result-dir "$E2E_TMP/res" >"$E2E_TMP/bench.out" 2>&1 &
bench=$!
E2E_PIDS="$E2E_PIDS $bench"

# added to the records: in rotation within the interval (5 s); the TTL
# (1 s) has it asked sooner
settle 10 "$x/pdx_proxy_requests_total{code=\"200\"}>=10" || fail "no load through the proxy"
records 127.0.0.2 127.0.0.3 127.0.0.4
settle 4 "$x/pdx_proxy_instance_requests_total{role=\"decode\",instance=\"$(at 127.0.0.4)\"}>=1" ||
	fail "127.0.0.4 added to the records got no request within 4 s: $(tail -3 "$E2E_TMP/X.log")"
settle 1 "$dns_n=3" "$pool_n=4" || fail "the pool after the add"
settle 3 "$srv_n=4" || fail "the SRV proxy's pool after the add"

# removed from the records while it runs requests: drained
d1="$x/pdx_proxy_instance_inflight{role=\"decode\",instance=\"$(at 127.0.0.2)\"}"
settle 10 "$d1>=1" || fail "127.0.0.2 runs no request under load"
records 127.0.0.3 127.0.0.4
settle 4 "$dns_n=2" "$pool_n=3" "$srv_n=3" || fail "127.0.0.2 left the records but not the pool"
grep -q "$name: decode instance $(at 127.0.0.2) left the records" "$E2E_TMP/X.log" ||
	fail "the removal is not logged: $(tail -3 "$E2E_TMP/X.log")"
for _ in $(seq 100); do
	[ "$(mval 127.0.0.2 num_requests_running)" = 0 ] && break
	sleep 0.05
done
[ "$(mval 127.0.0.2 num_requests_running)" = 0 ] || fail "127.0.0.2's requests did not finish"
d1_fin=$(mval 127.0.0.2 requests_finished_total)
d2=$(served 127.0.0.3)
settle 10 "$x/pdx_proxy_instance_requests_total{role=\"decode\",instance=\"$(at 127.0.0.3)\"}>=$((d2 + 10))" ||
	fail "the instances left served no more requests"
[ "$(mval 127.0.0.2 requests_finished_total)" = "$d1_fin" ] &&
	[ "$(mval 127.0.0.2 num_requests_running)" = 0 ] ||
	fail "127.0.0.2 got requests after it left the records"

wait $bench || fail "pdx-bench exited $?: $(tail -20 "$E2E_TMP/bench.out")"
f=$(ls "$E2E_TMP"/res/*.json) || fail "no pdx-bench result file"
$PY -c "import json; r = json.load(open('$f')); assert r['completed'] == $n and r['failed'] == 0, {k: r.get(k) for k in ('completed', 'failed', 'errors')}" ||
	fail "requests failed while instances came and went through DNS"
fin=0
for ip in 127.0.0.2 127.0.0.3 127.0.0.4 127.0.0.5; do
	v=$(mval $ip requests_finished_total)
	[ "$v" -gt 0 ] || fail "the engine on $ip served no request"
	fin=$((fin + v))
done
[ "$fin" = "$n" ] || fail "the engines finished $fin requests, want $n"
settle 5 "$x/pdx_proxy_requests_total{code=\"200\"}=$n" "$x/pdx_proxy_requests_inflight=0" ||
	fail "after the load"

# the name stops resolving: the last instances stay, failures counted,
# logged once; then it resolves again and its records rule again
records
# a failed round is tried again an interval later
settle 9 "$x/$fails>=2" || fail "NXDOMAIN rounds not counted"
settle 1 "$dns_n=2" "$pool_n=3" || fail "the last instances were not kept"
# (the SRV name still resolves: its target with no address is gone)
settle 1 "$srv_n=1" || fail "the SRV proxy's pool while decode.pdx.test has no address"
[ "$(grep -c "$name: no address" "$E2E_TMP/X.log")" = 1 ] ||
	fail "a name that does not resolve is not logged once: $(grep "$name: no address" "$E2E_TMP/X.log")"
# asked again an interval after the last failed round
records 127.0.0.4
settle 8 "$dns_n=1" "$pool_n=2" "$srv_n=2" || fail "the pool once the name resolves again"
grep -q "$name: resolves again" "$E2E_TMP/X.log" || fail "resolving again is not logged"
[ "$(text "$x" "after DNS" 4)" != "" ] || fail "no answer through the proxy"

# one target's nameserver gone: its queries go unanswered (dnsmasq
# refuses or times out), and the round keeps both instances
named_stop FL
zfails="$PORT_Z/pdx_proxy_dns_resolve_failures_total{role=\"decode\",name=\"$flaky\"}"
settle 15 "$zfails>=2" || fail "rounds with a target unanswered not counted as failed: $(tail -3 "$E2E_TMP/Z.log")"
settle 1 "$flaky_n=2" || fail "a target whose queries went unanswered was drained"
grep -q "$flaky: a query went unanswered" "$E2E_TMP/Z.log" ||
	fail "the unanswered target is not logged: $(tail -3 "$E2E_TMP/Z.log")"

named_stop X
named_stop Y
named_stop Z
for d in D1 D2 D3 DA; do named_stop $d; done
echo ok
