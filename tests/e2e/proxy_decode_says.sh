#!/usr/bin/env bash
# The concurrent flow, P failing on D's account: pdx-engine's 502 with
# X-PDX-Failed-Side: peer, the transfer aborted by D's engine, which
# refused the request (a prompt past its context, say) and answers 400
# itself. The two race; the client must get D's 400, which says why. It
# got P's 502 whenever P's came first (seen in CI: one request in 20 of
# proxy_pd's "over D's context"). A D that says nothing is waited for a
# moment only: the client gets P's failure about a second later. P and D
# here are stand-ins (HTTP servers that answer as those engines do),
# since the real ones race only now and then.
#   proxy_decode_says.sh PDX_PROXY
. "$(dirname "$0")/lib.sh"
PROXY=$1

cat >"$E2E_TMP/pd.py" <<'PYEOF'
import json, socketserver, sys, threading, time
from http.server import BaseHTTPRequestHandler, HTTPServer

def server(role, slow):
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
            self.wfile.write(body)
        def do_GET(self):
            if self.path == "/v1/pdx/info":
                self.reply(200, {"peer_addr": "tcp://127.0.0.1:%d" %
                                 (9 if role == "P" else 10)})
            else:
                self.reply(200, {"status": "ok"})
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if role == "P":
                self.reply(502, {"error": {
                    "message": "KV transfer 00: aborted by tcp://127.0.0.1:10: "
                               "aborted by its engine before it began",
                    "type": "kv_transfer_failed", "param": None, "code": 502}},
                    [("X-PDX-Failed-Side", "peer")])
                return
            with open(slow) as f:
                time.sleep(float(f.read() or 0))
            self.reply(400, {"error": {
                "message": "prompt (9000 tokens) + max_tokens pass the context",
                "type": "invalid_request_error", "param": None, "code": 400}})
        def log_message(self, *a):
            pass
    class S(socketserver.ThreadingMixIn, HTTPServer):
        daemon_threads = True
    return S(("127.0.0.1", 0), H)

p, d = server("P", None), server("D", sys.argv[1])
print(p.server_address[1], d.server_address[1], flush=True)
threading.Thread(target=p.serve_forever, daemon=True).start()
d.serve_forever()
PYEOF
echo 0.2 >"$E2E_TMP/slow"
$PY "$E2E_TMP/pd.py" "$E2E_TMP/slow" >"$E2E_TMP/pd.ports" &
E2E_PIDS="$E2E_PIDS $!"
for _ in $(seq 50); do [ -s "$E2E_TMP/pd.ports" ] && break; sleep 0.1; done
read -r PORT_P PORT_D <"$E2E_TMP/pd.ports"
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
echo ok
