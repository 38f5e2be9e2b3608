#!/usr/bin/env bash
# The early-callback flow when P's callback comes late: P answered
# first, the proxy sent D P's answer, and then the callback arrives (a
# slow network between P and the proxy). It gets 200 {"status":
# "already dispatched"}, so P has nothing to warn of, and the client
# its text. The callback goes through a relay that holds it until the
# proxy has logged that it went on without it; D decodes slowly enough
# (its --time-scale) that the request is still in flight then.
#   proxy_late_callback.sh PDX_ENGINE PDX_AGENT PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
# shellcheck disable=SC2034 # pd_engine_start (lib.sh) reads it
AGENT=$2
PROXY=$3

pd_engine_start P prefill --time-scale 0
# ~0.3 s a token: the tiny model's decode step is a few µs
pd_engine_start D decode --time-scale 100000
named_engine_start C "$ENGINE" --time-scale 0
relay_port=$(free_port)
named_engine_start X "$PROXY" --prefill "127.0.0.1:$PORT_P" \
	--decode "127.0.0.1:$PORT_D" --flow early-callback \
	--metaserver-url "http://127.0.0.1:$relay_port/v1/metaserver"

# the relay: P's callback, held until the proxy went on without it, then
# posted to the proxy; the proxy's answer to P and into late.json
cat >"$E2E_TMP/relay.py" <<'PYEOF'
import http.server, json, os, sys, time, urllib.error, urllib.request

port, proxy, log, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]


class Relay(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        for _ in range(200):
            if "prefill answered before its callback" in open(log).read():
                break
            time.sleep(0.01)
        req = urllib.request.Request(
            f"http://127.0.0.1:{proxy}/v1/metaserver", data=body,
            headers={"Content-Type": "application/json"})
        try:
            r = urllib.request.urlopen(req, timeout=10)
            status, answer = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, answer = e.code, e.read()
        with open(out + ".tmp", "w") as f:
            json.dump({"status": status, "body": answer.decode()}, f)
        # whole, or not at all, for the test reading it
        os.rename(out + ".tmp", out)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Relay).serve_forever()
PYEOF
bg_start relay "$PY" "$E2E_TMP/relay.py" "$relay_port" "$PORT_X" \
	"$E2E_TMP/X.log" "$E2E_TMP/late.json"
for _ in $(seq 50); do
	curl -s -o /dev/null "http://127.0.0.1:$relay_port/" && break
	sleep 0.1
done

prompt="a callback that comes late"
want=$(text "$PORT_C" "$prompt" 10)
got=$(text "$PORT_X" "$prompt" 10)
[ "$got" = "$want" ] || fail "the client's text: '$got', want '$want'"
grep -q "prefill answered before its callback" "$E2E_TMP/X.log" ||
	fail "the proxy did not go on without the callback: $(tail -3 "$E2E_TMP/X.log")"
for _ in $(seq 50); do
	[ -f "$E2E_TMP/late.json" ] && break
	sleep 0.1
done
[ -f "$E2E_TMP/late.json" ] || fail "the late callback was not answered: $(tail -3 "$E2E_TMP/relay.log")"
py "import json; a = json.load(open('$E2E_TMP/late.json')); \
assert a['status'] == 200, a; \
assert json.loads(a['body']) == {'status': 'already dispatched'}, a" \
	"the late callback: $(cat "$E2E_TMP/late.json")"
echo "ok: a callback after the decode leg went: $(cat "$E2E_TMP/late.json")"
# P heard 200: nothing to warn of
! grep -q "metaserver answered\|metaserver: no answer" "$E2E_TMP/P.log" ||
	fail "P warned: $(grep metaserver "$E2E_TMP/P.log")"
blocks_free "$PORT_P" "$PORT_D"

# shellcheck disable=SC2154 # bg_start set it
kill "$PID_relay"
E2E_PIDS=${E2E_PIDS/ $PID_relay/}
for n in X C P D agent_p agent_d; do named_stop $n; done
