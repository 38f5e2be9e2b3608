#!/bin/bash
# A decode request queued behind a busy decode engine (its KV held for it
# at the prefill side) whose prefill agent dies meanwhile learns it at
# once: with on_failure "fail" it ends with a 502 that says why within
# the decode agent's silence bound, not once a running slot frees (or at
# --queue-timeout-ms), so a proxy retries it elsewhere early; with
# "recompute" it is prefilled here when admitted, and answers as a
# colocated engine does. Before, the decode agent failed the held
# transfer but told nobody: the request waited its turn (here ~8 s), and
# only its recv, once admitted, failed.
#   held_fail.sh PDX_ENGINE PDX_AGENT
. "$(dirname "$0")/lib.sh"
ENGINE=$1
AGENT=$2

AGENT_OPTS+=(--heartbeat-ms 200 --peer-timeout-ms 1000 --xfer-timeout-ms 30000
	--metrics 127.0.0.1:0)
pd_engine_start P prefill --kv-timeout-ms 30000
# one running request at a time, ~8 ms per token: the busy one takes ~8 s
pd_engine_start D decode --kv-timeout-ms 30000 --max-num-seqs 1 \
	--time-scale 5000 --queue-timeout-ms 30000
named_engine_start C "$ENGINE" --time-scale 0

PEER_P=$(agent_peer "$PORT_P")
PEER_D=$(agent_peer "$PORT_D")
METRICS_AD=$(agent_metrics_port d)
# decode_params FILE POLICY: P's answer's kv_transfer_params, on_failure
# POLICY added
decode_params() {
	sed -n 's/.*"kv_transfer_params":\({[^}]*}\).*/\1/p' "$1" |
		sed "s/}\$/, \"on_failure\": \"$2\"}/"
}
T=$E2E_TMP

busy="a long answer keeps the decode engine busy"
x=$(xid)
to "$PORT_D" "$(prompt_body "$busy" 1000 "$(kv "$x" "$PEER_P" prefill)")" "$T/busy" &
bpid=$!
to "$PORT_P" "$(prompt_body "$busy" 1000 "$(kv "$x" "$PEER_D" decode)")" "$T/busyp"
settle 10 "$PORT_D/$(e num_requests_running)=1" || fail "D is not busy"

# two requests prefilled at P, queued at D (held), then P's agent dies
to "$PORT_P" "$(prompt_body "the first queued request" 12 "$(kv "$(xid)" "$PEER_D" decode)")" "$T/p1"
to "$PORT_P" "$(prompt_body "the second queued request" 12 "$(kv "$(xid)" "$PEER_D" decode)")" "$T/p2"
to "$PORT_C" "$(prompt_body "the second queued request" 12)" "$T/c2"
t0=$(date +%s%N)
to "$PORT_D" "$(prompt_body "the first queued request" 12 "$(decode_params "$T/p1" fail)")" "$T/d1" &
d1=$!
to "$PORT_D" "$(prompt_body "the second queued request" 12 "$(decode_params "$T/p2" recompute)")" "$T/d2" &
d2=$!
settle 10 "$PORT_D/$(e num_requests_waiting)=2" \
	"$METRICS_AD/pdx_agent_transfers_live{role=\"recv\"}=2" ||
	fail "D does not queue the two, its agent holding their transfers"
kill -KILL "$PID_agent_p"
wait "$PID_agent_p" 2>/dev/null
E2E_PIDS=${E2E_PIDS/ $PID_agent_p/}
wait $d1
t1=$(date +%s%N)
wait $d2 $bpid

"$PY" - "$T" $(((t1 - t0) / 1000000)) <<'PY' || fail "checks above"
import json, sys
T, ms = sys.argv[1], int(sys.argv[2])
def rd(f): return open(f"{T}/{f}").read()
def text(f):
    assert rd(f + ".code").strip() == "200", (f, rd(f + ".code"), rd(f))
    return json.loads(rd(f))["choices"][0]["text"]
text("busy")
code, err = rd("d1.code").strip(), json.loads(rd("d1"))
assert code == "502", ("the failing queued request", code, err)
assert "silent" in err["error"]["message"], err
assert ms < 5000, f"the failing queued request answered after {ms} ms, want ~1.5 s"
print(f"ok: a queued request whose prefill agent died answered {code} after "
      f"{ms} ms: {err['error']['message']}")
assert text("d2") == text("c2"), ("recomputed", text("d2"), text("c2"))
print("ok: the queued request that may recompute was prefilled here: the "
      "colocated text")
PY
grep -q "transfer failed while queued" "$E2E_TMP/D.log" ||
	fail "D's log does not say it prefills the second one itself"

# Again with a new decode instance E, busy with a plain request (its
# agent has never met P's), and P's agent again: a request prefilled at
# P for E, then P's agent dies before E's agent met it. E's agent's hello
# goes unanswered: the held transfer fails at the handshake bound (2 s),
# saying so (before a reviewer's fix it waited to be admitted, ~8 s:
# liveness leaves a peer that never answered our hello to that bound,
# which held transfers lacked). Then E's own agent dies while a request
# that may recompute waits in E's queue: prefilled by E once admitted, the
# colocated text (it got a 503: a queued request has no blocks its
# agent's peer could still write).
named_stop P
AGENT_OPTS+=(--handshake-timeout-ms 2000)
pd_engine_start P2 prefill --kv-timeout-ms 30000
pd_engine_start E decode --kv-timeout-ms 30000 --max-num-seqs 1 \
	--time-scale 5000 --queue-timeout-ms 30000
PEER_P2=$(agent_peer "$PORT_P2")
PEER_E=$(agent_peer "$PORT_E")
to "$PORT_E" "$(prompt_body "$busy" 1000)" "$T/busy2" &
bpid=$!
settle 10 "$PORT_E/$(e num_requests_running)=1" || fail "E is not busy"
# open sends (no remote_agent: the first to claim it), so that P2's
# agent never says hello to E's
to "$PORT_P2" "$(prompt_body "the third queued request" 12 \
	"{\"xfer_id\": \"$(xid)\", \"do_remote_decode\": true}")" "$T/p3"
to "$PORT_P2" "$(prompt_body "the fourth queued request" 12 \
	"{\"xfer_id\": \"$(xid)\", \"do_remote_decode\": true}")" "$T/p4"
to "$PORT_C" "$(prompt_body "the fourth queued request" 12)" "$T/c4"
kill -KILL "$PID_agent_p2"
wait "$PID_agent_p2" 2>/dev/null
E2E_PIDS=${E2E_PIDS/ $PID_agent_p2/}
t0=$(date +%s%N)
to "$PORT_E" "$(prompt_body "the third queued request" 12 "$(decode_params "$T/p3" fail)")" "$T/d3"
t1=$(date +%s%N)
to "$PORT_E" "$(prompt_body "the fourth queued request" 12 "$(decode_params "$T/p4" recompute)")" "$T/d4" &
d4=$!
settle 10 "$PORT_E/$(e num_requests_waiting)=1" || fail "E does not queue the fourth"
kill -KILL "$PID_agent_e"
wait "$PID_agent_e" 2>/dev/null
E2E_PIDS=${E2E_PIDS/ $PID_agent_e/}
wait $d4 $bpid
"$PY" - "$T" $(((t1 - t0) / 1000000)) <<'PY' || fail "checks above"
import json, sys
T, ms = sys.argv[1], int(sys.argv[2])
def rd(f): return open(f"{T}/{f}").read()
code, err = rd("d3.code").strip(), json.loads(rd("d3"))
assert code == "502" and "no answer to our hello" in err["error"]["message"], (code, err)
assert ms < 4000, f"the request held for an agent never met answered after {ms} ms"
print(f"ok: a queued request whose prefill agent died unmet answered {code} "
      f"after {ms} ms: {err['error']['message'][:90]}")
text = lambda f: json.loads(rd(f))["choices"][0]["text"]
assert rd("d4.code").strip() == "200", ("recompute, E's agent gone", rd("d4.code"), rd("d4"))
assert text("d4") == text("c4"), (text("d4"), text("c4"))
print("ok: a queued request that may recompute, its own agent gone: "
      "prefilled here, the colocated text")
PY
