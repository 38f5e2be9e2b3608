#!/usr/bin/env bash
# The short soak (the full one is in docs/reliability.md): scripts/soak
# with the binaries under test, 500 requests at 25/s through the proxy in
# front of 2 prefill + 1 decode instances, a tenth abandoned by their
# client, prefill instance p1 killed (SIGKILL) and started again at 35 %:
# no KV block held and no request left in any engine or the proxy, no
# process died, each exits 0 on SIGTERM (under ASan: no leak), RSS flat
# (release builds), failures only those the restart explains, and the
# restarted instance serves again. At 70 % the prefill agent of p0 alone
# is killed and started again after 1 s, as scripts/launch-xpyd does: no
# request fails after the detection bound (1 s), and no block is held at
# the end. About 25 s.
#   soak.sh BUILD_DIR
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
BUILD=$(cd "$1" && pwd)
PY=/usr/bin/python3 # python3 on PATH may be a slow shim
[ -x $PY ] || PY=python3

$PY "$HERE/../../scripts/soak" --build "$BUILD" --num-prompts 500 --rate 25 \
	--restart-at 0.35 --kill-agent-at 0.7 --assert-agent-kill \
	--out "$E2E_TMP/soak" --json "$E2E_TMP/soak.json" \
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
e = s["events"]
assert e["agent_kill_s"] > 0 and e["agent_back_s"] >= e["agent_kill_s"] + 1, e
assert s["killed"] == {} or "p0.agent" not in s["killed"], s["killed"]
print("agent p0 killed at %.1f s, back at %.1f s: %d failed after the bound, "
      "%d blocks held at the end" % (e["agent_kill_s"], e["agent_back_s"],
      r["failed_after_detect_bound"], e["blocks_held_at_end"]))
assert r["failed_after_detect_bound"] == 0 and e["blocks_held_at_end"] == 0, (r, e)
PYEOF
echo ok
