#!/usr/bin/env bash
# A soak like scripts/soak's, under scripts/launch-xpyd (2 prefill + 2
# decode instances on --base-port ports), with decode instance d0's
# agent killed (SIGKILL) at 30 % of the requests and started again by
# launch-xpyd itself: no request sent later than the detection bound
# (1 s after the kill) failed, launch-xpyd reported the death and the
# restart and the new agent has the killed one's address, d0's engine
# served requests through it, no KV block or request is left in any
# engine or the proxy, and every process exits 0 on SIGTERM
# (launch-xpyd 143), and d0 is back in the proxy's rotation within a
# health interval and a margin (3 s: its engine's 503s while the agent
# was away do not open its circuit breaker). Then the control: the same
# with one decode instance, whose agent's death leaves no decode
# instance until it is back, and every request after the kill counted,
# must be reported as failures (exit 1): the check is not vacuous.
# About 26 s.
#   xpyd_soak.sh BUILD_DIR
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
BUILD=$(cd "$1" && pwd)
SOAK=(/usr/bin/python3 "$HERE/../../scripts/soak" --build "$BUILD" --launch-xpyd
	--num-prompts 300 --rate 25 --kill-agent d0 --kill-agent-at 0.3
	--assert-agent-kill)
[ -x /usr/bin/python3 ] || SOAK[0]=python3

"${SOAK[@]}" --decode 2 --out "$E2E_TMP/soak" --json "$E2E_TMP/soak.json" \
	>"$E2E_TMP/soak.out" 2>&1 ||
	fail "scripts/soak --launch-xpyd: $(tail -40 "$E2E_TMP/soak.out")"
$PY - "$E2E_TMP/soak.json" <<'PYEOF' || fail "soak summary: $(cat "$E2E_TMP/soak.json")"
import json, sys
s = json.load(open(sys.argv[1]))
r, e = s["requests"], s["events"]
assert s["pass"] and not s["violations"], s["violations"]
assert r["ok"] + r["aborted"] + r["failed"] == 300, r
assert e["launch_xpyd_exit"] == 143, e
assert all(c == 0 for c in s["exit_codes"].values()), s["exit_codes"]
assert len(s["exit_codes"]) == 9, s["exit_codes"]
# launch-xpyd's own restart: a new pid, after its 1 s backoff
assert e["agent_back_pid"] != e["agent_killed_pid"], e
assert e["agent_back_s"] >= e["agent_kill_s"] + 0.9, e
# not vacuous: requests went out after the bound, and through the new agent
assert r["sent_after_detect_bound"] >= 50, r
assert e["served_after_agent_back"] >= 5, e
print("d0's agent killed at %.1f s, back by launch-xpyd at %.1f s, d0 "
      "serving again %.1f s later: %d of %d requests sent after the bound "
      "failed, %d before it; %d blocks held at the end" % (
      e["agent_kill_s"], e["agent_back_s"], r["agent_back_to_serving_s"],
      r["failed_after_detect_bound"], r["sent_after_detect_bound"],
      r["failed_near_agent_kill"], e["blocks_held_at_end"]))
assert r["failed_after_detect_bound"] == 0 and e["blocks_held_at_end"] == 0, (r, e)
PYEOF

# The control: one decode instance, nowhere else to go, and every request
# sent after the kill counted (--detect-ms 0: the second or so until the
# agent is back is sure to fail some).
rc=0
"${SOAK[@]}" --decode 1 --detect-ms 0 --num-prompts 100 --out "$E2E_TMP/one" --json "$E2E_TMP/one.json" \
	>"$E2E_TMP/one.out" 2>&1 || rc=$?
[ $rc = 1 ] || fail "control: scripts/soak exited $rc, want 1: $(tail -40 "$E2E_TMP/one.out")"
$PY - "$E2E_TMP/one.json" <<'PYEOF' || fail "control summary: $(cat "$E2E_TMP/one.json")"
import json, sys
s = json.load(open(sys.argv[1]))
r = s["requests"]
assert r["failed_after_detect_bound"] > 0, r
assert any("after the agent's kill failed" in v for v in s["violations"]), s["violations"]
print("control (one decode instance): %d of %d requests sent after the bound "
      "failed, reported" % (r["failed_after_detect_bound"],
                            r["sent_after_detect_bound"]))
PYEOF
echo ok
