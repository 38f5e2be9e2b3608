#!/usr/bin/env bash
# Clients that leave pdx-proxy at each phase of a disaggregated request,
# in each flow (concurrent, sequential, early-callback), in front of a
# prefill engine and a decode engine with their pdx-agents: while P
# prefills (before D said anything), mid-stream, and during a generation
# that is not streamed. After each, within a few seconds, neither engine
# holds a KV block or runs or queues a request, the engines counted the
# aborts (a request whose client left is never sent on to D), the proxy
# has nothing in flight and counted a 499, and a new request gets the
# same text as before. Then the admin API under load: pdx-bench runs
# through a proxy while a decode instance that has requests running is
# removed (it gets no new ones; those on it finish), added back, and a
# third one added: no request fails, every instance served, no KV block
# is left held. Clients that send a request and leave at once, closing or
# half-closing (shutdown SHUT_WR): with --notify-bind, their transfers
# count in no instance's load within 1 s (one whose legs never reached
# the engines counted in both until --transfer-timeout, 60 s). Last,
# clients that leave while their decode request is queued behind a full
# decode engine, P's answer given: P must not keep the prompt's KV
# blocks until the transfer times out.
#   proxy_abort.sh PDX_ENGINE PDX_AGENT PDX_PROXY PDX_BENCH
# shellcheck disable=SC2046 # settle takes idle's checks as words
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
# shellcheck disable=SC2034 # agent_start (lib.sh) reads it
AGENT=$2
PROXY=$3
BENCH=$4

# the agents report their transfers to the proxy XN (below)
notify="tcp://127.0.0.1:$(free_port)"
AGENT_OPTS+=(--notify "$notify")
# tiny at scale 10000: a decode step takes ~10 ms; P prefills in chunks
# of 32 tokens, so the 2000-token prompt below takes ~0.8 s there
pd_engine_start P prefill --time-scale 10000 --max-prefill-tokens 32
pd_engine_start D decode --time-scale 10000
named_engine_start C "$ENGINE" --time-scale 0
pools=(--prefill "127.0.0.1:$PORT_P" --decode "127.0.0.1:$PORT_D")
named_engine_start XC "$PROXY" "${pools[@]}" --flow concurrent
named_engine_start XS "$PROXY" "${pools[@]}" --flow sequential
named_engine_start XE "$PROXY" "${pools[@]}" --flow early-callback

# idle PROXY ENGINE...: checks for settle: the proxy has no request in
# flight, on no engine; the engines hold no KV block and run or queue no
# request.
idle() {
	proxy_idle "$@"
	shift
	engine_idle "$@"
}

# logs NAME...: the last lines of these processes' logs, for a failure.
logs() {
	local n
	for n in "$@"; do
		echo "--- $n:"
		tail -5 "$E2E_TMP/$n.log"
	done
}

long=$($PY -c "print(' '.join('w%d' % i for i in range(2000)))")
check="after the client left, ${long:0:600}"
want=$(text "$PORT_C" "$check" 12)
[ -n "$want" ] || fail "the colocated engine answered no text"

for xf in XC:concurrent XS:sequential XE:early-callback; do
	X=${xf%%:*}
	x=$(eval echo "\$PORT_$X")
	flow=${xf#*:}
	got=$(text "$x" "$check" 12)
	[ "$got" = "$want" ] || fail "$flow: text before the aborts: '$got', colocated '$want'"
	for phase in prefill stream whole; do
		p_ab=$(val "$PORT_P" "$(e requests_aborted_total)")
		p_fin=$(val "$PORT_P" "$(e requests_finished_total)")
		d_ab=$(val "$PORT_D" "$(e requests_aborted_total)")
		d_fin=$(val "$PORT_D" "$(e requests_finished_total)")
		d_tok=$(val "$PORT_D" "$(e prompt_tokens_total)")
		x_ab=$(val "$x" pdx_proxy_requests_aborted_total)
		x_499=$(val "$x" 'pdx_proxy_requests_total{code="499"}')
		$PY "$E2E_DIR/client.py" abort "$x" $phase "$PORT_P" "$PORT_D" $flow "$long" ||
			fail "$flow: a client leaving at $phase $(logs $X P D)"
		# P was aborted mid-prefill, or had answered; D was aborted,
		# or in the sequential flow never got the request
		if [ $phase = prefill ]; then
			p_ab=$((p_ab + 1))
			[ $flow = sequential ] || d_ab=$((d_ab + 1))
		else
			p_fin=$((p_fin + 1))
			d_ab=$((d_ab + 1))
		fi
		settle 5 $(idle $X P D) \
			"$x/pdx_proxy_requests_aborted_total=$((x_ab + 1))" \
			"$x/pdx_proxy_requests_total{code=\"499\"}=$((x_499 + 1))" \
			"$PORT_P/$(e requests_aborted_total)=$p_ab" \
			"$PORT_P/$(e requests_finished_total)=$p_fin" \
			"$PORT_D/$(e requests_aborted_total)=$d_ab" \
			"$PORT_D/$(e requests_finished_total)=$d_fin" ||
			fail "$flow: after a client left at $phase $(logs $X P D)"
		[ $flow != sequential ] || [ $phase != prefill ] ||
			[ "$(val "$PORT_D" "$(e prompt_tokens_total)")" = "$d_tok" ] ||
			fail "$flow: D got the request of a client that left during its prefill"
		got=$(text "$x" "$check" 12)
		[ "$got" = "$want" ] ||
			fail "$flow: text after a client left at $phase: '$got', want '$want'"
	done
done
# The sequential flow, its client gone as P's answer comes: the proxy
# is stopped while P prefills, P answers and the client leaves, then it
# runs on and meets both in one turn of its loop: P's answer starts D's
# leg, whose request is not yet written when the client's leaving
# cancels it. The proxy writes it, then closes: D sees the request and
# its client leave, aborts, and its agent frees P's KV at once (before:
# the request was dropped, D never heard of the transfer, and P held the
# prompt's KV for its lease, 10 s; 8 in 560 clients leaving near P's
# answer here). The loop meets P's answer first, as it came first
# (epoll's ready list keeps the order): the other order is the window
# docs/proxy.md leaves (P's leg cancelled after P ended), and would fail.
for i in 1 2 3; do
	p_fin=$(val "$PORT_P" "$(e requests_finished_total)")
	d_ab=$(val "$PORT_D" "$(e requests_aborted_total)")
	$PY - "$PORT_XS" "$PORT_P" "$PID_XS" "$p_fin" "$long" "$E2E_DIR" <<'PYEOF' || fail "sequential, a client gone at P's answer ($i)"
import json, os, signal, socket, sys, time
sys.path.insert(0, sys.argv[6])
from client import eng, until
x, p, pid, p_fin, prompt = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
b = json.dumps({"prompt": prompt, "max_tokens": 1000}).encode()
s = socket.create_connection(("127.0.0.1", int(x)))
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
          % len(b) + b)
until("P prefills", lambda: eng(p, "num_requests_running") == 1)
os.kill(pid, signal.SIGSTOP)
try:
    until("P answered", lambda: eng(p, "requests_finished_total") == p_fin + 1)
    s.close()
    time.sleep(0.2)
finally:
    os.kill(pid, signal.SIGCONT)
PYEOF
	settle 3 "$PORT_P/$(e kv_blocks_used)=0" \
		"$PORT_D/$(e requests_aborted_total)=$((d_ab + 1))" ||
		fail "sequential, a client gone at P's answer ($i): P's KV held, or D did not see the request $(logs XS P D)"
	settle 5 $(idle XS P D) || fail "sequential, a client gone at P's answer ($i): not idle $(logs XS P D)"
done
echo "ok: sequential: a client gone at P's answer: D sees the request and leaves, P's KV free at once"
for x in XC XS XE; do named_stop $x; done

# Clients that send a request and leave at once, most before its legs
# reach the engines: a transfer no engine announced is one no agent
# reports, and it counted in P's and D's load (least-loaded steered
# around them) until --transfer-timeout, 60 s.
named_engine_start XN "$PROXY" "${pools[@]}" --flow concurrent \
	--notify-bind "$notify"
# the agents' addresses known: the legs go out as the request comes
got=$(text "$PORT_XN" "$check" 12)
[ "$got" = "$want" ] || fail "XN: text '$got', colocated '$want'"
settle 5 $(idle XN P D) || fail "XN: the first request is not over"
$PY - "$PORT_XN" <<'PYEOF' || fail "clients that leave at once"
import socket, sys
port = int(sys.argv[1])
body = b'{"prompt": "gone at once", "max_tokens": 4}'
req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
       b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
       % len(body) + body)
for half in (False, True) * 4:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(req)
    if half:  # no more from us: the proxy takes it for a client gone
        s.shutdown(socket.SHUT_WR)
        s.settimeout(10)
        while s.recv(4096):
            pass
    s.close()
PYEOF
settle 1 "$PORT_XN/pdx_proxy_instance_transfers{$(instance P)}=0" \
	"$PORT_XN/pdx_proxy_instance_transfers{$(instance D)}=0" ||
	fail "the transfers of clients that left still count: $(curl -s "http://127.0.0.1:$PORT_XN/metrics" | grep -E 'instance_transfers|aborted')"
settle 5 $(idle XN P D) || fail "XN: after the clients that left at once $(logs XN P D)"
named_stop XN

# The admin API under load: while pdx-bench sends 240 requests, D2 is
# removed with requests running on it, added back, and D3 is added.
for x in D2 D3; do
	pd_engine_start $x decode --time-scale 10000
done
named_engine_start XA "$PROXY" "${pools[@]}" --decode "127.0.0.1:$PORT_D2" \
	--admin-token s3cret
u1=http://127.0.0.1:$PORT_D
u2=http://127.0.0.1:$PORT_D2
u3=http://127.0.0.1:$PORT_D3

# admin METHOD PATH [BODY]: the HTTP status; the body in $E2E_TMP/body.
admin() {
	curl -sS -o "$E2E_TMP/body" -w '%{http_code}' -X "$1" \
		-H 'Authorization: Bearer s3cret' ${3:+--data-binary "$3"} \
		"http://127.0.0.1:$PORT_XA$2" || fail "admin $1 $2"
}
# decoders: the decode pool's URLs, sorted, on one line.
decoders() {
	[ "$(admin GET /admin/instances)" = 200 ] || fail "admin list: $(cat "$E2E_TMP/body")"
	$PY -c 'import json, sys; print(" ".join(sorted(i["url"] for i in json.load(open(sys.argv[1]))["instances"] if i["role"] == "decode")))' \
		"$E2E_TMP/body"
}
sorted() { echo "$@" | tr ' ' '\n' | sort | tr '\n' ' ' | sed 's/ $//'; }
fin() { val "$(eval echo "\$PORT_$1")" "$(e requests_finished_total)"; }

n=240
d_fin0=$(fin D)
"$BENCH" --host 127.0.0.1 --port "$PORT_XA" --model tiny --dataset-name random \
	--random-input-len 32 --random-output-len 16 --num-prompts $n \
	--request-rate 40 --max-concurrency 16 --disable-tqdm \
	--save-result --result-dir "$E2E_TMP/res" >"$E2E_TMP/bench.out" 2>&1 &
bench=$!
E2E_PIDS="$E2E_PIDS $bench"

settle 10 "$PORT_D2/$(e num_requests_running)>=1" || fail "D2 runs no request under load"
[ "$(admin DELETE "/admin/instances?url=$u2")" = 200 ] || fail "remove D2: $(cat "$E2E_TMP/body")"
[ "$(decoders)" = "$u1" ] || fail "decode pool after the remove: $(decoders)"
# what runs on D2 finishes; then D2 gets nothing while D serves on
settle 5 "$PORT_D2/$(e num_requests_running)=0" "$PORT_D2/$(e num_requests_waiting)=0" ||
	fail "D2's requests did not finish after the remove"
d2_tok=$(val "$PORT_D2" "$(e prompt_tokens_total)")
settle 10 "$PORT_D/$(e requests_finished_total)>=$(($(fin D) + 10))" ||
	fail "D served no more requests after D2 was removed"
[ "$(val "$PORT_D2" "$(e prompt_tokens_total)")" = "$d2_tok" ] ||
	fail "D2 got requests after it was removed"
[ "$(admin POST /admin/instances "{\"role\": \"decode\", \"url\": \"$u2\"}")" = 201 ] ||
	fail "add D2 back: $(cat "$E2E_TMP/body")"
[ "$(admin POST /admin/instances "{\"role\": \"decode\", \"url\": \"$u3\"}")" = 201 ] ||
	fail "add D3: $(cat "$E2E_TMP/body")"
[ "$(decoders)" = "$(sorted $u1 $u2 $u3)" ] || fail "decode pool after the adds: $(decoders)"
# an engine of the prefill pool added to the decode pool: refused, as
# the command line refuses it (before: 201, and each request's pair
# shared one engine)
[ "$(admin POST /admin/instances "{\"role\": \"decode\", \"url\": \"127.0.0.1:$PORT_P\"}")" = 409 ] ||
	fail "P added to the decode pool: $(cat "$E2E_TMP/body")"
grep -q "is in the prefill pool: an engine is one or the other" "$E2E_TMP/body" ||
	fail "P added to the decode pool: $(cat "$E2E_TMP/body")"
settle 10 "$PORT_D2/$(e requests_finished_total)>=$(($(fin D2) + 5))" \
	"$PORT_D3/$(e requests_finished_total)>=5" ||
	fail "D2 added back and D3 added did not both serve"

wait $bench || fail "pdx-bench exited $?: $(tail -20 "$E2E_TMP/bench.out")"
f=$(ls "$E2E_TMP"/res/*.json) || fail "no pdx-bench result file"
$PY -c "import json; r = json.load(open('$f')); assert r['completed'] == $n and r['failed'] == 0, {k: r.get(k) for k in ('completed', 'failed', 'errors')}" ||
	fail "requests failed while decode instances were removed and added"
# each request finished once, on one of the decode engines
[ $(($(fin D) - d_fin0 + $(fin D2) + $(fin D3))) = $n ] ||
	fail "decode engines finished $(($(fin D) - d_fin0)) + $(fin D2) + $(fin D3) requests, want $n"
settle 5 $(idle XA P D D2 D3) \
	"$PORT_XA/pdx_proxy_requests_total{code=\"200\"}=$n" ||
	fail "after the load"

# D3 removed and added back at once (a DNS record that drops out and
# comes back) while requests run on it: it comes back with them counted
# (a fresh entry counted none, and least-loaded over-picked it)
# inflight_d3: D3's requests in flight, as the admin API lists them
inflight_d3() {
	[ "$(admin GET /admin/instances)" = 200 ] || fail "admin list: $(cat "$E2E_TMP/body")"
	$PY -c 'import json, sys; print([i["inflight"] for i in json.load(open(sys.argv[1]))["instances"] if i["url"] == sys.argv[2]][0])' \
		"$E2E_TMP/body" "$u3"
}
slow=""
for k in 1 2 3 4 5 6; do
	curl -sS -o /dev/null -H 'Content-Type: application/json' --data-binary \
		"{\"prompt\": [$k, 2, 3], \"max_tokens\": 200}" \
		"http://127.0.0.1:$PORT_XA/v1/completions" &
	slow="$slow $!"
done
E2E_PIDS="$E2E_PIDS $slow"
settle 10 "$PORT_D3/$(e num_requests_running)>=1" || fail "D3 runs none of the slow requests"
before=$(inflight_d3)
[ "$(admin DELETE "/admin/instances?url=$u3")" = 200 ] || fail "remove D3: $(cat "$E2E_TMP/body")"
[ "$(admin POST /admin/instances "{\"role\": \"decode\", \"url\": \"$u3\"}")" = 201 ] ||
	fail "add D3 back: $(cat "$E2E_TMP/body")"
after=$(inflight_d3)
[ "$before" -ge 1 ] && [ "$after" = "$before" ] ||
	fail "D3 added back: $after requests in flight listed, $before before the remove"
for pid in $slow; do wait "$pid"; done
[ "$(inflight_d3)" = 0 ] || fail "D3's requests finished: $(inflight_d3) still listed"
named_stop XA
for x in D D2 D3 C; do named_stop $x; done

# A client that leaves while its decode request waits in the queue of a
# full decode engine (DQ runs one request at a time and is busy), after
# P prefilled and answered: DQ drops the queued request, and P, which
# holds the prompt's KV for a transfer that cannot happen any more, frees
# it too: DQ's engine has its agent abort the transfer it never announced
# at P's agent (not only when the transfer times out: 5 s here, 30 s by
# default).
pd_engine_start DQ decode --time-scale 10000 --max-num-seqs 1
curl -sS -o /dev/null -d '{"prompt": "the one that runs", "max_tokens": 4000}' \
	"http://127.0.0.1:$PORT_DQ/v1/completions" 2>/dev/null &
busy=$!
E2E_PIDS="$E2E_PIDS $busy"
settle 5 "$PORT_DQ/$(e num_requests_running)=1" || fail "DQ runs no request"
for xf in QC:concurrent QS:sequential QE:early-callback; do
	X=${xf%%:*}
	flow=${xf#*:}
	named_engine_start $X "$PROXY" --prefill "127.0.0.1:$PORT_P" \
		--decode "127.0.0.1:$PORT_DQ" --flow $flow
	x=$(eval echo "\$PORT_$X")
	$PY "$E2E_DIR/client.py" abort "$x" queued "$PORT_P" "$PORT_DQ" $flow "$long" ||
		fail "$flow: a client leaving while D queues its request $(logs $X P DQ)"
	settle 2 $(idle $X P) "$PORT_DQ/$(e num_requests_waiting)=0" \
		"$x/pdx_proxy_requests_aborted_total=1" ||
		fail "$flow: held 2 s after a client left while D queued its request"
	named_stop $X
done
kill $busy
wait $busy 2>/dev/null
settle 5 "$PORT_DQ/$(e kv_blocks_used)=0" "$PORT_DQ/$(e num_requests_running)=0" ||
	fail "DQ runs on the request whose client left"
for x in DQ P; do named_stop $x; done
echo ok
