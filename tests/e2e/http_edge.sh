#!/usr/bin/env bash
# What a client meets at the HTTP edge of pdx-engine and pdx-proxy (a
# decode-only proxy in front of a colocated engine), the same at both:
#  * GET /version answers {"version": V}, V what --version prints, as
#    vLLM's API server does (clients and dashboards probe it; it was a
#    404).
#   http_edge.sh PDX_ENGINE PDX_PROXY
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ENGINE=$1
PROXY=$2

named_engine_start E "$ENGINE" --time-scale 0
named_engine_start X "$PROXY" --decode "127.0.0.1:$PORT_E"
wait_healthy X

for who in E:"$ENGINE" X:"$PROXY"; do
	name=${who%%:*}
	want=$("${who#*:}" --version) || fail "$name: --version"
	PORT=$(eval echo "\$PORT_$name") get /version >/dev/null
	status_is 200 "$name: GET /version"
	py "import json; v = json.load(open('$E2E_TMP/body')); \
assert v == {'version': '${want#* }'}, v" "$name: /version says '${want#* }'"
done
echo "ok: GET /version at the engine and the proxy says what --version says"

for n in X E; do named_stop $n; done
