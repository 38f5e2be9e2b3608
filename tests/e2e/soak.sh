#!/usr/bin/env bash
# The short soak (the full one is in docs/reliability.md): scripts/soak
# with the binaries under test, 500 requests at 25/s through the proxy in
# front of 2 prefill + 1 decode instances, a tenth abandoned by their
# client, prefill instance p1 killed (SIGKILL) and started again at 35 %:
# no KV block held and no request left in any engine or the proxy, no
# process died, each exits 0 on SIGTERM (under ASan: no leak), RSS flat
# (release builds), failures only those the restart explains, and the
# restarted instance serves again. About 25 s.
#   soak.sh BUILD_DIR
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
BUILD=$(cd "$1" && pwd)
PY=/usr/bin/python3 # python3 on PATH may be a slow shim
[ -x $PY ] || PY=python3

$PY "$HERE/../../scripts/soak" --build "$BUILD" --num-prompts 500 --rate 25 \
	--restart-at 0.35 --out "$E2E_TMP/soak" --json "$E2E_TMP/soak.json" \
	>"$E2E_TMP/soak.out" 2>&1 ||
	fail "scripts/soak: $(tail -40 "$E2E_TMP/soak.out")"
# What the summary must say beyond its own verdict: the aborts and the
# restart really happened.
$PY - "$E2E_TMP/soak.json" <<'PYEOF' || fail "soak summary: $(cat "$E2E_TMP/soak.json")"
import json, sys
s = json.load(open(sys.argv[1]))
r = s["requests"]
assert s["pass"] and not s["violations"], s["violations"]
assert r["ok"] + r["aborted"] + r["failed"] == 500, r
assert r["aborted"] >= 10, r
assert s["events"]["kill_s"] > 0 and s["events"]["p1_served_after_restart"] >= 5
assert all(c == 0 for c in s["exit_codes"].values()), s["exit_codes"]
PYEOF
echo ok
