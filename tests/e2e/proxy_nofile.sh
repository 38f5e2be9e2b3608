#!/usr/bin/env bash
# pdx-proxy out of file descriptors: clients hold every descriptor a low
# ulimit -n leaves it, so its health checks cannot open a socket. That
# says nothing of the instance: the checks are not counted (a warning
# says why), and once the clients let go the next request is served.
# They were counted: the instance was judged unhealthy, and requests got
# 503 until enough checks passed again after the flood.
#   proxy_nofile.sh PDX_ENGINE PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
PROXY=$2

named_engine_start D "$ENGINE" --time-scale 0
# --healthy-after 50: an instance judged unhealthy stays so for 5 s
named_engine_start X bash -c 'ulimit -n 48 && exec "$@"' _ "$PROXY" \
	--decode "127.0.0.1:$PORT_D" --health-interval 100 --unhealthy-after 2 \
	--healthy-after 50

# 80 idle client connections for 1.5 s: more than the proxy has
# descriptors, so it runs out (the rest wait in its listen backlog)
$PY - "$PORT_X" <<'PY' || fail "the client flood"
import socket, sys, time
conns = [socket.create_connection(("127.0.0.1", int(sys.argv[1])))
         for _ in range(80)]
time.sleep(1.5)
for c in conns:
    c.close()
PY
sleep 0.3 # the proxy closes them
PORT=$PORT_X post /v1/completions '{"prompt": "after the flood", "max_tokens": 3}' >/dev/null
status_is 200 "a request after the flood"
grep -q "health checks not counted: this proxy is out of file descriptors" "$E2E_TMP/X.log" ||
	fail "the flood did not take the proxy's descriptors: $(tail -5 "$E2E_TMP/X.log")"
! grep -q "unhealthy" "$E2E_TMP/X.log" ||
	fail "judged the instance by its own shortage: $(grep unhealthy "$E2E_TMP/X.log")"
named_stop X
echo ok
