#!/bin/bash
# Leases, end to end: the agents keep a prompt's KV for a decode request
# that waits in a full decode engine's queue far longer than the lease
# (its agent's heartbeats renew it, counted in its /metrics), and free KV
# that no decode side holds or asks for soon after the lease, long before
# the engines' own bound.
#   lease.sh PDX_ENGINE PDX_AGENT
. "$(dirname "$0")/lib.sh"
ENGINE=$1
AGENT=$2
LEASE_MS=800

AGENT_OPTS+=(--lease-ms "$LEASE_MS" --heartbeat-ms 200 --peer-timeout-ms 3000
	--xfer-timeout-ms 20000 --metrics 127.0.0.1:0)
# One running decode request at a time, ~5 ms per token (tiny, scaled): a request
# queued behind a 800-token one waits ~4 s, several leases.
pd_engine_start P prefill --kv-timeout-ms 20000
pd_engine_start D decode --kv-timeout-ms 20000 --max-num-seqs 1 --time-scale 5000
named_engine_start C "$ENGINE" --time-scale 0

PEER_P=$(agent_peer "$PORT_P")
PEER_D=$(agent_peer "$PORT_D")
case "$PEER_P $PEER_D" in tcp://*" "tcp://*) ;; *) fail "peer addresses: $PEER_P $PEER_D" ;; esac

T=$E2E_TMP

# The decode engine busy for ~4 s with a request of its own (concurrent
# flow: its KV from P too).
busy="a long answer keeps the decode engine busy"
x=$(xid)
to "$PORT_D" "$(prompt_body "$busy" 800 "$(kv "$x" "$PEER_P" prefill)")" "$T/busy" &
bpid=$!
to "$PORT_P" "$(prompt_body "$busy" 800 "$(kv "$x" "$PEER_D" decode)")" "$T/busyp"
sleep 0.3

# Sequential flow: P prefills and keeps the KV; D queues the request.
prompt="the queued request still finds its prompt's KV"
to "$PORT_C" "$(prompt_body "$prompt" 12)" "$T/c"
t0=$(date +%s%N)
to "$PORT_P" "$(prompt_body "$prompt" 12 "$(kv "$(xid)" "$PEER_D" decode)")" "$T/p"
to "$PORT_D" "$(prompt_body "$prompt" 12 \
	"$(sed -n 's/.*"kv_transfer_params":\({[^}]*}\).*/\1/p' "$T/p" |
		sed 's/}$/, "on_failure": "fail"}/')")" "$T/d"
t1=$(date +%s%N)
wait $bpid
waited=$(((t1 - t0) / 1000000))

# KV nobody asks for: P's blocks are free again after about one lease.
to "$PORT_P" "$(prompt_body "nobody will ask for this" 4 "$(kv "$(xid)" "$PEER_D" decode)")" "$T/orphan"
t2=$(date +%s%N)
freed=
for _ in $(seq 100); do
	[ "$(val "$PORT_P" "$(e kv_blocks_used)")" = 0 ] && { freed=$((($(date +%s%N) - t2) / 1000000)); break; }
	sleep 0.05
done

"$PY" - "$T" "$waited" "$LEASE_MS" "${freed:-none}" <<'PY' || fail "checks above"
import json, sys
T, waited, lease, freed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def rd(f): return open(f"{T}/{f}").read()
def text(f):
    assert rd(f + ".code").strip() == "200", (f, rd(f + ".code"), rd(f))
    return json.loads(rd(f))["choices"][0]["text"]
text("busy")
assert waited > 3 * lease, f"the decode request waited only {waited} ms: nothing to renew"
assert text("d") == text("c"), ("queued request", text("d"), text("c"))
print(f"ok: a decode request queued {waited} ms (lease {lease} ms) got its KV; "
      f"the same text as colocated")
assert rd("orphan.code").strip() == "200", rd("orphan")
assert freed != "none", "P still holds the orphan's blocks after 5 s"
assert int(freed) <= lease + 1500, f"orphan freed after {freed} ms"
print(f"ok: KV nobody asked for was freed {freed} ms after its prefill")
PY
grep -q "lease expired" "$E2E_TMP/agent_p.log" ||
	fail "the prefill agent's log does not say why it freed the orphan"
[ "$(grep -c "lease expired" "$E2E_TMP/agent_p.log")" = 1 ] ||
	fail "more than the orphan's lease expired: $(grep "lease expired" "$E2E_TMP/agent_p.log")"
# P's agent counts the renewals (the queued request waited several
# leases) and the orphan as its one failed transfer
port=$(agent_metrics_port p) || exit 1
settle 5 "$port/pdx_agent_lease_renewals_total>=3" \
	"$port/pdx_agent_transfers_total{outcome=\"failed\",path=\"ipc\"}=1" \
	"$port/pdx_agent_transfers_total{outcome=\"sent\",path=\"ipc\"}=2" ||
	fail "the prefill agent's metrics"

for e in P D C agent_p agent_d; do named_stop $e; done

# Settings under which a queued request loses its KV are said at start:
# a lease no longer than a heartbeat (the renewals' pace), a queue that
# outwaits the KV wait; the ones above are not.
said="is not above --heartbeat-ms\|is not under --kv-timeout-ms"
! grep -q "$said" "$E2E_TMP"/{agent_p,agent_d,P,D}.log ||
	fail "a warning for good settings: $(grep -h "$said" "$E2E_TMP"/*.log)"
AGENT_OPTS+=(--heartbeat-ms 1000 --lease-ms 1000)
pd_engine_start W decode --kv-timeout-ms 10000
grep -q -- "--lease-ms 1000 is not above --heartbeat-ms 1000" "$E2E_TMP/agent_w.log" ||
	fail "lease = heartbeat not said: $(cat "$E2E_TMP/agent_w.log")"
grep -q -- "--queue-timeout-ms 10000 is not under --kv-timeout-ms 10000" "$E2E_TMP/W.log" ||
	fail "queue timeout = KV timeout not said: $(cat "$E2E_TMP/W.log")"
for e in W agent_w; do named_stop $e; done
echo "ok: leases renewed while queued, expired when nobody asks"
