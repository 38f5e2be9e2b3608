#!/usr/bin/env bash
# What a decode leg says about the prefill side, in the concurrent flow,
# with stand-ins for P and D (HTTP servers that answer as those engines
# do, since the real ones race only now and then):
#  * P fails on D's account (pdx-engine's 502 with X-PDX-Failed-Side:
#    peer: the transfer aborted by D's engine, which refused the request,
#    a prompt past its context, say, and answers 400 itself). The two
#    race; the client must get D's 400, which says why. It got P's 502
#    whenever P's came first (seen in CI: one request in 20 of proxy_pd's
#    "over D's context"). A D that says nothing is waited for a moment
#    only: the client gets P's failure about a second later.
#  * D fails on P's account (its 502 with X-PDX-Failed-Side: peer: the
#    sender's engine went away mid-transfer, as a killed follower rank of
#    a TP prefill instance makes it, its leader still up and answering
#    200 later): retried as the prefill instance's failure it is, on
#    another prefill instance, with one decode instance only; with one
#    prefill instance and two decode ones it is not retried, D's 502
#    relayed with its reason. Before, the check on D's answer asked D's
#    pool for another instance and the retry P's: the first answered the
#    502 (no retry), the second "decode instance ... answered 502", the
#    reason dropped.
#  * the agents refuse to pair (both engines' 502 with X-PDX-Failed-Side:
#    both, a decode instance of another model), the only prefill
#    instance's 502 first: the retry avoids the decode instance, the one
#    that has another of its role, and the request is served. Before, the
#    one whose 502 came first was avoided: the only prefill instance, so
#    no retry, and the client got the 502 that another decode instance
#    would have served (proxy_resilience met it now and then).
#   proxy_decode_says.sh PDX_PROXY
. "$(dirname "$0")/lib.sh"
PROXY=$1

cat >"$E2E_TMP/pd.py" <<'PYEOF'
import json, socketserver, sys, threading, time
from http.server import BaseHTTPRequestHandler, HTTPServer

# name -> the port of its agent in /v1/pdx/info (nobody listens there)
AGENT = {"P": 9, "D": 10, "P1": 11, "P2": 12, "D1": 13, "D2": 14,
         "PB": 15, "DW": 16, "DG": 17}
PEER_FAILED = [("X-PDX-Failed-Side", "peer")]
BOTH_FAILED = [("X-PDX-Failed-Side", "both")]
NO_PAIR = "peer tcp://127.0.0.1:16 refused: layout differs: layers 28 != 4"

def error(code, kind, message):
    return {"error": {"message": message, "type": kind, "param": None,
                      "code": code}}

def server(name, slow):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def reply(self, code, obj, headers=()):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the proxy cancelled this leg (a retry)
        def do_GET(self):
            if self.path == "/v1/pdx/info":
                self.reply(200, {"peer_addr": "tcp://127.0.0.1:%d" % AGENT[name]})
            else:
                self.reply(200, {"status": "ok"})
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if name == "P":  # fails on D's account, at once
                self.reply(502, error(502, "kv_transfer_failed",
                    "KV transfer 00: aborted by tcp://127.0.0.1:10: aborted "
                    "by its engine before it began"), PEER_FAILED)
            elif name == "D":  # refuses the request, after a while
                with open(slow) as f:
                    time.sleep(float(f.read() or 0))
                self.reply(400, error(400, "invalid_request_error",
                    "prompt (9000 tokens) + max_tokens pass the context"))
            elif name == "PB":  # refuses DW's agent at once, else serves
                if b'"tcp://127.0.0.1:16"' in body:
                    self.reply(502, error(502, "kv_transfer_failed", NO_PAIR),
                               BOTH_FAILED)
                else:
                    time.sleep(0.3)
                    self.reply(200, {"choices": [{"index": 0, "text": "x"}]})
            elif name == "DW":  # of another model: refuses, after PB
                time.sleep(0.3)
                self.reply(502, error(502, "kv_transfer_failed", NO_PAIR),
                           BOTH_FAILED)
            elif name.startswith("P"):  # answers after D's failure
                time.sleep(0.5)
                self.reply(200, {"choices": [{"index": 0, "text": "x"}]})
            elif b'"tcp://127.0.0.1:11"' in body:  # D1, D2: P1's KV fails
                self.reply(502, error(502, "kv_transfer_failed",
                    "KV transfer 00: from rank 1 of TP 2: aborted by "
                    "tcp://127.0.0.1:11: engine gone"), PEER_FAILED)
            else:
                self.reply(200, {"id": "cmpl-1", "object": "text_completion",
                                 "choices": [{"index": 0, "text": "decoded",
                                              "finish_reason": "length"}]})
        def log_message(self, *a):
            pass
    class S(socketserver.ThreadingMixIn, HTTPServer):
        daemon_threads = True
    return S(("127.0.0.1", 0), H)

servers = [server(n, sys.argv[1]) for n in AGENT]
print(*[s.server_address[1] for s in servers], flush=True)
for s in servers[1:]:
    threading.Thread(target=s.serve_forever, daemon=True).start()
servers[0].serve_forever()
PYEOF
echo 0.2 >"$E2E_TMP/slow"
$PY "$E2E_TMP/pd.py" "$E2E_TMP/slow" >"$E2E_TMP/pd.ports" &
E2E_PIDS="$E2E_PIDS $!"
for _ in $(seq 50); do [ -s "$E2E_TMP/pd.ports" ] && break; sleep 0.1; done
read -r PORT_P PORT_D PORT_P1 PORT_P2 PORT_D1 PORT_D2 PORT_PB PORT_DW PORT_DG \
	<"$E2E_TMP/pd.ports"
named_engine_start X "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D" --flow concurrent --health-interval 0
req='{"prompt": "a b c", "max_tokens": 9000}'

# D answers 0.2 s after P's failure: its 400 is relayed
for _ in 1 2 3; do
	PORT=$PORT_X post /v1/completions "$req" >"$E2E_TMP/x.json"
	status_is 400 "D's own answer, though P failed first"
	grep -q "pass the context" "$E2E_TMP/x.json" || fail "D's 400 relayed: $(cat "$E2E_TMP/x.json")"
done

# D says nothing for 5 s: P's failure after the moment given to D
echo 5 >"$E2E_TMP/slow"
t0=$(date +%s%N)
PORT=$PORT_X post /v1/completions "$req" >"$E2E_TMP/x.json"
ms=$((($(date +%s%N) - t0) / 1000000))
status_is 502 "P's failure, D silent"
[ "$ms" -lt 3000 ] || fail "P's failure relayed after $ms ms, want about 1000"
[ "$ms" -ge 900 ] || fail "P's failure relayed after $ms ms: D was not waited for"
named_stop X

req='{"prompt": "a b c", "max_tokens": 3}'
# two prefill instances, one decode: P1 first (round-robin), D blames it,
# the request starts over on P2 and D decodes
named_engine_start Y "$PROXY" --prefill "127.0.0.1:$PORT_P1" \
	--prefill "127.0.0.1:$PORT_P2" --decode "127.0.0.1:$PORT_D1" \
	--flow concurrent --health-interval 0
PORT=$PORT_Y post /v1/completions "$req" >"$E2E_TMP/y.json"
status_is 200 "D's 502 blaming P1, retried on P2"
grep -q decoded "$E2E_TMP/y.json" || fail "D's text: $(cat "$E2E_TMP/y.json")"
[ "$(val "$PORT_Y" 'pdx_proxy_retries_total{leg="prefill"}')" = 1 ] ||
	fail "one retry, counted on the prefill leg: $(curl -sS "http://127.0.0.1:$PORT_Y/metrics" | grep retries)"
named_stop Y

# one prefill instance, two decode: no other P to retry on; D's 502 goes
# to the client as it came, with its reason
named_engine_start Z "$PROXY" --prefill "127.0.0.1:$PORT_P1" \
	--decode "127.0.0.1:$PORT_D1" --decode "127.0.0.1:$PORT_D2" \
	--flow concurrent --health-interval 0
PORT=$PORT_Z post /v1/completions "$req" >"$E2E_TMP/z.json"
status_is 502 "D's 502 blaming the only P"
grep -q "engine gone" "$E2E_TMP/z.json" || fail "D's reason relayed: $(cat "$E2E_TMP/z.json")"
named_stop Z

# one prefill instance, a decode instance of another model (DW) and a
# good one: both of DW's requests' legs refuse to pair, PB's first; each
# request served, by DG
named_engine_start W "$PROXY" --prefill "127.0.0.1:$PORT_PB" \
	--decode "127.0.0.1:$PORT_DW" --decode "127.0.0.1:$PORT_DG" \
	--flow concurrent --health-interval 0 --breaker-failures 0
for k in 1 2 3 4; do
	PORT=$PORT_W post /v1/completions "$req" >"$E2E_TMP/w.json"
	status_is 200 "request $k, the agents refusing to pair, P's 502 first"
	grep -q decoded "$E2E_TMP/w.json" || fail "request $k: $(cat "$E2E_TMP/w.json")"
done
[ "$(val "$PORT_W" 'pdx_proxy_retries_total{leg="decode"}')" -ge 2 ] ||
	fail "retries on the decode leg: $(curl -sS "http://127.0.0.1:$PORT_W/metrics" | grep retries)"
echo ok
